"""DFlash drafter configuration in the z-lab checkpoint format (`config.json`).

DFlash-specific fields live under `dflash_config` (`mask_token_id`,
`target_layer_ids`); `block_size` sits at the top level (L+1: the pending root plus
L mask slots). The rest are standard Qwen3 fields (`rope_theta`, `rope_scaling` or
`rope_parameters`, `layer_types`, `max_window_layers`, …) as z-lab publishes them.
Unknown fields are kept and written back on save. What the runtime's drafter does not
compute (sliding-window or causal layers, attention biases, logit multipliers or
softcaps, DFlash2 heads, RoPE other than default/linear/llama3) is refused here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from runtime.model.layers import COMPUTED_ROPE_TYPES, RopeScaling, Rotary, rope_inv_freq, rope_scaling_of
from runtime.model.llama import TargetConfig

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"

_REQUIRED = ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "num_hidden_layers",
             "vocab_size")


@dataclass(frozen=True, slots=True)
class DrafterConfig:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_hidden_layers: int
    vocab_size: int
    block_size: int  # L + 1
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: RopeScaling = ()  # canonical form, see runtime.model.layers.rope_scaling_of
    num_target_layers: int | None = None
    draft_vocab_size: int | None = None  # reduced draft vocabulary (EAGLE-3 `d2t` map); None = full
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.block_size < 2:
            raise ValueError(f"drafter block_size must be >= 2 (root + at least one mask), got {self.block_size}")
        if not self.target_layer_ids:
            raise ValueError("drafter dflash_config.target_layer_ids must list at least one target layer")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("drafter num_attention_heads must be a multiple of num_key_value_heads")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"drafter mask_token_id {self.mask_token_id} is outside its vocab of {self.vocab_size}")
        if self.draft_vocab_size is not None and not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(
                f"drafter draft_vocab_size {self.draft_vocab_size} must be in [1, vocab_size={self.vocab_size}]"
            )

    @property
    def mass_exponent(self) -> float:
        """Calibration of the plug-in node masses fitted for this head (acceptance ~=
        rho ** exponent; `cast_calibration` in config.json, written by train-drafter); 1 = none."""
        return float((self.extra.get("cast_calibration") or {}).get("mass_exponent", 1.0))

    @property
    def num_draft_positions(self) -> int:
        """L: future positions scored per draft call."""
        return self.block_size - 1

    def check_fits(self, target: TargetConfig) -> None:
        """Raise ValueError naming every way this drafter does not fit `target`."""
        problems = []
        if self.vocab_size != target.vocab_size:
            problems.append(f"vocab_size {self.vocab_size} != target vocab_size {target.vocab_size}")
        if self.hidden_size != target.hidden_size:
            problems.append(f"hidden_size {self.hidden_size} != target hidden_size {target.hidden_size}")
        bad = [i for i in self.target_layer_ids if not 0 <= i < target.num_layers]
        if bad:
            problems.append(f"target_layer_ids {bad} are outside the target's {target.num_layers} layers")
        if self.num_target_layers is not None and self.num_target_layers != target.num_layers:
            problems.append(f"num_target_layers {self.num_target_layers} != target's {target.num_layers} layers")
        # DFlash heads are trained with the target's own RoPE; a different one is a config slip
        if self.rope_theta != target.rope_theta:
            problems.append(f"rope_theta {self.rope_theta:g} != target rope_theta {target.rope_theta:g}")
        if self.rope_scaling != target.rope_scaling:
            problems.append(f"rope_scaling {dict(self.rope_scaling) or None} != target rope_scaling "
                            f"{dict(target.rope_scaling) or None}")
        if problems:
            raise ValueError("drafter does not fit the target: " + "; ".join(problems))

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> "DrafterConfig":
        missing = [k for k in _REQUIRED if k not in raw]
        dflash = raw.get("dflash_config") or {}
        for key in ("mask_token_id", "target_layer_ids"):
            if key not in dflash and key not in raw:
                missing.append(f"dflash_config.{key}")
        if missing:
            raise ValueError(f"drafter config.json lacks required fields: {', '.join(missing)}")
        _check_computable(raw, dflash)
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        heads = int(raw["num_attention_heads"])
        known = {f.name for f in fields(DrafterConfig)} | {"dflash_config", "rope_parameters"}
        return DrafterConfig(
            hidden_size=int(raw["hidden_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw["num_key_value_heads"]),
            head_dim=int(raw.get("head_dim") or raw["hidden_size"] // heads),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            vocab_size=int(raw["vocab_size"]),
            block_size=int(dflash.get("block_size", raw.get("block_size", 16))),
            mask_token_id=int(dflash.get("mask_token_id", raw.get("mask_token_id"))),
            target_layer_ids=tuple(int(i) for i in dflash.get("target_layer_ids", raw.get("target_layer_ids"))),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(raw.get("rope_theta") or rope.get("rope_theta") or 1_000_000.0),
            rope_scaling=rope_scaling_of(rope),
            num_target_layers=raw.get("num_target_layers"),
            draft_vocab_size=raw.get("draft_vocab_size"),
            extra={k: v for k, v in raw.items() if k not in known},
        )

    def to_dict(self) -> dict[str, Any]:
        raw = {k: v for k, v in asdict(self).items() if k not in ("extra", "mask_token_id", "target_layer_ids")
               and not (v is None and k in ("num_target_layers", "draft_vocab_size"))}
        raw["rope_scaling"] = dict(self.rope_scaling) or None
        defaults = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_act": "silu",
                    "attention_bias": False, "tie_word_embeddings": False}
        return {
            **defaults,
            **self.extra,
            **raw,
            "dflash_config": {"mask_token_id": self.mask_token_id, "target_layer_ids": list(self.target_layer_ids)},
        }

    def rotary(self) -> Rotary:
        """The head's RoPE (its own theta and scaling; equal to the target's by `check_fits`)."""
        return Rotary(rope_inv_freq(self.head_dim, self.rope_theta, self.rope_scaling))

    @staticmethod
    def load(directory: Path) -> "DrafterConfig":
        path = Path(directory) / CONFIG_NAME
        if not path.is_file():
            raise ValueError(f"drafter checkpoint {directory} has no {CONFIG_NAME}")
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"drafter {path} is not valid JSON: {err}") from err
        if not isinstance(raw, dict):
            raise ValueError(f"drafter {path} must hold a JSON object")
        try:
            return DrafterConfig.from_dict(raw)
        except (TypeError, KeyError) as err:
            raise ValueError(f"drafter {path} has a malformed field: {err}") from err

    def save(self, directory: Path) -> None:
        (Path(directory) / CONFIG_NAME).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


def _check_computable(raw: dict[str, Any], dflash: dict[str, Any]) -> None:
    """ValueError naming every field of a (z-lab format) config the drafter does not compute."""
    n = int(raw["num_hidden_layers"])
    types = raw.get("layer_types")
    if types is None:  # Qwen3Config's rule when layer_types is absent
        window = raw.get("sliding_window") if raw.get("use_sliding_window") else None
        first = raw.get("max_window_layers", n)
        types = ["sliding_attention" if window is not None and i >= first else "full_attention" for i in range(n)]
    not_full = [i for i, t in enumerate(types) if t != "full_attention"]
    rope_type = dict(rope_scaling_of(raw.get("rope_parameters") or raw.get("rope_scaling"))).get("rope_type", "default")
    arch = raw.get("architectures") or ["DFlashDraftModel"]
    neutral = {"input_embedding_scale": 1.0, "output_multiplier": 1.0, "final_logit_softcapping": 0.0}
    knobs = {k: dflash.get(k, raw.get(k)) for k in neutral}
    problems = [
        f"architectures {arch} (only DFlashDraftModel)" if arch != ["DFlashDraftModel"] else "",
        "attention_bias (DFlash heads have none)" if raw.get("attention_bias") else "",
        f"non-full-attention layers {not_full}" if not_full else "",
        "is_causal (DFlash blocks attend without a mask)" if raw.get("is_causal") else "",
        f"RoPE type {rope_type!r} (supported: {', '.join(COMPUTED_ROPE_TYPES)})"
        if rope_type not in COMPUTED_ROPE_TYPES else "",
        *(f"{k} {v}" for k, v in knobs.items() if v is not None and float(v) != neutral[k]),
    ]
    if any(problems):
        raise ValueError("drafter config.json asks for what the runtime's DFlash drafter does not compute: "
                         + "; ".join(p for p in problems if p))
