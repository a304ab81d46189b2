"""A request (what a caller asks for) and a sequence (its live state in the engine)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cast_trtllm.draft_gate import DraftGate
from cast_trtllm.penalties import Penalties
from cast_trtllm.logit_processing import MAX_TOP_LOGPROBS, LogitProcessor, check_bad_words, committed_rows, \
    token_logprobs
from cast_trtllm.sampling import SamplingParams, sample_tokens
from cast_trtllm.tree import Tree
from cast_trtllm.verify import Acceptance
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
    ignore_eos: bool = False  # the engine's (or eos_token_ids') ids do not end it; stop_token_ids still do
    request_id: str = ""
    eos_token_ids: tuple[int, ...] | None = None  # None: the engine's; else they REPLACE them (Triton end_id)
    stop_token_ids: tuple[int, ...] = ()  # more ids that end the request (OpenAI stop_token_ids)
    min_tokens: int = 0  # the ids that end it are banned before this many output tokens
    bad_words: tuple[tuple[int, ...], ...] = ()  # token sequences never emitted
    logprobs: int | None = None  # None: none kept; k: each token's logprob and its row's top k
    penalties: Penalties | None = None  # repetition / presence / frequency penalties, min_p (target rows)

    def stop_ids(self, engine_eos: tuple[int, ...]) -> tuple[int, ...]:
        """The token ids that end this request."""
        eos = () if self.ignore_eos else (engine_eos if self.eos_token_ids is None else self.eos_token_ids)
        return tuple(dict.fromkeys((*eos, *self.stop_token_ids)))

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
        for name in ("eos_token_ids", "stop_token_ids"):
            ids = getattr(self, name)
            if ids is not None:
                object.__setattr__(self, name, tuple(int(t) for t in ids))
                if any(t < 0 for t in getattr(self, name)):
                    raise ValueError(f"{name} must be token ids >= 0, got {list(ids)}")
        object.__setattr__(self, "bad_words", check_bad_words(self.bad_words))
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs (top entries per token) must be in [0, {MAX_TOP_LOGPROBS}], "
                             f"got {self.logprobs}")


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
    processor: LogitProcessor | None = None  # min_tokens / bad_words (None: nothing to apply)
    draft_next: bool = True  # whether the next round drafts (the gate's call)
    root: int = -1  # pending root b
    prefilled: int = 0  # prompt tokens already run through the target (chunked prefill)
    arrival: float = 0.0  # clock reading when the engine admitted it (TTFT counts from here)
    pending_taps: list[torch.Tensor] = field(default_factory=list)  # committed, not yet in the drafter
    tokens: list[int] = field(default_factory=list)
    accept_lengths: list[int] = field(default_factory=list)
    budgets: list[int] = field(default_factory=list)
    drafted: list[bool] = field(default_factory=list)
    round_ms: list[float] = field(default_factory=list)
    accepted: float = 0.0  # accepted (non-root) tokens of drafted auto rounds
    forecast: float = 0.0  # their forecast: sum of the chosen trees' calibrated node masses
    masses: np.ndarray | None = None  # an auto request's last whole drafted round's masses, as drafted
    timings: Timings = field(default_factory=Timings)
    finish_reason: str | None = None
    error: str | None = None
    logprobs: list[float] = field(default_factory=list)  # per emitted token, when the request asks
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)  # (token, logprob), best first

    def __post_init__(self) -> None:
        req = self.request  # the ids that end it (the stop checker's) are the ones min_tokens bans
        self.processor = LogitProcessor.of(sorted(self.stop.eos), req.min_tokens, req.bad_words, req.penalties,
                                           req.sampling.temperature)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def processed(self, tree: Tree, logits: torch.Tensor) -> torch.Tensor:
        """The target's rows [n, V] of `tree`'s pack after this request's min_tokens / bad_words
        (`cast_trtllm.logit_processing`); `logits` itself when there is nothing to apply."""
        if self.processor is None:
            return logits
        history = self.request.prompt_ids + tuple(self.tokens) if self.processor.needs_history else ()
        return self.processor.apply(logits, tree, history, len(self.tokens))

    def sample_first(self, logits: torch.Tensor) -> int:
        """The first output token from the prefill's last row [1, V], under the same processing."""
        row = self.processed(Tree.empty(), logits)
        token = int(sample_tokens(row, self.request.sampling, self.generator)[0])
        self._keep_logprobs(row, [token])
        return token

    def emit(self, acc: Acceptance, keep: int, logits: torch.Tensor | None) -> None:
        """Append a round's first `keep` committed tokens. logits: [n, V] the processed pack rows."""
        tokens = acc.committed[:keep].tolist()
        if self.request.logprobs is not None:
            self._keep_logprobs(logits[torch.from_numpy(committed_rows(acc.path)[:keep]).to(logits.device)], tokens)
        self.tokens += tokens

    def _keep_logprobs(self, rows: torch.Tensor, tokens: list[int]) -> None:
        """rows: [m, V] the processed rows that produced `tokens` (nothing kept unless asked)."""
        if self.request.logprobs is not None and tokens:
            lp, top = token_logprobs(rows, tokens, self.request.logprobs)
            self.logprobs += lp
            self.top_logprobs += top

    @property
    def prefilling(self) -> bool:
        """Whether part of its prompt still waits for a round."""
        return self.prefilled < len(self.request.prompt_ids)

    @property
    def room(self) -> int:
        """Output tokens it may still emit (max_new_tokens, within the context window)."""
        return self.stop.max_new_tokens - len(self.tokens)

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
            logprobs=list(self.logprobs), top_logprobs=list(self.top_logprobs),
        )
