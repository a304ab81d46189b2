"""Stop conditions applied to each round's committed tokens.

A round commits R = A + 1 tokens at once; generation must end at the FIRST of them that
is an end-of-sequence token, completes a stop string, or reaches `max_new_tokens`, and
nothing after it is emitted. The EOS token itself is kept in `token_ids` (and skipped
in the text); for a stop string the token that completes it is the last one kept.
"""

from __future__ import annotations

from typing import Any, Sequence

FINISH_EOS, FINISH_STOP, FINISH_LENGTH = "eos", "stop", "length"


class StopChecker:
    def __init__(
        self,
        tokenizer: Any,
        eos_token_ids: Sequence[int],
        stop_strings: Sequence[str],
        max_new_tokens: int,
    ) -> None:
        # max_new_tokens >= 1 and non-empty stop strings: `runtime.engine.Request` checked them
        if stop_strings and tokenizer is None:
            raise ValueError("stop strings need a tokenizer to decode the output")
        self.tokenizer = tokenizer
        self.eos = frozenset(int(t) for t in eos_token_ids)
        self.stop_strings = tuple(stop_strings)
        self.max_new_tokens = max_new_tokens
        self._scanned_chars = 0  # text of earlier tokens already searched

    def _text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def _stop_end(self, ids: Sequence[int]) -> bool:
        """True if the text of `ids` contains a stop string ending after the scanned text."""
        text = self._text(ids)
        start = max(0, self._scanned_chars - max(len(s) for s in self.stop_strings) + 1)
        return any(s in text[start:] for s in self.stop_strings)

    def check(self, emitted: Sequence[int], new: Sequence[int]) -> tuple[int, str | None]:
        """How many of `new` to keep, and the finish reason (None: generation goes on)."""
        room = self.max_new_tokens - len(emitted)
        new = [int(t) for t in new[:room]]
        keep, reason = len(new), None
        for j, token in enumerate(new):
            if token in self.eos:
                keep, reason = j + 1, FINISH_EOS
                break
        if self.stop_strings and self._stop_end([*emitted, *new[:keep]]):
            # the earliest token that completes a stop string (a few decodes, once)
            first = next(j for j in range(keep) if self._stop_end([*emitted, *new[: j + 1]]))
            keep, reason = first + 1, FINISH_STOP
        if reason is None and len(emitted) + keep >= self.max_new_tokens:
            reason = FINISH_LENGTH
        if self.stop_strings:
            self._scanned_chars = len(self._text([*emitted, *new[:keep]]))
        return keep, reason
