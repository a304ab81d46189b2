"""What one generation returns, and the decode-only timer of paper App. D."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch


class Stopwatch:
    """The engine's clock (App. D). `now()` is the host wall clock; on CUDA it also records an
    event, and `device_ms(a, b)` is the device time between two readings, from those events.
    A round reads them after its one device -> host read, which has already waited for them,
    so timing never drains the stream. `sync=True` (the latency probe) synchronizes at every
    reading instead, for one pass timed alone."""

    KEEP = 64  # events kept (a round makes a handful of readings)

    def __init__(self, device: torch.device, sync: bool = False) -> None:
        self.cuda, self.sync = device.type == "cuda", sync
        self.events: dict[float, torch.cuda.Event] = {}

    def now(self) -> float:
        if self.cuda and self.sync:
            torch.cuda.synchronize()
        elif self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            t = time.perf_counter()
            self.events[t] = event
            if len(self.events) > self.KEEP:
                self.events.pop(next(iter(self.events)))
            return t
        return time.perf_counter()

    def device_ms(self, a: float, b: float) -> float:
        """ms between readings a and b: device time on CUDA where both events have completed,
        else wall time (never a wait)."""
        start, end = self.events.get(a), self.events.get(b)
        if start is not None and end is not None and end.query():
            return start.elapsed_time(end)
        return (b - a) * 1e3


@dataclass(slots=True)
class Timings:
    """Milliseconds. The decode window (App. D) opens after prefill for AR, and after
    prefill AND the first draft for chain/CAST (just before the first verify); it closes
    after the final truncation. draft + verify + overhead = decode."""

    ttft_ms: float = 0.0  # admission through the first token (its prompt's chunked prefill included)
    prefill_ms: float = 0.0  # the same: the drafter takes the prompt's taps in its next context pass
    first_draft_ms: float = 0.0  # excluded from the window
    decode_ms: float = 0.0
    draft_ms: float = 0.0  # drafter calls + feature-cache appends, inside the window
    verify_ms: float = 0.0  # target verify forwards
    overhead_ms: float = 0.0  # top-k, tree, masks, walk, KV gather, stop checks


@dataclass(slots=True)
class GenerationResult:
    method: str
    text: str
    token_ids: list[int]  # new tokens only (the EOS token included when it ended the run)
    finish_reason: str  # "eos" | "stop" | "length"
    prompt_tokens: int
    accept_lengths: list[int] = field(default_factory=list)  # committed R per round
    budgets: list[int] = field(default_factory=list)  # tree size N per round
    drafted: list[bool] = field(default_factory=list)  # whether the round drafted (False: AR / gated)
    round_ms: list[float] = field(default_factory=list)  # wall ms of each round (inside the decode window)
    timings: Timings = field(default_factory=Timings)
    logprobs: list[float] = field(default_factory=list)  # per token, when the request asked (Request.logprobs)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)  # per token: (token, logprob)

    @property
    def num_rounds(self) -> int:
        return len(self.accept_lengths)

    @property
    def mean_accept_length(self) -> float:
        """Mean committed tokens per verify round (R = A + 1; DFlash's tau)."""
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 0.0

    @property
    def decode_ms_per_token(self) -> float:
        """Decode window over every emitted new token (as dflash's benchmark counts)."""
        return self.timings.decode_ms / len(self.token_ids) if self.token_ids else 0.0

    @property
    def tokens_per_s(self) -> float:
        return 1000.0 / self.decode_ms_per_token if self.decode_ms_per_token > 0 else 0.0

    def to_dict(self) -> dict:
        """Every field (the logprobs only when kept) and the derived figures, for --json."""
        out = asdict(self)
        if not self.logprobs:
            del out["logprobs"], out["top_logprobs"]
        return {**out, "num_rounds": self.num_rounds, "mean_accept_length": self.mean_accept_length,
                "decode_ms_per_token": self.decode_ms_per_token, "tokens_per_s": self.tokens_per_s}
