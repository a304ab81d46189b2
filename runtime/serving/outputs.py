"""What a Triton response reports about a sequence (a `runtime.engine.Sequence`, which ends
itself at its end id, `Request.eos_token_ids`): pure functions over the engine's state.

Terms (TensorRT-LLM's speculative-decoding metrics, computed from the rounds):
  total_draft_tokens          sum of the tree sizes N of the rounds that drafted
  total_accepted_draft_tokens sum over those rounds of (committed tokens − 1): the bonus
                              token each round commits is not a draft token
  acceptance_rate             accepted / drafted (0 when nothing was drafted)
A sequence starts with the prefill's token, then each round commits R = A + 1 tokens, so
len(tokens) == 1 + sum(accept_lengths).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence as Seq

import numpy as np

REPLACEMENT = "\ufffd"  # what a decoder prints for an incomplete UTF-8 sequence


def spec_stats(live: Any) -> tuple[float, int, int]:
    """(acceptance_rate, total_accepted_draft_tokens, total_draft_tokens) of a sequence's rounds
    (`budgets`: tree size N per round; `drafted`: whether the round drafted)."""
    drafted = sum(n for n, d in zip(live.budgets, live.drafted) if d)
    accepted = sum(a - 1 for a, d in zip(live.accept_lengths, live.drafted) if d)
    return (accepted / drafted if drafted else 0.0), accepted, drafted


class TextStream:
    """Text of a growing token list, sent in pieces that join to the full text (both APIs).

    A piece never ends in an incomplete UTF-8 character (held back until the tokens that
    complete it arrive, or until the last response). With `stops` (OpenAI, which omits the
    stop string): the final text ends before the first stop string, and a piece holds back
    the last len(longest stop) - 1 characters, which may be the start of one.
    """

    def __init__(self, tokenizer: Any, prefix: str = "", stops: Seq[str] = ()) -> None:
        self.tokenizer, self.prefix, self.stops = tokenizer, prefix, tuple(stops)
        self.sent = 0  # chars of text already sent

    def full(self, tokens: Seq[int], final: bool = True) -> str:
        """The text a client may see: all of it once final, else the part that cannot change."""
        text = self.prefix + self.tokenizer.decode(list(tokens), skip_special_tokens=True)
        if final:
            cuts = [i for i in (text.find(s) for s in self.stops) if i >= 0]
            return text[: min(cuts)] if cuts else text
        text = text.rstrip(REPLACEMENT)
        hold = max((len(s) for s in self.stops), default=1) - 1
        return text[: len(text) - hold] if hold else text

    def piece(self, tokens: Seq[int], final: bool) -> str:
        text = self.full(tokens, final)
        out = text[self.sent:]
        self.sent = max(self.sent, len(text))
        return out


@dataclass(slots=True)
class RowOutput:
    """One batch row of a response."""

    text: str
    ids: list[int]
    accept_lengths: list[int]
    finish_reason: str
    stats: tuple[float, int, int]
    num_input_tokens: int | None = None  # None: not asked for
    num_output_tokens: int | None = None
    times_ns: tuple[int, int, int] | None = None  # arrival, first token, last token (perf metrics)


def _padded(rows: list[list[int]], pad: int) -> np.ndarray:
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), width), pad, dtype=np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def response_arrays(rows: list[RowOutput], pad_id: int) -> dict[str, np.ndarray]:
    """Output tensors [batch, ...] of one response; optional outputs only where asked for."""
    def column(values, dtype) -> np.ndarray:
        return np.array(values, dtype=dtype).reshape(len(rows), 1)

    out = {
        "text_output": column([r.text.encode("utf-8") for r in rows], np.object_),
        "acceptance_rate": column([r.stats[0] for r in rows], np.float32),
        "total_accepted_draft_tokens": column([r.stats[1] for r in rows], np.int32),
        "total_draft_tokens": column([r.stats[2] for r in rows], np.int32),
        "output_ids": _padded([r.ids for r in rows], pad_id),
        "accept_lengths": _padded([r.accept_lengths for r in rows], 0),
        "finish_reason": column([r.finish_reason.encode() for r in rows], np.object_),
    }
    if all(r.num_input_tokens is not None for r in rows):
        out["num_input_tokens"] = column([r.num_input_tokens for r in rows], np.int32)
    if all(r.num_output_tokens is not None for r in rows):
        out["num_output_tokens"] = column([r.num_output_tokens for r in rows], np.int32)
    if all(r.times_ns is not None for r in rows):
        for j, name in enumerate(("arrival_time_ns", "first_token_time_ns", "last_token_time_ns")):
            out[name] = column([r.times_ns[j] for r in rows], np.int64)
    return out
