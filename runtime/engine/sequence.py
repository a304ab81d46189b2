"""A request (what a caller asks for) and a sequence (its live state in the engine)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from cast_trtllm.draft_gate import DraftGate
from cast_trtllm.sampling import SamplingParams
from cast_trtllm.spec_config import METHODS, check_budget
from runtime.result import GenerationResult, Timings
from runtime.stopping import StopChecker


@dataclass(frozen=True, slots=True)
class Request:
    prompt_ids: tuple[int, ...]
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    stop_strings: tuple[str, ...] = ()
    method: str | None = None  # ar | chain | cast; None = the engine's SpecConfig.method
    budget: int | str | None = None  # cast: N or "auto"; None = the engine's SpecConfig.budget
    draft_gate: bool | None = None  # auto: None = the engine's SpecConfig.draft_gate
    ignore_eos: bool = False
    request_id: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", tuple(int(t) for t in self.prompt_ids))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))
        if not self.prompt_ids:
            raise ValueError("the prompt is empty")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.method is not None and self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.budget is not None:
            object.__setattr__(self, "budget", check_budget(self.budget))
        if any(not s for s in self.stop_strings):
            raise ValueError("stop strings must be non-empty")


@dataclass(slots=True)
class Sequence:
    """Live state of one request: caches, pending root, emitted tokens, per-round stats."""

    request: Request
    method: str  # resolved
    budget: int | str  # resolved: N, or "auto"
    target: Any  # the backend's per-request state (its target KV cache)
    draft_state: Any  # the drafter's feature cache (None for ar)
    stop: StopChecker
    generator: torch.Generator
    gate: DraftGate | None = None
    draft_next: bool = True  # whether the next round drafts (the gate's call)
    root: int = -1  # pending root b
    pending_taps: list[torch.Tensor] = field(default_factory=list)  # committed, not yet in the drafter
    tokens: list[int] = field(default_factory=list)
    accept_lengths: list[int] = field(default_factory=list)
    budgets: list[int] = field(default_factory=list)
    drafted: list[bool] = field(default_factory=list)
    round_ms: list[float] = field(default_factory=list)
    accepted: float = 0.0  # accepted (non-root) tokens of drafted auto rounds
    forecast: float = 0.0  # their forecast: sum of the chosen trees' calibrated node masses
    timings: Timings = field(default_factory=Timings)
    finish_reason: str | None = None
    error: str | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def acceptance_scale(self, prior_tokens: float = 2.0) -> float:
        """Realized / forecast accepted tokens of this request (shrunk to 1 by a prior):
        how much the drafter's masses under- or over-state what the target accepts here."""
        return (self.accepted + prior_tokens) / (self.forecast + prior_tokens)

    @property
    def num_rounds(self) -> int:
        return len(self.accept_lengths)

    def result(self, tokenizer: Any = None) -> GenerationResult:
        text = tokenizer.decode(self.tokens, skip_special_tokens=True) if tokenizer is not None else ""
        return GenerationResult(
            self.method, text, list(self.tokens), self.finish_reason or "", len(self.request.prompt_ids),
            accept_lengths=list(self.accept_lengths), budgets=list(self.budgets), drafted=list(self.drafted),
            round_ms=list(self.round_ms), timings=self.timings,
        )
