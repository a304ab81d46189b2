"""`RequestOutput` / `CompletionOutput` in TensorRT-LLM's shapes (`tensorrt_llm.executor.result`),
made from the engine's live state of one request.

TensorRT-LLM's conventions, kept here: finish_reason is "stop" (an end id, a stop token id
or a stop string ended it), "length" or "cancelled"; stop_reason is the stop token id or
stop string that matched (None for the end id); the token that ended it and the stop
string are left out of token_ids / text unless include_stop_str_in_output (the end id
always is); logprobs are per token {token id: Logprob(logprob, rank)} for the sampled token
and the top `logprobs` alternatives; *_diff are what arrived since the previous output
(streaming).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cast_trtllm.sampling_params import SamplingParams
from runtime.serving.outputs import TextStream

FINISH = {"eos": "stop", "stop": "stop", "length": "length"}  # engine -> TensorRT-LLM


@dataclass(slots=True)
class Logprob:
    logprob: float
    rank: int | None = None  # 1 = the most likely token of its row (None: outside the top kept)


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    prompt_logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "cancelled"; None while running
    stop_reason: int | str | None = None
    generation_logits: Any = None
    # what the previous output of this request held (streaming diffs)
    prev_text_len: int = 0
    prev_token_len: int = 0
    prev_logprobs_len: int = 0

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def text_diff(self) -> str:
        return self.text[self.prev_text_len:]

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self.prev_token_len:]

    @property
    def logprobs_diff(self) -> list[dict[int, Logprob]]:
        return self.logprobs[self.prev_logprobs_len:]


@dataclass(slots=True)
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    context_logits: Any = None
    stats: dict[str, Any] = field(default_factory=dict)  # CAST's: rounds, mean committed length, drafted rounds


def _token_logprobs(tokens: list[int], logprobs: list[float], top: list[list[tuple[int, float]]]
                    ) -> list[dict[int, Logprob]]:
    out = []
    for token, lp, alts in zip(tokens, logprobs, top):
        entry = {t: Logprob(v, rank) for rank, (t, v) in enumerate(alts, 1)}
        entry.setdefault(token, Logprob(lp, None))
        out.append(entry)
    return out


class OutputBuilder:
    """Snapshots of one request's output as its tokens arrive (it remembers what it last gave)."""

    def __init__(self, request_id: int, prompt: str | None, ids: list[int], params: SamplingParams,
                 tokenizer: Any) -> None:
        self.request_id, self.prompt, self.ids, self.params, self.tokenizer = request_id, prompt, ids, params, tokenizer
        self.last: CompletionOutput = CompletionOutput(0)
        self.text = TextStream(tokenizer, stops=params.stop_strings, include_stop=params.include_stop_str_in_output,
                               skip_special_tokens=params.skip_special_tokens,
                               spaces_between_special_tokens=params.spaces_between_special_tokens)

    def snapshot(self, live: Any, engine_reason: str | None, cancelled: bool = False) -> RequestOutput:
        """live: the engine's Sequence (None: cancelled before any state came back)."""
        p, done = self.params, engine_reason is not None or cancelled
        tokens = list(live.tokens) if live is not None else list(self.last.token_ids)
        lps = (list(live.logprobs), list(live.top_logprobs)) if live is not None else ([], [])
        reason = "cancelled" if cancelled else FINISH.get(engine_reason) if engine_reason else None
        stop_reason = None
        if engine_reason == "eos" and tokens:
            ender = tokens[-1]
            by_stop_id = ender in (p.stop_token_ids or ())
            stop_reason = ender if by_stop_id else None
            if not (by_stop_id and p.include_stop_str_in_output):  # an end id never shows
                tokens = tokens[:-1]
        text = "" if not p.detokenize else self.text.full(tokens, final=done)
        if engine_reason == "stop":
            full = self.text.text(tokens)
            stop_reason = min(p.stop_strings, key=lambda s: (full.find(s) if s in full else len(full), -len(s)))
            if not p.include_stop_str_in_output:  # token_ids: the tokens wholly before the stop string
                while tokens and len(self.text.text(tokens)) > len(text):
                    tokens = tokens[:-1]
        logprobs = _token_logprobs(tokens, *lps) if p.logprobs is not None else []
        last = self.last
        out = CompletionOutput(
            0, text, tokens, sum(lps[0][:len(tokens)]) if p.logprobs is not None else None, logprobs,
            finish_reason=reason, stop_reason=stop_reason, prev_text_len=len(last.text),
            prev_token_len=len(last.token_ids), prev_logprobs_len=len(last.logprobs))
        self.last = out
        stats = {}
        if live is not None:
            rounds = len(live.accept_lengths)
            stats = {"rounds": rounds, "drafted_rounds": sum(live.drafted), "tokens_per_iteration":
                     len(live.tokens) / (1 + rounds) if live.tokens else 0.0}
        return RequestOutput(self.request_id, self.prompt, list(self.ids), [out], done, stats=stats)
