"""`DFlashDecodingConfig` / `CASTDecodingConfig`: TensorRT-LLM's `speculative_config` objects
(`tensorrt_llm.llmapi.DFlashDecodingConfig`, every 1.3 and 1.4 field), for `LLM(...,
speculative_config=...)`. A config holds the fields as given and is checked on construction
by the same parser as the YAML (`cast_trtllm.llm_api_options`): one mapping, one set of
notes (how each field maps, or why it is ignored)."""

from __future__ import annotations

from typing import Any, ClassVar

from cast_trtllm.llm_api_options import LlmApiOptions, parse_llm_api_options


class _DecodingConfig:
    decoding_type: ClassVar[str]

    def __init__(self, **fields: Any) -> None:
        given = fields.pop("decoding_type", self.decoding_type)
        if given != self.decoding_type:
            raise ValueError(f"decoding_type: {type(self).__name__} is {self.decoding_type!r}, got {given!r}")
        self.fields = {"decoding_type": self.decoding_type, **fields}
        self.options: LlmApiOptions = parse_llm_api_options({"speculative_config": self.fields})

    def __getattr__(self, name: str) -> Any:
        fields = self.__dict__.get("fields", {})
        if name in fields:
            return fields[name]
        raise AttributeError(f"{type(self).__name__} has no field {name!r} set")

    def to_dict(self) -> dict[str, Any]:
        """The `speculative_config` block this object stands for (as the YAML would hold it)."""
        return dict(self.fields)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.fields.items())})"


class DFlashDecodingConfig(_DecodingConfig):
    """TensorRT-LLM's DFlash: the top-1 chain of the drafter's block."""

    decoding_type = "DFlash"


class CASTDecodingConfig(_DecodingConfig):
    """DFlash's fields plus CAST's: budget (N | "auto"), rank_cap, width_profile, width_rule,
    draft_gate, gate_probe_every, max_request_width; max_total_draft_tokens is the budget N."""

    decoding_type = "CAST"
