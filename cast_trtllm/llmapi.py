"""The LLM API, with TensorRT-LLM's names (`tensorrt_llm.llmapi`): a TensorRT-LLM script runs
with its import changed to

    from cast_trtllm import LLM, SamplingParams
    from cast_trtllm.llmapi import DFlashDecodingConfig, CASTDecodingConfig

This module is the ONE public face of `cast_trtllm` that reaches the runtime, and only
when `LLM` or an output class is first used: the configuration and sampling classes are
engine-free (`cast_trtllm.decoding_config`, `cast_trtllm.sampling_params`).
"""

from __future__ import annotations

from typing import Any

from cast_trtllm.decoding_config import CASTDecodingConfig, DFlashDecodingConfig
from cast_trtllm.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "DFlashDecodingConfig", "CASTDecodingConfig", "RequestOutput",
           "CompletionOutput", "Logprob"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from runtime.llm.llm import LLM

        return LLM
    if name in ("RequestOutput", "CompletionOutput", "Logprob"):
        from runtime.llm import outputs

        return getattr(outputs, name)
    raise AttributeError(f"module 'cast_trtllm.llmapi' has no attribute {name!r}")
