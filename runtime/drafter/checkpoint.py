"""Save, load and randomly initialise DFlash drafters in the z-lab checkpoint format.

A checkpoint directory holds `config.json` (see `DrafterConfig`) and
`model.safetensors` with the keys `fc.weight`, `hidden_norm.weight`, `norm.weight` and
`layers.{i}.{self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, mlp.{gate,up,down}_proj,
input_layernorm, post_attention_layernorm}.weight`. No embedding or lm_head: those are
the target's (a checkpoint that carries copies of them, `embed_tokens.*` / `lm_head.*`,
loads with them skipped, unread). Weights may be sharded (`model.safetensors.index.json`).
A head with a reduced draft vocabulary (`draft_vocab_size` in config.json) also holds
`d2t` (int64, EAGLE-3 offsets; see `runtime.drafter.vocab`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Sequence

import torch

from runtime.drafter.config import WEIGHTS_NAME, DrafterConfig
from runtime.drafter.model import DFlashDrafter
from runtime.drafter.vocab import D2T_KEY, d2t_from_ids, ids_from_d2t
from runtime.model.llama import TargetConfig

INDEX_NAME = "model.safetensors.index.json"
TARGET_OWNED = ("embed_tokens", "lm_head")  # keys naming these are the target's: skipped


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """DFlash's default taps: the middle layer for one drafter layer, else evenly
    spaced over [1, num_target_layers - 3] (dflash 0.1.0 `build_target_layer_ids`)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def random_drafter(
    target: TargetConfig,
    num_layers: int = 1,
    block_size: int = 16,
    target_layer_ids: Sequence[int] | None = None,
    seed: int = 0,
    mask_token_id: int = 0,
    init_std: float = 0.02,
    intermediate_size: int | None = None,
    draft_vocab_ids: torch.Tensor | None = None,
) -> DFlashDrafter:
    """An untrained drafter shaped for `target` (weights ~ N(0, init_std), norms = 1).

    Its proposals are nearly useless (acceptance near zero); it exists to exercise the
    runtime and as a starting point for training. MLP width and RoPE default to the
    target's. `draft_vocab_ids` ([Vd] sorted target ids) gives the head a reduced draft vocabulary.
    """
    if target_layer_ids is None:
        target_layer_ids = default_target_layer_ids(target.num_layers, num_layers)
    cfg = DrafterConfig(
        hidden_size=target.hidden_size,
        num_attention_heads=target.num_heads,
        num_key_value_heads=target.num_kv_heads,
        head_dim=target.head_dim,
        intermediate_size=intermediate_size or target.intermediate_size,
        num_hidden_layers=num_layers,
        vocab_size=target.vocab_size,
        block_size=block_size,
        mask_token_id=mask_token_id,
        target_layer_ids=tuple(target_layer_ids),
        rms_norm_eps=target.rms_norm_eps,
        rope_theta=target.rope_theta,
        rope_scaling=target.rope_scaling,
        num_target_layers=target.num_layers,
        draft_vocab_size=None if draft_vocab_ids is None else int(draft_vocab_ids.numel()),
    )
    cfg.check_fits(target)
    drafter = _initialised(DFlashDrafter(cfg), {}, seed, init_std)
    if draft_vocab_ids is not None:
        drafter.d2t.copy_(d2t_from_ids(draft_vocab_ids.sort().values))
    return drafter


@torch.no_grad()
def _initialised(drafter: DFlashDrafter, keep: dict[str, torch.Tensor], seed: int, init_std: float) -> DFlashDrafter:
    """Parameters in `keep` copied; the rest random N(0, init_std) (CPU generator), norms 1, and,
    when growing a head (`keep` given), new `o_proj` / `mlp.down_proj` zero: the new residual
    branches add nothing until training moves them."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in drafter.named_parameters():
        if name in keep:
            param.copy_(keep[name])
        elif name.endswith("norm.weight"):
            param.fill_(1.0)
        elif keep and name.endswith(("o_proj.weight", "down_proj.weight")):
            param.zero_()
        else:
            param.copy_(torch.randn(param.shape, generator=gen) * init_std)
    return drafter.eval().requires_grad_(False)


def with_draft_vocab(drafter: DFlashDrafter, draft_vocab_ids: torch.Tensor) -> DFlashDrafter:
    """The same head over another draft vocabulary ([Vd] target ids).

    The head scores with the target's frozen lm_head, so none of its weights depend on
    the vocabulary: only `d2t` and `draft_vocab_size` change (a resumed training run can
    widen the vocabulary to data runs added since the head was initialised).
    """
    cfg = dataclasses.replace(drafter.config, draft_vocab_size=int(draft_vocab_ids.numel()),
                              extra=dict(drafter.config.extra))  # replace() validates the new size
    state = {k: v for k, v in drafter.state_dict().items() if k != D2T_KEY}
    state[D2T_KEY] = d2t_from_ids(draft_vocab_ids.long().sort().values)
    with torch.device("meta"):
        widened = DFlashDrafter(cfg)
    widened.load_state_dict(state, assign=True)
    return widened.eval().requires_grad_(False)


def with_layers(drafter: DFlashDrafter, num_layers: int, seed: int = 0, init_std: float = 0.02) -> DFlashDrafter:
    """The same head grown to `num_layers` layers, drafting exactly as before.

    New layers go after the last one: random N(0, init_std) weights, norms 1, and zero
    `o_proj` and `mlp.down_proj`, so each new residual branch adds nothing until training
    moves them (the gradient reaches those two first, then the rest of the layer). A
    continued head gains capacity without losing what it has learned.
    """
    have = drafter.config.num_hidden_layers
    if num_layers <= have:
        raise ValueError(f"with_layers grows a head: it has {have} layers, asked for {num_layers} (pass more)")
    cfg = dataclasses.replace(drafter.config, num_hidden_layers=num_layers, extra=dict(drafter.config.extra))
    grown = _initialised(DFlashDrafter(cfg).to(next(drafter.parameters()).device), drafter.state_dict(), seed, init_std)
    if drafter.d2t is not None:
        grown.d2t.copy_(drafter.d2t)
    return grown


def save_drafter(drafter: DFlashDrafter, directory: str | Path) -> None:
    """Write `config.json` + `model.safetensors` (fp32 or the drafter's dtype)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    drafter.config.save(directory)
    from safetensors.torch import save_file  # imported where used: the GPU check runs without safetensors

    tensors = {k: v.detach().to("cpu").contiguous() for k, v in drafter.state_dict().items()}
    save_file(tensors, str(directory / WEIGHTS_NAME), metadata={"format": "pt"})


def load_drafter(
    directory: str | Path,
    target: TargetConfig,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> DFlashDrafter:
    """Load and validate a checkpoint against the target it will run with."""
    directory = Path(directory)
    if not directory.is_dir():
        raise ValueError(f"drafter checkpoint directory {directory} does not exist")
    cfg = DrafterConfig.load(directory)
    cfg.check_fits(target)
    tensors = _read_weights(directory)
    with torch.device("meta"):
        drafter = DFlashDrafter(cfg)
    expected = {k: tuple(v.shape) for k, v in drafter.state_dict().items()}
    problems = {"missing": sorted(set(expected) - set(tensors)), "unexpected": sorted(set(tensors) - set(expected)),
                "wrong shapes": [f"{k} {tuple(tensors[k].shape)} != {shape}" for k, shape in expected.items()
                                 if k in tensors and tuple(tensors[k].shape) != shape]}
    if any(problems.values()):
        raise ValueError(f"drafter weights in {directory} do not match its config: "
                         + "; ".join(f"{name} {found}" for name, found in problems.items() if found))
    if D2T_KEY in tensors:
        _check_d2t(tensors[D2T_KEY], cfg.vocab_size, directory)
    cast = {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in tensors.items()}
    drafter.load_state_dict(cast, assign=True)
    return drafter.eval().requires_grad_(False)


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint except the target-owned ones (never read)."""
    index = directory / INDEX_NAME
    if (directory / WEIGHTS_NAME).is_file():
        files = [directory / WEIGHTS_NAME]
    elif index.is_file():
        try:
            files = [directory / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"drafter {index} is not a safetensors index: {err}") from err
    else:
        raise ValueError(f"drafter checkpoint {directory} has no {WEIGHTS_NAME} (nor {INDEX_NAME})")
    from safetensors import SafetensorError, safe_open  # imported where used (see save_drafter)

    tensors = {}
    for path in files:
        try:
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    if not any(part in TARGET_OWNED for part in key.split(".")):
                        tensors[key] = f.get_tensor(key)
        except (SafetensorError, OSError, ValueError) as err:
            raise ValueError(f"drafter weights {path} are corrupt or unreadable: {err}") from err
    return tensors


def _check_d2t(d2t: torch.Tensor, vocab_size: int, path: Path) -> None:
    ids = ids_from_d2t(d2t)
    if d2t.dtype != torch.int64 or ids.min() < 0 or ids.max() >= vocab_size or (ids.diff() <= 0).any():
        raise ValueError(
            f"drafter {path}: `{D2T_KEY}` must be int64 offsets naming distinct, increasing target ids "
            f"in [0, {vocab_size})"
        )
