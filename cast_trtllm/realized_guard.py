"""`RealizedGuard`: under load, drafting stops where its rounds, as measured, commit slower than AR.

The gates and the load probe decide by forecast: a table's round ms and the drafter's calibrated
masses, corrected by acceptance so far. A forecast can be wrong in ways no correction sees in
time: a batch accepting less than the evidence it was priced on (c = 16 all at once, 2-core CPU, one
report run: a drafted round of 16 committed 1.63 tokens a request in 115 ms, where AR committed 1 in
47 ms, while the gates priced drafting above AR for 36% of the rounds).
This guard closes the loop on what the rounds did:

- every AR round under load tells it how far the table's AR price is from the wall clock
  (`fit`: an EWMA of measured / priced ms, so host work and the table's own errors count);
- every round the gates chose to draft under load (not the load probe's tries: their cost is
  the probe's, bounded by `cast_trtllm.probe_backoff.PROBE_SHARE`) is compared with the AR
  rounds that would have committed the same tokens (at the fitted AR price of that batch);
- where the last `window` drafted rounds took longer than AR for their tokens, by more than `tolerance` of
  AR's ms and `doubt` robust standard errors of that sum (or from `early` rounds on, `clear` times as long: the c = 16
  rounds above took 1.6x), drafting is vetoed
  (`vetoed`): no gate drafts under load for `hold` rounds (doubling with each veto in a row:
  the probe's tries, priced by the same forecast, would re-open it at once; the probe tries nothing
  while it holds: such a try could not lift it and would only back the probe off), then until a try of
  the whole batch confirms drafting (`lift`), or until every request it was measured on has left
  (`expire`: a veto held over from a c = 16 batch kept the next c = 4 batch, where drafting wins
  1.2x, on AR for its first 8 rounds). A full window that does not veto ends the run of vetoes.
  Without a veto, the window's rounds are dropped too once none of their requests is live: they measured
  other texts (c = 4 continuous, runs back to back: rounds read on GSM8K answers, with 3 of a new batch's
  first 4 rounds, vetoed synthetic prompts where cast:3 won 1.09x AR).

Why the standard error: a veto holds the batch on AR for 16 rounds or more, so a window that lost by
chance costs what drafting wins. At c = 4 continuous (synthetic + GSM8K, 48 tokens, 2-core CPU), where
cast:3 wins 1.16x AR, windows vetoed at losses of 0-2% (e.g. 1116 ms against 1115 ms of AR, two stalled
rounds in it) in 3 of 10 runs, each then drafting 61-81% of rounds; a window's per-round differences
(the tokens of a round swing 1-3x) put its sum's error near 30 ms. The error is read from the median
absolute deviation so that a stalled round (1.9-3.4x its neighbours) does not widen it: with the sd
instead, 16 requests at once on text where no width pays drafted 17% of rounds and lost 5% to AR.
Why two of them: the window slides, so it is judged every drafted round, and a loss past one standard
error turns up by chance in almost every run (c = 4 continuous, 2-core CPU, where cast:3 won 1.06x AR:
vetoes in 7 of 8 runs, six of them at 1.0-1.2 errors, losses of 5-8% against an AR price read in other
rounds). A loss the gates priced badly wrong is the `clear` rule's, from `early` rounds on.

Why the tolerance: the AR side of the comparison is a price (the table's cell x `fit`, read on AR rounds that
are rare while drafting wins, often minutes earlier), and its error is shared by every round of the window, so
no number of rounds averages it away. Issue 40's bar counts auto at 0.98x AR as level; a veto for a smaller
loss holds the batch on AR for 16 rounds or more where widths pay. (c = 4, synthetic + GSM8K, 48 tokens, 2-core
CPU, 8 repeats a cell: with no tolerance auto drafted 64-98% of request-rounds a run, late arrivals parked on AR
by a veto while their gates priced drafting at 1.2-1.5x AR, and read 0.979 of cast:3 paired by repeat all at once
and 0.963 continuous; with 2%, two runs: all at once 96-98% drafted in every run, 0.995 and 1.015; continuous 0.986
and 0.970, still drafting 10-97% a run in the second, for a reason this guard does not hold: the README's c = 4
paragraph.)

Alone (batch 1) a request's own gate prices its arms, so the guard reads batches > 1 only.
Pure Python; the engine calls `observe` and `expire` after each round, `lift` after a probe of all.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median

from cast_trtllm.engine_evidence import all_left


@dataclass(slots=True)
class RealizedGuard:
    # drafted rounds read before a verdict (its span): a round's tokens swing 1-3x (c = 4, GSM8K, 2-core
    # CPU: 4 to 12 tokens a round of 4 where drafting won 1.15x overall); 4 rounds vetoed there twice a
    # run, 12 rounds (or 4 at 1.25x) in two runs of three
    window: int = 16
    early: int = 6  # from this many drafted rounds, a clear loss vetoes before the window is full
    clear: float = 1.4  # a clear loss: the rounds took this many times AR's ms for their tokens
    doubt: float = 2.0  # a full window vetoes where its loss exceeds this many (robust) standard errors
    # ... and `tolerance` of its AR ms: a loss the bar of issue 40 counts as level with AR (0.98x) is no loss
    tolerance: float = 0.02
    alpha: float = 0.2  # EWMA weight of the newest AR round in `fit`
    fit: float = 0.0  # measured / table-priced ms of AR rounds (0: none read yet)
    hold: int = 16  # rounds under load a first veto holds before a probe may lift it (doubling in a row)
    vetoed: bool = False
    vetoes: int = 0  # vetoes in a row (no full window of drafted rounds read without one since)
    _held: int = 0  # rounds under load since the veto
    _holders: tuple = ()  # the requests of the round that vetoed: the verdict is about their texts
    _rounds: deque = field(init=False)  # (wall ms, AR ms for the same tokens, requests) of recent drafted rounds

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"RealizedGuard.window must be >= 1 drafted round, got {self.window}")
        if (not 1 <= self.early <= self.window or self.clear < 1 or self.hold < 0 or self.doubt < 0
                or self.tolerance < 0):
            raise ValueError(f"RealizedGuard: early must be in [1, window], clear >= 1, hold >= 0, doubt >= 0 and "
                             f"tolerance >= 0, got early {self.early}, clear {self.clear}, hold {self.hold}, doubt "
                             f"{self.doubt}, tolerance {self.tolerance}")
        if not 0 < self.alpha <= 1:
            raise ValueError(f"RealizedGuard.alpha must be in (0, 1], got {self.alpha}")
        self._rounds = deque(maxlen=self.window)

    def observe(self, drafted: bool, batch: int, committed: int, wall_ms: float, ar_priced_ms: float,
                members: tuple = ()) -> bool:
        """One finished round of `batch` decoding requests (`members`, any objects) that committed
        `committed` tokens in `wall_ms`; ar_priced_ms: the cost table's price of an AR round of that batch.
        Returns True where this round vetoed drafting (the window's drafted rounds took longer than AR
        for their tokens)."""
        if batch < 1 or committed < batch or not wall_ms > 0 or not ar_priced_ms > 0:
            raise ValueError(f"a round of {batch} requests commits >= {batch} tokens in > 0 ms against an AR "
                             f"price > 0 ms, got {committed} tokens, {wall_ms} ms, AR {ar_priced_ms} ms")
        if batch == 1:
            return False
        self._held += self.vetoed
        if not drafted:
            reading = wall_ms / ar_priced_ms
            self.fit = reading if self.fit == 0.0 else self.fit + self.alpha * (reading - self.fit)
            return False
        if self.fit == 0.0 or self.vetoed:
            return False  # no AR round read yet to compare with (or already vetoed: a probe's round)
        self._rounds.append((wall_ms, committed / batch * ar_priced_ms * self.fit, tuple(members)))
        if len(self._rounds) < self.early:
            return False
        spent, ar = self._sums()
        full = len(self._rounds) == self.window
        self.vetoed = spent > (ar * (1 + self.tolerance) + self.doubt * self._error() if full else self.clear * ar)
        if self.vetoed:
            self._rounds.clear()
            self._holders, self._held, self.vetoes = tuple(members), 0, self.vetoes + 1
        elif len(self._rounds) == self.window:
            self.vetoes = 0  # drafting measured paying over a whole window
        return self.vetoed

    def _error(self) -> float:
        """A robust standard error of the window's summed loss (drafted ms - AR ms, round by round): the
        median absolute deviation scaled to a normal sd (a stalled round must not widen it), x sqrt(n)."""
        loss = [w - a for w, a, _ in self._rounds]
        mid = median(loss)
        return 1.4826 * median(abs(x - mid) for x in loss) * len(loss) ** 0.5

    def expire(self, live) -> None:
        """Lift a veto once none of the requests it was measured on is `live` (a new batch, new texts);
        without one, drop the window's rounds once none of their requests is live."""
        if self.vetoed and all_left(self._holders, live):
            self.vetoes = 0
            self._end()
        elif not self.vetoed:
            read = [m for *_, ms in self._rounds for m in ms]
            if read and all_left(read, live):
                self._rounds.clear()

    def lift(self) -> bool:
        """A try of the whole batch confirmed drafting: the veto ends once it has held `hold` << (vetoes
        in a row - 1) rounds under load (drafted rounds are then read afresh). Returns whether it ended."""
        if self.holding:
            return False
        self._end()
        return True

    @property
    def holding(self) -> bool:
        """A veto no try may lift yet: it has held fewer than hold << (vetoes in a row - 1) rounds under load."""
        return self.vetoed and self._held < self.hold << max(self.vetoes - 1, 0)

    def _end(self) -> None:
        self.vetoed, self._holders = False, ()
        self._rounds.clear()

    @property
    def ratio(self) -> float | None:
        """AR ms over drafted ms for the same tokens, over the drafted rounds read (None: none yet)."""
        if not self._rounds:
            return None
        spent, ar = self._sums()
        return ar / spent

    def _sums(self) -> tuple[float, float]:
        """(drafted ms, AR ms for the same tokens) summed over the window's rounds."""
        return sum(r[0] for r in self._rounds), sum(r[1] for r in self._rounds)
