"""Draft gate: per round, whether speculating pays at all on this deployment, from MEASURED costs.

The width rule picks the best budget N once a block is drafted; it cannot say "do not draft".
Where the drafter plus a wider verify cost more per committed token than a plain AR step (a
compute-bound CPU, a head off its training domain), every budget loses to AR. Per request, two arms:
a drafted round commits R tokens for draft + verify(N + 1) + overhead; an AR round 1 token for
verify(1) + overhead (the drafter's feature cache is caught up at the next drafted round, billed to it).
It plays the arm with the higher tokens/ms and tries the other now and then. Prices come from `costs`
(the engine's `OnlineCostModel`) where given: the width rule's best tree on this request's typical masses
(EWMA of its drafted rounds' sorted masses x `correction`), draft included, against an AR round at
ell(1). Without `costs` the arms' own EWMA wall-clock ms decide.

Under load (batch > 1, with `costs`) one request's probe costs the whole batch a draft pass and a padded
verify, so the gate plays the table's choice from the first round (on the engine's pooled evidence until
it has its own) and never probes alone: `LoadProbe` probes for the batch (`RealizedGuard` checks what
drafting measured). On a cold engine only the oldest auto request drafts (the scout); the rest inherit.

A drafted round's tokens are forecast from its calibrated tree mass 1 + sum(rho ** beta) (paper §2),
not the realized R (1 or much more in one round), scaled by the request's realized / predicted accepted
tokens shrunk by `prior_tokens` to the engine's pooled ratio; its own evidence fades (half-life `memory`
tokens), so a gate turned to AR by an answer's unpredictable opening re-prices on the domain's ratio.
That correction is noisy (MT-Bench, B = 1: sd of its log 0.32; a few blocks in a row that accept nothing
turned 30-45% of rounds to AR where the text was as predictable as where it drafted: auto 1.04x AR, cast:3
1.17x), so a drafting gate turns to AR only where drafting loses at the correction DOUBT posterior sds up
(`doubted`; auto 1.10x). Under load, where a gate's AR parks it until the load probe's backoff (16-128
rounds), not its own next try (4), a try from AR (one round) is judged the same way, and an answer's first
`min_drafted` drafted rounds never turn a gate off (c = 4, synthetic prompts, 2-core CPU: an answer's first
blocks turned gates to AR, a try of all 4 in the answers' 2nd round confirmed it: auto 0.89x of cast:3;
alone, the same rules cost 2-3% through the server on text where drafting loses). The guard still vetoes
what measures slower. The price: when text turns unpredictable it drafts longer (11-20 of 40 rounds).

Never slower than AR where drafting does not pay (issue 40): a gate playing AR tries drafting on
`cast_trtllm.probe_backoff.ProbeBackoff`'s schedule (the wait doubles with each try that confirms AR, the
longest at once while the table prices drafting far below AR: `LoadProbe`'s rule too), and only where the
try can pay back: its extra cost (a drafted round over an AR round, plus the one-off context pass over the
rows committed since the last draft, `once_ms`) must be at most `PROBE_GAIN` of the AR time left (`horizon`
tokens); turning drafting on must win that pass back within the horizon too. A try accepting >= `PROMISING`
of its forecast, where its evidence made that improbable, restarts it (`text_changed`: the text changed). A
new request inherits the engine's pooled evidence (`cast_trtllm.engine_evidence`) and backoff (up to `settled`
tries), so arrivals pay no drafted warm-up; a gate with no evidence drafts its first `min_drafted` rounds.
Alone, a new request whose inherited evidence says AR tries once in its first round (its text is new) where
that costs at most PROBE_SHARE of its AR rounds left. AR rounds re-price every max(probe_every, batch) rounds
(doubled like the waits) or once the correction faded by REPRICE; drafted ones unless the priced win, scaled
by how far the typical masses shrank, still wins (`_clear_win`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from cast_trtllm.arm_stats import ArmStats
from cast_trtllm.engine_evidence import EngineEvidence, blend
from cast_trtllm.probe_backoff import PROBE_SHARE, ProbeBackoff, text_changed, try_cost_rounds, try_pays

if TYPE_CHECKING:
    from cast_trtllm.cost_model import OnlineCostModel


REPRICE = 0.02  # an AR-playing gate re-prices once its correction has moved this much since its last pricing
DOUBT = 1.0  # a drafting gate turns to AR only where drafting loses at its correction this many sds up


@dataclass(slots=True)
class DraftGate:
    """Per-request two-arm choice between a drafted (speculative) round and an AR round: the better
    arm by tokens/ms is played, AR re-measured every `probe_every` drafted rounds, drafting tried on
    `ProbeBackoff`'s schedule where a try can pay back (module docstring)."""

    alpha: float = 0.2         # EWMA weight of the newest round
    probe_every: int = 4       # rounds between tries of the arm not being played
    prior_tokens: float = 2.0  # pseudo-count of the realized / predicted correction
    costs: OnlineCostModel | None = None  # price both arms from this table (else: wall-clock EWMA)
    min_drafted: int = 4  # with costs, cold: drafted rounds before the gate may turn drafting off (the
    # first block after a prompt is the least certain; one reading must not decide)
    speculate: ArmStats = field(default_factory=ArmStats)
    autoregressive: ArmStats = field(default_factory=ArmStats)
    realized: float = 0.0      # accepted (non-root) tokens of drafted rounds with a forecast
    predicted: float = 0.0     # their forecast accepted tokens
    packed: int | None = None  # packed tokens of the last drafted round (priced by `costs`)
    masses: np.ndarray | None = None  # EWMA of drafted rounds' sorted prefix masses (priced by `costs`)
    batch: int = 1  # live requests in the last round: `costs` prices both arms at this batch
    max_backoff: int = 5  # tries of drafting from AR wait probe_every << (confirming tries), up to this shift
    horizon: int | None = None  # tokens the request may still commit (the engine's; None: unbounded)
    stale_rows: int = 0  # rows committed since the last draft (the prompt's, set at admission): its context pass
    context_row_ms: float = 0.0  # the drafter's context pass, ms per row (the engine's measurement)
    inherited: bool = False  # holds another request's evidence: decides from the table from its first round
    memory: float = 16.0  # with a pool: half-life, in committed tokens, of this request's acceptance evidence
    pool: EngineEvidence | None = None  # the engine's pooled evidence: the correction shrinks to its ratio
    backoff: ProbeBackoff = field(init=False)
    _rates: tuple[float, float] | None = None  # (drafted, AR) tokens/ms at the last pricing by `costs`
    _held: int = 0             # AR rounds drafting was priced to win but could not repay its one-off pass
    _since_other: int = 0      # rounds since the arm not being played last ran
    _best: bool = True         # best_is_speculate() as of the last record that priced it
    _stale: int = 0            # records since then
    _priced_at: float = 1.0    # the correction at that pricing
    _mass: float = 0.0         # the typical masses' sum at that pricing

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"DraftGate.alpha must be in (0, 1], got {self.alpha}")
        if self.probe_every < 2:
            raise ValueError(f"DraftGate.probe_every must be >= 2 rounds, got {self.probe_every}")
        if self.prior_tokens <= 0:
            raise ValueError(f"DraftGate.prior_tokens must be > 0, got {self.prior_tokens}")
        self.backoff = ProbeBackoff(self.probe_every, self.max_backoff)

    def record(self, drafted: bool, committed: int, round_ms: float, expected: float | None = None,
               packed: int | None = None, masses: np.ndarray | None = None, batch: int = 1) -> None:
        """One finished round: committed tokens (>= 1), its wall ms (draft included) and, for a drafted round,
        its forecast 1 + sum of calibrated node masses and packed tokens N + 1; `batch`: requests in the round."""
        if batch < 1:
            raise ValueError(f"a round has >= 1 request, got batch {batch}")
        self.batch = batch
        if committed < 1 or not round_ms > 0:
            raise ValueError(f"a round commits >= 1 token in > 0 ms, got {committed} tokens, {round_ms} ms")
        if expected is not None and expected < 1:
            raise ValueError(f"a drafted round's expected committed length is >= 1, got {expected}")
        tokens = float(committed)
        fade = 1.0 if self.pool is None else 0.5 ** (committed / self.memory)  # fades to the engine's ratio
        self.realized, self.predicted = self.realized * fade, self.predicted * fade
        cold = not self.inherited and self.speculate.rounds < (self.min_drafted if self.costs is not None else 1)
        probe = drafted and not self._best and not cold  # a try of drafting while AR was played
        pool, new_text = self.pool, probe and self.inherited and self.rounds == (0, 0)  # `_new_text_try_pays`'
        if probe and expected is not None and text_changed(committed - 1, expected - 1, self.correction):
            self.realized = self.predicted = 0.0  # the text changed: what it accepted before says nothing now,
            self.pool = None  # nor does the engine's pool (alone: this request's old text); from here on as cold
        if drafted and expected is not None:
            self.realized += committed - 1
            self.predicted += expected - 1
            tokens = expected
        if drafted and packed is not None:
            self.packed = packed
        if drafted and masses is not None:
            self.masses = blend(self.masses, masses, self.alpha)
        (self.speculate if drafted else self.autoregressive).update(tokens, round_ms, self.alpha)
        self._stale += 1
        doubt = drafted and self._best and not cold
        opening = batch > 1 and self.autoregressive.rounds == 0 and self.speculate.rounds < self.min_drafted
        if not (doubt and opening) and (not self._clear_win(probe, doubt) if drafted else self.costs is None
                or abs(self.correction - self._priced_at) > REPRICE
                or self._stale >= max(self.probe_every, batch) << self.backoff.confirmed):
            # AR rounds re-price as rarely as they try, or once the evidence has faded towards the engine's
            upper = doubt or probe and batch > 1  # under load a try is judged one sd up too (module docstring)
            self._best, self._stale, self._priced_at = self.best_is_speculate(upper), 0, self.correction
        if probe:
            self.backoff.record(still_ar=not self._best)
        elif drafted and self._best:
            self.backoff.record(still_ar=False)  # drafting is on: a later turn to AR starts the waits afresh
        if new_text and pool is not None:
            pool.new_text_tried(found=self.pool is None or self._best)
        self.stale_rows = 0 if drafted else self.stale_rows + committed
        self._held = 0 if drafted else self._held
        self._since_other = 0 if drafted != self._best else self._since_other + 1

    def _clear_win(self, probe: bool, doubt: bool) -> bool:
        """A drafted round need not re-price while the priced win, scaled by how much the typical masses
        (correction included) shrank since, still wins, for fewer than probe_every rounds."""
        if probe or not self._best or self._rates is None or self._stale >= self.probe_every or not self._mass:
            return False
        return self._rates[0] * self.typical_masses(doubt).sum() / self._mass >= self._rates[1]

    @property
    def trying(self) -> bool:
        """Whether a drafted round now is a try from AR: its tree is sized at the drafter's own forecast
        (shrunk by acceptance learned on random words, a try's tree fell to one node or none)."""
        return not self._best

    @property
    def correction(self) -> float:
        """Realized / predicted accepted tokens (faded, `memory`), shrunk by `prior_tokens` to the pool's ratio."""
        prior = 1.0 if self.pool is None else self.pool.ratio()
        return (self.realized + self.prior_tokens * prior) / (self.predicted + self.prior_tokens)

    def speculate_tokens(self) -> float:
        """Forecast committed tokens of a drafted round, corrected by this request's realized rate."""
        return 1.0 + (self.speculate.tokens - 1.0) * self.correction

    @property
    def doubted(self) -> float:
        """The correction DOUBT posterior sds up: accepted tokens Poisson with a Gamma prior of `prior_tokens`
        pseudo-tokens at the pool's ratio, so sd = sqrt(correction / (predicted + prior_tokens))."""
        return self.correction + DOUBT * (self.correction / (self.predicted + self.prior_tokens)) ** 0.5

    def best_is_speculate(self, doubt: bool = False) -> bool:
        """The arm with the higher tokens/ms: priced by `costs` where given, else measured
        (speculate until AR is measured). doubt: drafting now, it turns to AR only where it loses
        at the `doubted` correction (not by the noise of a few rounds)."""
        if self.costs is not None and self.masses is not None:  # the width rule's best tree vs AR, at this batch
            typical = self.typical_masses(doubt)
            self._mass = float(typical.sum())
            pooled = np.repeat(typical, self.batch)  # every request of the round drafting like this one
            self._rates = (self.costs.best_rate(pooled, self.batch), self.costs.ar_rate(self.batch))
            return self._rates[0] >= self._rates[1]
        if self.costs is not None and self.packed is not None:
            return self.costs.draft_pays(self.speculate_tokens(), self.packed, self.batch)
        if self.autoregressive.rounds == 0:
            return True
        spec, ar = self.speculate, self.autoregressive  # ar.ms > 0 once AR has run
        return spec.ms > 0 and self.speculate_tokens() / spec.ms >= ar.tokens / ar.ms

    def inherit(self, other: EngineEvidence) -> None:
        """Start from the engine's pooled evidence: its typical masses; its realized / predicted
        acceptance is this request's prior from now on (`correction`). Under load this request
        then decides from the table at once instead of paying a drafted first round."""
        self.pool = other
        if other.masses is None:
            return
        self.masses, self.packed, self.inherited = other.masses.copy(), other.packed, True
        # the engine's tries, up to `settled`: priced far below AR a new text waits the longest, on a close
        # call it tries within every << settled rounds (MT-Bench, B = 1: misses parked it for 48 tokens)
        self.backoff.confirmed = min(other.confirmed, self.backoff.settled)
        self._best, self._stale = self.best_is_speculate(), 0  # priced on these masses at once

    def typical_masses(self, doubt: bool = False) -> np.ndarray | None:
        """This request's typical prefix masses, scaled by its realized / predicted acceptance (`doubted`)."""
        if self.masses is None:
            return None
        return np.minimum(self.masses * (self.doubted if doubt else self.correction), 1.0)

    def draft_next(self) -> bool:
        """Whether the next round drafts."""
        costs = self.costs
        if costs is not None and self.masses is not None and (
                self.batch > 1 or self.inherited or self.speculate.rounds >= self.min_drafted):
            if self.speculate.rounds + self.autoregressive.rounds == 0:  # inherited masses, no record yet
                self._best, self._stale = self.best_is_speculate(), 0
            if self.batch > 1:  # under load the table decides (`LoadProbe` probes for the batch)
                return self._best and self._switch_pays()
        elif self.speculate.rounds == 0 or (costs is not None and self.speculate.rounds < self.min_drafted):
            return True  # no evidence at all: learn this request's masses
        elif self.autoregressive.rounds == 0 and costs is None:  # measure the AR arm once
            return False
        if self._best:  # drafting wins: AR is re-measured every probe_every rounds (with the table: when
            if self._since_other > 0:  # its ell(1) cell needs a reading; an AR round in a run that pays costs ~R-1 tokens)
                priced = costs is not None and self.masses is not None
                return self._since_other < self.probe_every or (priced and not costs.needs_reading(1, self.batch))
            if self._switch_pays():
                return True
            # the priced gain (on another request's masses, maybe) cannot repay the one-off pass: try as
            # an AR-playing gate would, so this request learns its own masses
            self._held += 1
            return self._held > self.probe_wait() and self._probe_pays()
        if self.inherited and self.rounds == (0, 0):  # a new text on another's AR evidence: one try at once
            return self._new_text_try_pays()
        return self._since_other >= self.probe_wait() and self._probe_pays()

    def _new_text_try_pays(self) -> bool:
        """A new request alone inherits the engine's evidence, but its text is new: it tries drafting in its
        first round where that costs at most PROBE_SHARE of its AR rounds left, and the engine's new-text
        tries are due (`EngineEvidence.new_text_due`: ever fewer arrivals try while such tries find AR)."""
        if self.horizon is None:
            return False
        drafted_ms, ar_ms = self._ms()
        cheap = try_cost_rounds(ar_ms, drafted_ms, self.once_ms) <= PROBE_SHARE * self.horizon
        return cheap and self._probe_pays() and (self.pool is None or self.pool.new_text_due())

    def probe_wait(self) -> int:
        """AR rounds between tries of drafting (`ProbeBackoff`: longer after each try that confirmed AR)."""
        priced = None if self._rates is None else self._rates[0] / self._rates[1]
        drafted_ms, ar_ms = self._ms()
        return self.backoff.interval(priced, try_cost_rounds(ar_ms, drafted_ms, self.once_ms))

    @property
    def once_ms(self) -> float:
        """One-off ms the next drafted round adds: the drafter's context pass over `stale_rows`."""
        return self.stale_rows * self.context_row_ms

    def _ms(self) -> tuple[float, float]:
        """(drafted, AR) round ms for this request: the table's where given, else the arms' EWMAs."""
        if self.costs is not None:
            packed = self.packed or 2
            return self.costs.round_ms(packed, self.batch), self.costs.round_ms(1, self.batch, drafted=False)
        return self.speculate.ms, self.autoregressive.ms

    def _probe_pays(self) -> bool:
        """A try costs a drafted round over an AR round plus the one-off context pass; it is worth
        it only if drafting, were it to win PROBE_GAIN of the AR time left, would win that back."""
        if self.horizon is None:
            return True
        drafted_ms, ar_ms = self._ms()
        return try_pays(self.horizon, ar_ms, drafted_ms, self.once_ms)

    def _switch_pays(self) -> bool:
        """Turning drafting on from AR: the priced gain over the tokens left must cover the one-off pass.
        Under load every request of the batch pays its own pass and saves the ms per batch token
        over its `horizon` rounds of B tokens, so per request: horizon x (1/ar - 1/drafted)."""
        if self.horizon is None or self.once_ms <= 0 or self._rates is None:
            return True
        drafted, ar = self._rates  # tokens/ms of the round's batch
        return self.horizon * (1.0 / ar - 1.0 / drafted) >= self.once_ms

    @property
    def rounds(self) -> tuple[int, int]:
        """(drafted rounds, AR rounds) so far."""
        return self.speculate.rounds, self.autoregressive.rounds
