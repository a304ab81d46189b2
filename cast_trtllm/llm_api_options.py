"""`--extra-llm-api-options` YAML: TensorRT-LLM's `speculative_config`, mapped onto the one
`cast_trtllm.spec_config.SpecConfig`.

Every field of TensorRT-LLM's `DFlashDecodingConfig` (and its `DecodingBaseConfig`) is
accepted unchanged; a DFlash block means the DFlash chain:

    speculative_config:
      decoding_type: DFlash          # -> method chain (CAST -> method cast)
      max_draft_len: 15              # -> SpecConfig.max_draft_len (<= the drafter's L)
      max_total_draft_tokens: 15     # CAST: -> budget N; DFlash: ignored (a chain, = max_draft_len)
      speculative_model: PATH        # -> --drafter PATH  (older name: speculative_model_dir)
      mask_token_id: 151669          # checked against the loaded drafter's config
      target_layer_ids: [1, 9, 17]   # checked against the loaded drafter's config
      max_concurrency: 32            # -> SpecConfig.max_concurrency (no drafting above it)
      draft_len_schedule, load_format, acceptance_rate_threshold, acceptance_rate_window_size,
      use_rejection_sampling, allow_advanced_sampling, advanced_sampling_mode, enable_penalty,
      attention_backend, and 1.4's moe_backend, spec_dec_variant, context_recompute_tail,
      skip_ctx_buffer_budget_check   # checked as TensorRT-LLM types them, then ignored (see _IGNORED)

`decoding_type: CAST` adds this project's fields: budget (N | auto), rank_cap,
width_profile, width_rule, draft_gate, gate_probe_every, max_request_width. Every mapping (or why a field
is ignored) is returned as a note for the command to print on stderr. Top-level keys that
mean something here are honoured (`engine`: max_batch_size = requests per round,
max_num_tokens = tokens per round's pass); the other TensorRT-LLM engine options are
reported as ignored, not rejected.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from cast_trtllm.json_fields import is_number
from cast_trtllm.spec_config import SpecConfig, is_int

DECODING_TYPES = {"CAST": "cast", "DFlash": "chain"}  # decoding_type -> method
_MAPPED = ("max_draft_len", "max_concurrency")  # same name in SpecConfig
_CAST_FIELDS = ("budget", "rank_cap", "width_profile", "width_rule", "draft_gate", "gate_probe_every",
                "max_request_width")
_CHECKED = ("mask_token_id", "target_layer_ids")


def _optional(check, what: str):
    return (lambda v: v is None or check(v)), f"{what} or null"


_BOOL = (lambda v: isinstance(v, bool)), "true or false"
_ADVANCED_SAMPLING_MODES = ("full", "no_topk", "no_topp", "no_topk_no_topp")
_MOE_BACKENDS = ("AUTO", "CUTLASS", "CUTEDSL", "CUTEDSL_FC12", "TRTLLM", "DEEPGEMM", "DENSEGEMM", "VANILLA", "TRITON",
                 "MARLIN", "MEGAMOE_DEEPGEMM", "MEGAMOE_CUTEDSL")
_THRESHOLD = _optional(lambda v: is_number(v) and 0 <= v <= 1, "a number in [0, 1]")
_WINDOW = _optional(lambda v: is_int(v) and v >= 0, "an integer >= 0")
# TensorRT-LLM fields with no behaviour here: name -> ((check, what TensorRT-LLM accepts), why ignored)
_IGNORED = {
    "draft_len_schedule": (_optional(lambda v: isinstance(v, Mapping) and all(map(is_int, [*v, *v.values()])),
                                     "a mapping of batch size -> draft length"),
                           "CAST's width rule chooses the tree size every round from the measured verify cost"),
    "load_format": (_optional(lambda v: isinstance(v, str), "a string"),
                    "the drafter is read from its checkpoint directory in one format"),
    "acceptance_rate_threshold": (_THRESHOLD, "the draft gate turns drafting off per request when measured "
                                              "tokens/ms say AR is faster, which covers low acceptance"),
    "acceptance_rate_window_size": (_WINDOW, "goes with acceptance_rate_threshold (the gate keeps its own EWMA)"),
    "use_rejection_sampling": (_BOOL, "sampled requests are always verified by the lossless walk that keeps "
                                      "the target's law; greedy requests take the argmax either way"),
    "allow_advanced_sampling": (_BOOL, "a no-op in TensorRT-LLM too: sampling is chosen per request"),
    "advanced_sampling_mode": ((lambda v: v in _ADVANCED_SAMPLING_MODES, f"one of {list(_ADVANCED_SAMPLING_MODES)}"),
                               "top_k / top_p apply per request; there are no filter kernels to skip"),
    "enable_penalty": (_BOOL, "penalties and min_p always run on the target's verified rows when a request "
                              "asks for them (cast_trtllm/penalties.py)"),
    "attention_backend": ((lambda v: v in ("VANILLA", "TRTLLM", "FA4"), "'VANILLA', 'TRTLLM' or 'FA4'"),
                          "the drafter's context attention runs on this runtime's backend (onnxruntime or torch)"),
    # TensorRT-LLM 1.4
    "moe_backend": (_optional(lambda v: v in _MOE_BACKENDS, f"one of {list(_MOE_BACKENDS)}"),
                    "the targets this runtime loads (Llama, Qwen2, Qwen3) are dense: no MoE kernels to choose"),
    "spec_dec_variant": (_optional(lambda v: is_int(v) and v > 0, "an integer > 0"),
                         "TensorRT-LLM's choice among its DFlash kernel variants; CAST has one verify path"),
    "context_recompute_tail": (_optional(lambda v: is_int(v) and v >= 0, "an integer >= 0"),
                               "no prefix cache here: every prompt token runs through the target, so the "
                               "drafter already sees the whole context"),
    "skip_ctx_buffer_budget_check": (_BOOL, "no fixed context buffer here: the drafter's feature cache is "
                                            "sized per request"),
}
_TOTAL = "max_total_draft_tokens"  # tree size: CAST's budget N; DFlash's chain has max_draft_len tokens
_MODEL = ("speculative_model", "speculative_model_dir")
ENGINE_KEYS = {"max_batch_size": "requests decoded together per round (the scheduler's batch)",
               "max_num_tokens": "tokens per round's target pass (decode packs, then prompt chunks)"}
_KNOWN = {"decoding_type", *_MAPPED, *_CAST_FIELDS, *_CHECKED, *_IGNORED, _TOTAL, *_MODEL}


@dataclass(frozen=True, slots=True)
class LlmApiOptions:
    spec: SpecConfig | None  # None: no speculative_config block
    speculative_model: str | None = None  # drafter checkpoint directory, if named
    expect_drafter: dict[str, Any] | None = None  # mask_token_id / target_layer_ids the drafter must have
    notes: tuple[str, ...] = ()  # one line per field: how it maps, or why it is ignored
    ignored_keys: tuple[str, ...] = ()  # top-level TensorRT-LLM options not used here
    engine: dict[str, int] | None = None  # honoured top-level keys (ENGINE_KEYS) -> value


def parse_llm_api_options(options: Any, base: SpecConfig = SpecConfig()) -> LlmApiOptions:
    """Validate a parsed YAML document (a mapping; None/empty means no options)."""
    if options is None:
        return LlmApiOptions(None)
    if not isinstance(options, Mapping):
        raise ValueError(f"extra LLM-API options must be a YAML mapping at top level, got {type(options).__name__}")
    engine = {k: options[k] for k in ENGINE_KEYS if k in options}
    for key, value in engine.items():
        if not is_int(value) or value < 1:
            raise ValueError(f"{key}: must be an integer >= 1, got {value!r}")
    ignored = tuple(sorted(str(k) for k in options if k != "speculative_config" and k not in ENGINE_KEYS))
    top = [f"{k} {v} -> {ENGINE_KEYS[k]}" for k, v in engine.items()]
    top += [f"{k}: ignored (a TensorRT-LLM engine option this runtime does not use)" for k in ignored]
    block = options.get("speculative_config")
    if block is None:
        return LlmApiOptions(None, notes=tuple(top), ignored_keys=ignored, engine=engine or None)
    if not isinstance(block, Mapping):
        raise ValueError(f"speculative_config: must be a mapping, got {type(block).__name__}")
    unknown = sorted(set(block) - _KNOWN)
    if unknown:
        raise ValueError(f"speculative_config.{unknown[0]}: not a field of TensorRT-LLM's DFlash config "
                         f"nor of CAST's; remove it or use one of {sorted(_KNOWN)}")
    if "decoding_type" not in block:
        raise ValueError("speculative_config.decoding_type: required field is missing")
    kind = block["decoding_type"]
    if kind not in DECODING_TYPES:
        raise ValueError(f"speculative_config.decoding_type: must be one of {sorted(DECODING_TYPES)}, got {kind!r}")
    present = [f for f in _CAST_FIELDS if f in block]
    if kind != "CAST" and present:
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
    notes += [f"{name} {value!r}: checked against the drafter's config.json" for name, value in expect.items()]
    for name, ((check, what), why) in _IGNORED.items():
        if name in block:
            if not check(block[name]):
                raise ValueError(f"speculative_config.{name}: must be {what}, got {block[name]!r}")
            notes.append(f"{name}: ignored ({why})")
    # max_total_draft_tokens, the tree's draft tokens: CAST's budget N; a DFlash chain drafts
    # max_draft_len tokens (TensorRT-LLM overwrites it so too)
    total = block.get(_TOTAL)
    if total is not None:
        if not is_int(total) or total < 1:
            raise ValueError(f"speculative_config.{_TOTAL}: must be an integer >= 1, got {total!r}")
        if kind != "CAST":
            notes.append(f"{_TOTAL}: ignored (a {kind} chain drafts max_draft_len tokens; TensorRT-LLM sets it so too)")
        elif "budget" in block and block["budget"] != total:
            raise ValueError(f"speculative_config.{_TOTAL}: {total} disagrees with budget {block['budget']!r}; "
                             "give one of them")
        else:
            changes["budget"] = total
            notes.append(f"{_TOTAL} {total} -> budget")
    try:
        spec = base.with_overrides(**changes)
    except ValueError as err:
        field = next((f for f in changes if f in str(err)), "decoding_type")
        raise ValueError(f"speculative_config.{field}: {err}") from None
    return LlmApiOptions(spec, model, expect or None, tuple(notes + top), ignored, engine or None)


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
