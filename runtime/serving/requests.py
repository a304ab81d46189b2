"""Request tensors → a validated `runtime.engine.Request`, with errors a client can act on.

Input names and types follow TensorRT-LLM's Triton backend (`text_input`, `max_tokens`,
`temperature`, `top_k`, `top_p`, `seed`, `stop_words`) plus CAST's `method` / `budget`.
Every problem raises `ValueError` naming the input; the model turns it into an error
response for that request only.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from cast_trtllm.sampling import SamplingParams
from cast_trtllm.spec_config import METHODS, check_budget
from runtime.engine import Request
from runtime.serving.config import ServingConfig

# name -> (Triton datatype, numpy kinds accepted, required)
INPUTS: dict[str, tuple[str, str, bool]] = {
    "text_input": ("BYTES", "OSU", True),
    "max_tokens": ("INT32", "i", False),
    "temperature": ("FP32", "f", False),
    "top_k": ("INT32", "i", False),
    "top_p": ("FP32", "f", False),
    "seed": ("UINT64", "u", False),
    "stop_words": ("BYTES", "OSU", False),
    "method": ("BYTES", "OSU", False),
    "budget": ("BYTES", "OSU", False),
}
OUTPUTS: dict[str, str] = {
    "text_output": "BYTES",
    "output_ids": "INT32",
    "accept_lengths": "INT32",  # committed tokens of each verify round (R = A + 1)
    "finish_reason": "BYTES",  # "eos" | "stop" | "length"
}


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"text is not valid UTF-8: {err}") from err
    return str(value)


def _scalar(inputs: dict[str, np.ndarray], name: str) -> Any:
    arr = inputs[name]
    if arr.size != 1:
        raise ValueError(f"input '{name}' must hold exactly one value, got shape {list(arr.shape)}")
    return arr.reshape(-1)[0]


def parse_request(
    request_id: str,
    inputs: dict[str, np.ndarray],
    cfg: ServingConfig,
    encode: Callable[[str], list[int]],
    context_window: int,
) -> Request:
    """Validate the request's tensors and tokenize its prompt."""
    unknown = sorted(set(inputs) - set(INPUTS))
    if unknown:
        raise ValueError(f"unknown input(s) {unknown}; accepted inputs are {sorted(INPUTS)}")
    for name, (dtype, kinds, required) in INPUTS.items():
        if name not in inputs:
            if required:
                raise ValueError(f"missing required input '{name}' ({dtype})")
            continue
        if inputs[name].dtype.kind not in kinds:
            raise ValueError(f"input '{name}' must be {dtype}, got numpy dtype {inputs[name].dtype}")
    prompt = _text(_scalar(inputs, "text_input"))
    if not prompt.strip():
        raise ValueError("input 'text_input' is empty: send a non-empty prompt")
    max_tokens = int(_scalar(inputs, "max_tokens")) if "max_tokens" in inputs else cfg.default_max_tokens
    if not 1 <= max_tokens <= cfg.max_tokens_limit:
        raise ValueError(f"max_tokens={max_tokens} is out of range: must be in [1, {cfg.max_tokens_limit}]")
    temperature = float(_scalar(inputs, "temperature")) if "temperature" in inputs else 0.0
    top_p = float(_scalar(inputs, "top_p")) if "top_p" in inputs else 1.0
    if not math.isfinite(temperature) or not math.isfinite(top_p):
        raise ValueError(f"temperature ({temperature}) and top_p ({top_p}) must be finite numbers")
    seed = int(_scalar(inputs, "seed")) if "seed" in inputs else None
    try:
        sampling = SamplingParams(
            temperature=temperature,
            top_k=int(_scalar(inputs, "top_k")) if "top_k" in inputs else 0,
            top_p=top_p,
            seed=None if seed is None else seed % (1 << 63),
        )
    except ValueError as err:
        raise ValueError(f"bad sampling parameters: {err}") from err
    stops = tuple(_text(s) for s in inputs["stop_words"].reshape(-1)) if "stop_words" in inputs else ()
    if any(not s for s in stops):
        raise ValueError("input 'stop_words' holds an empty string; every stop word must be non-empty")
    method = _text(_scalar(inputs, "method")).strip().lower() if "method" in inputs else None
    if method is not None and method not in METHODS:
        raise ValueError(f"method={method!r} is not one of {METHODS}")
    budget = None
    if "budget" in inputs:
        try:
            budget = check_budget(_text(_scalar(inputs, "budget")).strip().lower(), "input 'budget'")
        except ValueError as err:
            raise ValueError(str(err)) from None
    ids = encode(prompt)
    if len(ids) + max_tokens > context_window:
        raise ValueError(
            f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds the context window of "
            f"{context_window} tokens; shorten the prompt or lower max_tokens"
        )
    return Request(tuple(ids), max_tokens, sampling, stops, method, budget, request_id=request_id)
