"""`--extra-llm-api-options` YAML: TensorRT-LLM's `speculative_config` block, CAST flavour.

Shape (as in TensorRT-LLM's LLM-API YAML; other top-level keys are TensorRT-LLM engine
options this project does not use; they are returned in `ignored_keys`, not rejected):

    speculative_config:
      decoding_type: CAST        # CAST (tree) or DFlash (standard top-1 chain)
      max_draft_len: 15          # drafted positions L per round (tree depth / chain length)
      speculative_model: PATH    # DFlash drafter checkpoint dir; omitted = embedded default
      budget: auto               # CAST only: nonroot budget N (int >= 0) or auto (width profile)
      width_profile: PATH        # CAST only: width profile JSON for budget auto

`speculative_model_dir` is accepted as TensorRT-LLM's older name for `speculative_model`.
Parsing is pure (a mapping in, a frozen config out); `load_llm_api_options` reads the file.
Every error names the offending field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

DECODING_TYPES = {"CAST": "cast", "DFlash": "chain"}  # decoding_type -> decoder method
_SPEC_FIELDS = {"decoding_type", "max_draft_len", "speculative_model", "speculative_model_dir",
                "budget", "width_profile"}
_CAST_ONLY = ("budget", "width_profile")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    decoding_type: str                  # a key of DECODING_TYPES
    max_draft_len: int                  # block positions L drafted per round
    speculative_model: str | None = None  # drafter checkpoint dir; None = embedded default
    budget: int | str = "auto"          # CAST nonroot budget N, or "auto"
    width_profile: str | None = None    # profile JSON for budget "auto"; None = runtime default

    def __post_init__(self) -> None:
        if self.decoding_type not in DECODING_TYPES:
            raise ValueError(f"speculative_config.decoding_type: must be one of {sorted(DECODING_TYPES)}, "
                             f"got {self.decoding_type!r}")
        if not _is_int(self.max_draft_len) or self.max_draft_len < 1:
            raise ValueError(f"speculative_config.max_draft_len: must be a positive integer, got {self.max_draft_len!r}")
        if self.budget != "auto" and (not _is_int(self.budget) or self.budget < 0):
            raise ValueError(f"speculative_config.budget: must be 'auto' or an integer >= 0, got {self.budget!r}")
        for name in ("speculative_model", "width_profile"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"speculative_config.{name}: must be a non-empty path string, got {value!r}")

    @property
    def method(self) -> str:
        """Decoder method: 'cast' (tree) or 'chain' (standard DFlash)."""
        return DECODING_TYPES[self.decoding_type]


@dataclass(frozen=True, slots=True)
class LlmApiOptions:
    speculative_config: SpeculativeConfig | None
    ignored_keys: tuple[str, ...] = ()  # top-level TensorRT-LLM options not used here


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_speculative_config(block: Any) -> SpeculativeConfig:
    if not isinstance(block, Mapping):
        raise ValueError(f"speculative_config: must be a mapping, got {type(block).__name__}")
    unknown = sorted(set(block) - _SPEC_FIELDS)
    if unknown:
        raise ValueError(f"speculative_config.{unknown[0]}: unknown field; known fields are {sorted(_SPEC_FIELDS)}")
    for required in ("decoding_type", "max_draft_len"):
        if required not in block:
            raise ValueError(f"speculative_config.{required}: required field is missing")
    if "speculative_model" in block and "speculative_model_dir" in block:
        raise ValueError("speculative_config.speculative_model_dir: give speculative_model or "
                         "speculative_model_dir, not both")
    decoding_type = block["decoding_type"]
    if decoding_type != "CAST":
        present = [f for f in _CAST_ONLY if f in block]
        if present:
            raise ValueError(f"speculative_config.{present[0]}: only valid with decoding_type CAST, "
                             f"got decoding_type {decoding_type!r}")
    return SpeculativeConfig(
        decoding_type=decoding_type,
        max_draft_len=block["max_draft_len"],
        speculative_model=block.get("speculative_model", block.get("speculative_model_dir")),
        budget=block.get("budget", "auto"),
        width_profile=block.get("width_profile"),
    )


def parse_llm_api_options(options: Any) -> LlmApiOptions:
    """Validate a parsed YAML document (a mapping; None/empty means no options)."""
    if options is None:
        return LlmApiOptions(None)
    if not isinstance(options, Mapping):
        raise ValueError(f"extra LLM-API options must be a YAML mapping at top level, got {type(options).__name__}")
    spec = options.get("speculative_config")
    ignored = tuple(sorted(str(k) for k in options if k != "speculative_config"))
    return LlmApiOptions(None if spec is None else parse_speculative_config(spec), ignored)


def load_llm_api_options(path: str | Path) -> LlmApiOptions:
    """Read and validate an `--extra-llm-api-options` YAML file."""
    import yaml

    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: not valid YAML ({err})") from None
    try:
        return parse_llm_api_options(document)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
