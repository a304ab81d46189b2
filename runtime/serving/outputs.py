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

from typing import Any, Sequence as Seq

import numpy as np

from runtime.serving.requests import OUTPUTS

REPLACEMENT = "\ufffd"  # what a decoder prints for an incomplete UTF-8 sequence
NUMPY_TYPES = {"STRING": np.object_, "FP32": np.float32, "INT32": np.int32, "INT64": np.int64}


def spec_stats(live: Any) -> dict[str, float | int]:
    """acceptance_rate, total_accepted_draft_tokens and total_draft_tokens of a sequence's rounds
    (`budgets`: tree size N per round; `drafted`: whether the round drafted)."""
    drafted = sum(n for n, d in zip(live.budgets, live.drafted) if d)
    accepted = sum(a - 1 for a, d in zip(live.accept_lengths, live.drafted) if d)
    return {"acceptance_rate": accepted / drafted if drafted else 0.0, "total_accepted_draft_tokens": accepted,
            "total_draft_tokens": drafted}


class TextStream:
    """Text of a growing token list, sent in pieces that join to the full text (every API).

    A piece never ends in an incomplete UTF-8 character (held back until the tokens that
    complete it arrive, or until the last response). With `stops` (OpenAI and TensorRT-LLM
    omit the stop string unless `include_stop`): the final text ends before the first stop
    string (or right after it), and a piece holds back the last len(longest stop) - 1
    characters, which may be the start of one. decode: the tokenizer's decode options
    (skip_special_tokens, spaces_between_special_tokens).
    """

    def __init__(self, tokenizer: Any, prefix: str = "", stops: Seq[str] = (), include_stop: bool = False,
                 **decode: bool) -> None:
        self.tokenizer, self.prefix, self.stops, self.include_stop = tokenizer, prefix, tuple(stops), include_stop
        self.decode = {"skip_special_tokens": True, **decode}
        self.sent = 0  # chars of text already sent

    def text(self, tokens: Seq[int]) -> str:
        return self.prefix + self.tokenizer.decode(list(tokens), **self.decode)

    def full(self, tokens: Seq[int], final: bool = True) -> str:
        """The text a client may see: all of it once final, else the part that cannot change."""
        text = self.text(tokens)
        if final:
            cuts = sorted((i, len(s)) for s in self.stops if (i := text.find(s)) >= 0)
            return text if not cuts else text[: cuts[0][0] + (cuts[0][1] if self.include_stop else 0)]
        text = text.rstrip(REPLACEMENT)
        hold = max((len(s) for s in self.stops), default=1) - 1
        return text[: len(text) - hold] if hold else text

    def piece(self, tokens: Seq[int], final: bool) -> str:
        text = self.full(tokens, final)
        out = text[self.sent:]
        self.sent = max(self.sent, len(text))
        return out


def _padded(rows: list[list[int]], pad: int) -> np.ndarray:
    width = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), width), pad, dtype=np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def response_arrays(rows: list[dict[str, Any]], pad_id: int) -> dict[str, np.ndarray]:
    """Output tensors [batch, ...] of one response from each row's {output name: value}: the
    `OUTPUTS` every row holds (optional ones only where asked for); token lists are padded
    (output_ids with `pad_id`, accept_lengths with 0)."""
    out = {}
    for spec in OUTPUTS:
        values = [r[spec.name] for r in rows if spec.name in r]
        if len(values) < len(rows):
            continue
        if isinstance(values[0], list):
            out[spec.name] = _padded(values, pad_id if spec.name == "output_ids" else 0)
        else:
            values = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
            out[spec.name] = np.array(values, dtype=NUMPY_TYPES[spec.dtype]).reshape(len(rows), 1)
    return out
