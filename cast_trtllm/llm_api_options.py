"""`--extra-llm-api-options` YAML: TensorRT-LLM's `speculative_config`, mapped onto the one
`cast_trtllm.spec_config.SpecConfig`.

TensorRT-LLM's own DFlash block is accepted unchanged and means the DFlash chain:

    speculative_config:
      decoding_type: DFlash          # -> method chain (CAST -> method cast)
      max_draft_len: 15              # -> SpecConfig.max_draft_len (<= the drafter's L)
      speculative_model: PATH        # -> --drafter PATH  (older name: speculative_model_dir)
      mask_token_id: 151669          # checked against the drafter's config.json
      target_layer_ids: [1, 9, 17]   # checked against the drafter's config.json
      acceptance_rate_threshold: 0.1 # ignored: the draft gate decides per request from tokens/ms
      acceptance_rate_window_size: 8 # ignored, with the threshold
      draft_len_schedule: {...}      # ignored: CAST's width rule picks N every round
      max_concurrency: 32            # -> SpecConfig.max_concurrency (no drafting above it)

`decoding_type: CAST` adds this project's fields: budget (N | auto), rank_cap,
width_profile, width_rule, draft_gate, gate_probe_every, max_request_width. Every mapping (or why a field
is ignored) is returned as a note for the command to print on stderr. Other top-level
keys are TensorRT-LLM engine options this runtime does not use: reported, not rejected.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from cast_trtllm.spec_config import SpecConfig

DECODING_TYPES = {"CAST": "cast", "DFlash": "chain"}  # decoding_type -> method
_MAPPED = {"max_draft_len": "max_draft_len", "max_concurrency": "max_concurrency"}
_CAST_FIELDS = ("budget", "rank_cap", "width_profile", "width_rule", "draft_gate", "gate_probe_every",
                "max_request_width")
_CHECKED = ("mask_token_id", "target_layer_ids")
_IGNORED = {
    "acceptance_rate_threshold": "the draft gate turns drafting off per request when measured tokens/ms "
                                 "say AR is faster, which covers low acceptance",
    "acceptance_rate_window_size": "goes with acceptance_rate_threshold (the gate keeps its own EWMA)",
    "draft_len_schedule": "CAST's width rule chooses the tree size every round from the measured verify cost",
}
_MODEL = ("speculative_model", "speculative_model_dir")
_KNOWN = {"decoding_type", *_MAPPED, *_CAST_FIELDS, *_CHECKED, *_IGNORED, *_MODEL}


@dataclass(frozen=True, slots=True)
class LlmApiOptions:
    spec: SpecConfig | None  # None: no speculative_config block
    speculative_model: str | None = None  # drafter checkpoint directory, if named
    expect_drafter: dict[str, Any] | None = None  # mask_token_id / target_layer_ids the drafter must have
    notes: tuple[str, ...] = ()  # one line per field: how it maps, or why it is ignored
    ignored_keys: tuple[str, ...] = ()  # top-level TensorRT-LLM options not used here


def parse_speculative_config(block: Any, base: SpecConfig = SpecConfig()) -> LlmApiOptions:
    if not isinstance(block, Mapping):
        raise ValueError(f"speculative_config: must be a mapping, got {type(block).__name__}")
    unknown = sorted(set(block) - _KNOWN)
    if unknown:
        raise ValueError(f"speculative_config.{unknown[0]}: unknown field; known fields are {sorted(_KNOWN)}")
    if "decoding_type" not in block:
        raise ValueError("speculative_config.decoding_type: required field is missing")
    kind = block["decoding_type"]
    if kind not in DECODING_TYPES:
        raise ValueError(f"speculative_config.decoding_type: must be one of {sorted(DECODING_TYPES)}, got {kind!r}")
    if kind != "CAST":
        present = [f for f in _CAST_FIELDS if f in block]
        if present:
            raise ValueError(f"speculative_config.{present[0]}: only valid with decoding_type CAST, got {kind!r}")
    if all(m in block for m in _MODEL):
        raise ValueError("speculative_config.speculative_model_dir: give speculative_model or "
                         "speculative_model_dir, not both")
    notes = [f"decoding_type {kind} -> method {DECODING_TYPES[kind]}"]
    changes: dict[str, Any] = {"method": DECODING_TYPES[kind]}
    for name in (*_MAPPED, *_CAST_FIELDS):
        if name in block:
            changes[name] = block[name]
            notes.append(f"{name} {block[name]!r} -> {name}")
    model = next((block[m] for m in _MODEL if m in block), None)
    if model is not None:
        if not isinstance(model, str) or not model:
            raise ValueError(f"speculative_config.speculative_model: must be a non-empty path string, got {model!r}")
        notes.append(f"speculative_model {model} -> --drafter {model}")
    expect = {k: block[k] for k in _CHECKED if k in block}
    for name in expect:
        notes.append(f"{name} {expect[name]!r}: checked against the drafter's config.json")
    for name, why in _IGNORED.items():
        if name in block:
            notes.append(f"{name}: ignored ({why})")
    try:
        spec = base.with_overrides(**changes)
    except ValueError as err:
        field = next((f for f in changes if f in str(err)), "decoding_type")
        raise ValueError(f"speculative_config.{field}: {err}") from None
    return LlmApiOptions(spec, model, expect or None, tuple(notes))


def parse_llm_api_options(options: Any, base: SpecConfig = SpecConfig()) -> LlmApiOptions:
    """Validate a parsed YAML document (a mapping; None/empty means no options)."""
    if options is None:
        return LlmApiOptions(None)
    if not isinstance(options, Mapping):
        raise ValueError(f"extra LLM-API options must be a YAML mapping at top level, got {type(options).__name__}")
    ignored = tuple(sorted(str(k) for k in options if k != "speculative_config"))
    block = options.get("speculative_config")
    if block is None:
        return LlmApiOptions(None, ignored_keys=ignored)
    parsed = parse_speculative_config(block, base)
    notes = (*parsed.notes, *(f"{k}: ignored (a TensorRT-LLM engine option this runtime does not use)" for k in ignored))
    return LlmApiOptions(parsed.spec, parsed.speculative_model, parsed.expect_drafter, notes, ignored)


def load_llm_api_options(path: str | Path, base: SpecConfig = SpecConfig()) -> LlmApiOptions:
    """Read and validate an `--extra-llm-api-options` YAML file."""
    import yaml

    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML ({err})") from None
    except OSError as err:
        raise ValueError(f"{path}: cannot be read ({err.strerror})") from None
    try:
        return parse_llm_api_options(document, base)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
