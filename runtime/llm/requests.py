"""The ONE place a caller's `SamplingParams` (TensorRT-LLM's names, `cast_trtllm.sampling_params`)
becomes an engine `Request`: the LLM API, the OpenAI server and the Triton model all call
`engine_request`, so one option has one meaning on every surface."""

from __future__ import annotations

from typing import Any, Sequence

from cast_trtllm.sampling_params import SamplingParams
from runtime.engine import Request


def tokenize(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    """Token ids of `text` (a Hugging Face tokenizer). Chat prompts and bad words pass False:
    a template already holds BOS etc., a word has none."""
    return list(tokenizer(text, add_special_tokens=add_special_tokens).input_ids)


def prompt_ids(tokenizer: Any, prompt: str | Sequence[int], params: SamplingParams) -> list[int]:
    """A prompt's token ids as TensorRT-LLM's LLM API makes them: text tokenized as is (no chat
    template; special tokens per `add_special_tokens`), ids taken as given; then left-truncated
    to `truncate_prompt_tokens`."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("prompt is empty: send a non-empty prompt")
        ids = tokenize(tokenizer, prompt, params.add_special_tokens)
    else:
        ids = [int(t) for t in prompt]
    if params.truncate_prompt_tokens is not None:
        ids = ids[-params.truncate_prompt_tokens:]
    if not ids:
        raise ValueError("prompt is empty: send a non-empty prompt")
    return ids


def engine_request(params: SamplingParams, ids: Sequence[int], tokenizer: Any, request_id: str = "",
                   method: str | None = None, budget: int | str | None = None) -> Request:
    """The engine request of `params` over prompt `ids`; ValueError naming a bad field.

    end_id replaces the model's end ids (-1: none); bad words are tokenized without special
    tokens, bad_token_ids are one-token words; method / budget None take the engine's SpecConfig.
    """
    bad = tuple(tuple(tokenize(tokenizer, w, False)) for w in params.bad_words)
    if any(not w for w in bad):
        raise ValueError(f"SamplingParams.bad={params.bad!r} holds a word with no tokens")
    bad += tuple((t,) for t in params.bad_token_ids or ())
    eos = None if params.end_id is None else () if params.end_id == -1 else (params.end_id,)
    return Request(tuple(ids), params.max_tokens, params.law(), params.stop_strings, method, budget,
                   ignore_eos=params.ignore_eos, request_id=request_id, eos_token_ids=eos,
                   stop_token_ids=tuple(params.stop_token_ids or ()), min_tokens=params.min_tokens or 0,
                   bad_words=bad, logprobs=params.logprobs, penalties=params.penalties())
