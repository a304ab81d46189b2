"""Draft gate: per round, whether speculating pays at all on this deployment, from MEASURED costs.

The width rule (`cast_trtllm.width`) picks the best budget N once a block is drafted; it
cannot say "do not draft". Where the drafter plus a wider verify cost more per committed
token than a plain autoregressive step (a compute-bound CPU, a weak head on a domain it
was not trained for), every budget loses to AR. The gate compares two arms per request:

- speculate: a drafted round commits R tokens and costs draft + verify(N + 1) + overhead;
- AR: an undrafted round commits 1 token and costs verify(1) + overhead (the drafter's
  feature cache is caught up lazily, at the next drafted round, and billed to that round).

It keeps exponentially weighted means of committed tokens and round milliseconds per arm,
plays the arm with the higher tokens/ms, and tries the other arm once every
`probe_every` rounds so a change of domain or of machine load is noticed. Costs are the
request's own wall-clock readings, so the decision follows the machine as it runs, not a
profile taken under other load.

A drafted round's tokens are forecast from its calibrated tree mass 1 + sum(rho ** beta)
(the expected committed length, paper §2) rather than from the realized length R: R of
one round is 1 or much more, and an arm played only at probes would otherwise stay stuck
on an unlucky sample (the AR arm's 1 token is exact). The forecast is scaled by the
request's own realized / predicted accepted tokens (with `prior_tokens` pseudo-counts),
so a head over-confident on this domain is corrected as the request runs. Output is unaffected (greedy rounds commit the target's
tokens either way; sampled AR rounds draw from the target law); only which rounds draft.
Pure Python: the runtime feeds `record` and asks `draft_next`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ArmStats:
    """EWMA of committed tokens and wall milliseconds per round of one arm."""

    tokens: float = 0.0
    ms: float = 0.0
    rounds: int = 0

    def update(self, tokens: float, round_ms: float, alpha: float) -> None:
        if self.rounds == 0:
            self.tokens, self.ms = float(tokens), float(round_ms)
        else:
            self.tokens += alpha * (tokens - self.tokens)
            self.ms += alpha * (round_ms - self.ms)
        self.rounds += 1

    @property
    def tokens_per_ms(self) -> float:
        return self.tokens / self.ms if self.ms > 0 else 0.0


@dataclass(slots=True)
class DraftGate:
    """Per-request two-arm choice between a drafted (speculative) round and an AR round.

    The first round speculates (its draft is already made), the second runs AR so both
    arms are measured; then the better arm by tokens/ms is played, and the other one is
    tried once whenever it has not run for `probe_every` rounds.
    """

    alpha: float = 0.2         # EWMA weight of the newest round
    probe_every: int = 16      # rounds between tries of the arm not being played
    prior_tokens: float = 2.0  # pseudo-count of the realized / predicted correction
    speculate: ArmStats = field(default_factory=ArmStats)
    autoregressive: ArmStats = field(default_factory=ArmStats)
    realized: float = 0.0      # accepted (non-root) tokens of drafted rounds with a forecast
    predicted: float = 0.0     # their forecast accepted tokens
    _since_other: int = 0      # rounds since the arm not being played last ran

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"DraftGate.alpha must be in (0, 1], got {self.alpha}")
        if self.probe_every < 2:
            raise ValueError(f"DraftGate.probe_every must be >= 2 rounds, got {self.probe_every}")
        if self.prior_tokens <= 0:
            raise ValueError(f"DraftGate.prior_tokens must be > 0, got {self.prior_tokens}")

    def record(self, drafted: bool, committed: int, round_ms: float, expected: float | None = None) -> None:
        """One finished round: committed tokens (>= 1), its wall ms (draft included) and, for
        a drafted round, its forecast committed length 1 + sum of calibrated node masses."""
        if committed < 1 or not round_ms > 0:
            raise ValueError(f"a round commits >= 1 token in > 0 ms, got {committed} tokens, {round_ms} ms")
        if expected is not None and expected < 1:
            raise ValueError(f"a drafted round's expected committed length is >= 1, got {expected}")
        tokens = float(committed)
        if drafted and expected is not None:
            self.realized += committed - 1
            self.predicted += expected - 1
            tokens = expected
        arm = self.speculate if drafted else self.autoregressive
        arm.update(tokens, round_ms, self.alpha)
        self._since_other = 0 if drafted != self.best_is_speculate() else self._since_other + 1

    @property
    def correction(self) -> float:
        """Realized / predicted accepted tokens of this request, shrunk to 1 by the prior."""
        return (self.realized + self.prior_tokens) / (self.predicted + self.prior_tokens)

    def speculate_tokens_per_ms(self) -> float:
        accepted = (self.speculate.tokens - 1.0) * (self.correction if self.predicted > 0 else 1.0)
        return (1.0 + accepted) / self.speculate.ms if self.speculate.ms > 0 else 0.0

    def best_is_speculate(self) -> bool:
        """The arm with the higher measured tokens/ms (speculate until AR is measured)."""
        if self.autoregressive.rounds == 0:
            return True
        return self.speculate_tokens_per_ms() >= self.autoregressive.tokens_per_ms

    def draft_next(self) -> bool:
        """Whether the next round drafts."""
        if self.speculate.rounds == 0:
            return True
        if self.autoregressive.rounds == 0:
            return False
        best = self.best_is_speculate()
        return (not best) if self._since_other >= self.probe_every else best

    @property
    def rounds(self) -> tuple[int, int]:
        """(drafted rounds, AR rounds) so far."""
        return self.speculate.rounds, self.autoregressive.rounds
