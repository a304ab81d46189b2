"""Request tensors of TensorRT-LLM's Triton `ensemble` → a validated `runtime.engine.Request`.

Every input of TensorRT-LLM's `triton_backend/all_models/inflight_batcher_llm/ensemble`
is declared with its exact name, type and dims, plus CAST's `method` / `budget`. Each
one is honoured with TensorRT-LLM's semantics (docs/serving.md: e.g. `end_id` replaces
the model's end ids, `top_p` 0 is off; `end_id`, `min_tokens` and `bad_words` run in the
engine, on the target's logits), accepted only at its neutral value (e.g. `beam_width`
1), or refused: never silently ignored. Every problem raises `ValueError` naming the
input; the model turns it into an error response for that request only.
Both APIs (the OpenAI server's too) build their engine requests through the one
`SamplingParams` (`runtime.llm.requests.engine_request`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from cast_trtllm.sampling_params import SamplingParams
from cast_trtllm.spec_config import check_budget
from runtime.engine import Request
from runtime.llm.requests import engine_request, tokenize
from runtime.serving.config import ServingConfig

# Triton datatype -> numpy dtype kinds accepted for it
KINDS = {"STRING": "OSU", "INT32": "i", "UINT64": "u", "INT64": "i", "FP32": "f", "FP16": "f", "BOOL": "b"}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    dtype: str  # Triton datatype without TYPE_ ("STRING", "INT32", ...)
    dims: tuple[int, ...] = (1,)  # without the batch dimension
    optional: bool = True
    ragged: bool = False  # allow_ragged_batch


_S, _I, _F, _B = "STRING", "INT32", "FP32", "BOOL"
# upstream order; `max_tokens` is required upstream, optional here (default_max_tokens)
INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_input", _S, optional=False), TensorSpec("decoder_text_input", _S),
    TensorSpec("max_tokens", _I), TensorSpec("num_return_sequences", _I),
    TensorSpec("bad_words", _S, (-1,)), TensorSpec("stop_words", _S, (-1,)),
    TensorSpec("exclude_input_in_output", _B), TensorSpec("end_id", _I), TensorSpec("pad_id", _I),
    TensorSpec("top_k", _I), TensorSpec("top_p", _F), TensorSpec("temperature", _F),
    TensorSpec("length_penalty", _F), TensorSpec("repetition_penalty", _F), TensorSpec("min_tokens", _I),
    TensorSpec("presence_penalty", _F), TensorSpec("frequency_penalty", _F), TensorSpec("seed", "UINT64"),
    TensorSpec("return_log_probs", _B), TensorSpec("return_context_logits", _B),
    TensorSpec("return_generation_logits", _B), TensorSpec("return_perf_metrics", _B),
    TensorSpec("return_num_input_tokens", _B), TensorSpec("return_num_output_tokens", _B),
    TensorSpec("beam_width", _I), TensorSpec("stream", _B),
    TensorSpec("prompt_embedding_table", "FP16", (-1, -1)), TensorSpec("prompt_table_extra_id", "UINT64"),
    TensorSpec("prompt_vocab_size", _I), TensorSpec("embedding_bias_words", _S, (-1,)),
    TensorSpec("embedding_bias_weights", _F, (-1,)), TensorSpec("lora_task_id", "UINT64"),
    TensorSpec("lora_weights", "FP16", (-1, -1), ragged=True), TensorSpec("lora_config", _I, (-1, 3), ragged=True),
    TensorSpec("guided_decoding_guide_type", _S, ragged=True), TensorSpec("guided_decoding_guide", _S, ragged=True),
    # CAST's own: the speculative method and tree budget of this request
    TensorSpec("method", _S), TensorSpec("budget", _S),
)
OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_output", _S, (-1,)),  # [batch, 1]: text (streaming: the new text of this response)
    TensorSpec("acceptance_rate", _F),  # total_accepted_draft_tokens / total_draft_tokens
    TensorSpec("total_accepted_draft_tokens", _I),  # sum over drafted rounds of (committed - 1)
    TensorSpec("total_draft_tokens", _I),  # sum of tree sizes N of drafted rounds
    TensorSpec("num_input_tokens", _I),  # with return_num_input_tokens
    TensorSpec("num_output_tokens", _I),  # with return_num_output_tokens
    TensorSpec("arrival_time_ns", "INT64"),  # with return_perf_metrics: wall clock, ns
    TensorSpec("first_token_time_ns", "INT64"),
    TensorSpec("last_token_time_ns", "INT64"),
    TensorSpec("output_ids", _I, (-1,)),  # generated token ids (streaming: the new ones; batch: pad_id-padded)
    TensorSpec("accept_lengths", _I, (-1,)),  # committed tokens of each verify round (R = A + 1; 0-padded)
    TensorSpec("finish_reason", _S),  # "eos" | "stop" | "length"; "" until the last response
)
SPECS = {s.name: s for s in INPUTS}


def _all_empty(v: np.ndarray) -> bool:
    return all(not _text(s) for s in v.reshape(-1))


def _equals(neutral: float) -> Callable[[np.ndarray], bool]:
    return lambda v: v.size == 1 and float(v.reshape(-1)[0]) == neutral


# optional inputs the engine does not implement: accepted only at the value that asks for nothing
NEUTRAL: dict[str, tuple[Callable[[np.ndarray], bool], str, str]] = {
    "decoder_text_input": (_all_empty, '""', "it is for encoder-decoder models; this target is decoder-only"),
    "num_return_sequences": (_equals(1), "1", "one sequence per request (send the prompt several times)"),
    "beam_width": (_equals(1), "1", "beam search is not supported (CAST verifies one sequence)"),
    "length_penalty": (_equals(1.0), "1.0", "it applies to beam search only, which is not supported"),
    "embedding_bias_words": (_all_empty, '""', "a logit bias changes the target's law; not implemented"),
    "embedding_bias_weights": (lambda v: v.size == 0, "[]", "a logit bias changes the target's law; not implemented"),
    "return_log_probs": (_equals(0), "false", "the engine does not keep log-probabilities"),
    "return_context_logits": (_equals(0), "false", "the engine does not return logits"),
    "return_generation_logits": (_equals(0), "false", "the engine does not return logits"),
    "guided_decoding_guide_type": (_all_empty, '""', "guided decoding is not supported"),
    "guided_decoding_guide": (_all_empty, '""', "guided decoding is not supported"),
}
_PTUNING, _LORA = "prompt tuning is not supported", "LoRA adapters are not supported"
REFUSED = {  # inputs refused whenever present
    "prompt_embedding_table": _PTUNING, "prompt_table_extra_id": _PTUNING, "prompt_vocab_size": _PTUNING,
    "lora_task_id": _LORA, "lora_weights": _LORA, "lora_config": _LORA,
}


@dataclass(frozen=True, slots=True)
class ResponseOptions:
    """What the answer to one request must carry, beyond the engine's `Request`."""

    prompt: str  # text_input as sent
    stream: bool = False
    exclude_input: bool = False  # exclude_input_in_output
    pad_id: int | None = None
    num_input_tokens: bool = False
    num_output_tokens: bool = False
    perf_metrics: bool = False


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


def split_batch(inputs: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Triton tensors [batch, ...] → one dict per batch row (every input has the batch dim)."""
    sizes = {arr.shape[0] if arr.ndim else 0 for arr in inputs.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"every input needs the same leading batch dimension, got shapes "
                         f"{ {k: list(v.shape) for k, v in inputs.items()} }")
    return [{name: arr[i] for name, arr in inputs.items()} for i in range(sizes.pop())]


def _check_types(inputs: dict[str, np.ndarray]) -> None:
    unknown = sorted(set(inputs) - set(SPECS))
    if unknown:
        raise ValueError(f"unknown input(s) {unknown}; accepted inputs are {sorted(SPECS)}")
    for spec in INPUTS:
        if spec.name not in inputs:
            if not spec.optional:
                raise ValueError(f"missing required input '{spec.name}' (TYPE_{spec.dtype})")
            continue
        dtype = inputs[spec.name].dtype
        if dtype.kind not in KINDS[spec.dtype]:
            raise ValueError(f"input '{spec.name}' must be TYPE_{spec.dtype}, got numpy dtype {dtype}")
    for name in sorted(set(inputs) & set(REFUSED)):
        raise ValueError(f"input '{name}' is not supported: {REFUSED[name]}")
    for name in sorted(set(inputs) & set(NEUTRAL)):
        accepts, neutral, why = NEUTRAL[name]
        if not accepts(inputs[name]):
            shown = [_text(v) if inputs[name].dtype.kind in "OSU" else v.item() for v in inputs[name].reshape(-1)]
            raise ValueError(f"input '{name}'={shown[0] if len(shown) == 1 else shown} is not supported: "
                             f"{why}; send {neutral} or leave it out")


def _token_id(inputs: dict[str, np.ndarray], name: str, vocab_size: int, allow_none: bool) -> int | None:
    if name not in inputs:
        return None
    value = int(_scalar(inputs, name))
    if not (0 <= value < vocab_size or (allow_none and value == -1)):
        allowed = f"[0, {vocab_size})" + (" or -1 (no end id)" if allow_none else "")
        raise ValueError(f"input '{name}'={value} is not a token id: must be in {allowed}")
    return value


def _words(inputs: dict[str, np.ndarray], name: str) -> tuple[str, ...]:
    """The words of a word-list input, one per element, empty ones dropped."""
    return tuple(w for w in (_text(v) for v in inputs.get(name, np.zeros(0)).reshape(-1)) if w)


def _value(inputs: dict[str, np.ndarray], name: str, default: Any) -> Any:
    return _scalar(inputs, name) if name in inputs else default


class RequestError(ValueError):
    """A refused request, naming its field (`param`) and an OpenAI error `code`."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param, self.code = param, code


def check_max_tokens(asked: int | None, prompt_len: int, cfg: ServingConfig, window: int) -> int:
    """The max_tokens a request runs with (both APIs): `asked`, or the server's default cut to
    what the context window leaves; RequestError when the prompt or max_tokens does not fit."""
    room, limit = window - prompt_len, cfg.max_tokens_limit
    if room < 1:
        raise RequestError(f"the prompt has {prompt_len} tokens; the context window holds {window}: shorten it",
                           "prompt", "context_length_exceeded")
    if asked is None:
        return min(cfg.default_max_tokens, room)
    if not 1 <= asked <= limit:
        raise RequestError(f"max_tokens={asked} is out of range: must be in [1, {limit}] (this server's limit)",
                           "max_tokens")
    if asked > room:
        raise RequestError(f"prompt ({prompt_len} tokens) + max_tokens ({asked}) exceeds the context window of "
                           f"{window} tokens; shorten the prompt or lower max_tokens", "max_tokens",
                           "context_length_exceeded")
    return asked


def parse_request(request_id: str, inputs: dict[str, np.ndarray], cfg: ServingConfig,
                  encode: Callable[[str], list[int]], context_window: int, vocab_size: int,
                  tokenizer: Any) -> tuple[Request, ResponseOptions]:
    """Validate one batch row's tensors and tokenize its prompt (`encode`) and bad words
    (no special tokens, no chat template). The engine `Request` checks the rest (e.g.
    method, min_tokens) with messages that name the field."""
    _check_types(inputs)
    prompt = _text(_scalar(inputs, "text_input"))
    if not prompt.strip():
        raise ValueError("input 'text_input' is empty: send a non-empty prompt")
    bad_words = _words(inputs, "bad_words")
    if any(not tokenize(tokenizer, w, False) for w in bad_words):
        raise ValueError(f"input 'bad_words'={list(bad_words)} holds a word with no tokens")
    penalties = {name: float(_scalar(inputs, name)) for name in ("repetition_penalty", "presence_penalty",
                                                                  "frequency_penalty") if name in inputs}
    method, budget = _value(inputs, "method", None), _value(inputs, "budget", None)
    if budget is not None:
        budget = check_budget(_text(budget).strip().lower(), "input 'budget'")
    end_id = _token_id(inputs, "end_id", vocab_size, allow_none=True)
    flags = {name: bool(_value(inputs, key, False)) for name, key in (
        ("stream", "stream"), ("exclude_input", "exclude_input_in_output"), ("perf_metrics", "return_perf_metrics"),
        ("num_input_tokens", "return_num_input_tokens"), ("num_output_tokens", "return_num_output_tokens"))}
    options = ResponseOptions(prompt, pad_id=_token_id(inputs, "pad_id", vocab_size, allow_none=False), **flags)
    ids = encode(prompt)
    asked = _value(inputs, "max_tokens", None)
    max_tokens = check_max_tokens(None if asked is None else int(asked), len(ids), cfg, context_window)
    seed = _value(inputs, "seed", None)
    try:
        params = SamplingParams(
            max_tokens=max_tokens, temperature=float(_value(inputs, "temperature", 0.0)),
            top_p=float(_value(inputs, "top_p", 1.0)) or None,  # 0: off, as TensorRT-LLM's backend sends it
            top_k=int(_value(inputs, "top_k", 0)) or None, seed=None if seed is None else int(seed),
            stop=list(_words(inputs, "stop_words")) or None, end_id=end_id,
            min_tokens=int(_value(inputs, "min_tokens", 0)), bad=list(bad_words) or None, **penalties)
    except ValueError as err:
        raise ValueError(f"bad sampling parameters: {err}") from err
    request = engine_request(params, ids, tokenizer, request_id,
                             None if method is None else _text(method).strip().lower(), budget)
    return request, options
