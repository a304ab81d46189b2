"""`LoadProbe`: under load, the draft gates' other arm is tried for the whole batch at once.

Alone, each request's `DraftGate` probes the arm it is not playing every few rounds. In a
batch that is the wrong shape: one request's drafted probe costs the whole round a draft
pass and a verify padded to its tree (embedded target, 16 requests on 2 cores: 110 ms
against 65 ms all-AR), and 16 requests probing at different rounds leave hardly a round
without one. So under load the gates play the cost table's choice, and this probe,
owned by the engine, decides when every gated request drafts together:

- after `every` AR rounds, an interval that doubles with each probe that confirms AR
  (up to `every << max_backoff`) and resets when a probe turns the batch to drafting;
- while the table prices drafting below `margin` of AR for the batch (pooled typical
  masses of the gated requests), only at the longest interval: a far-off arm rarely
  wins, but the text may turn predictable.
The same schedule as a request's own gate alone (`cast_trtllm.probe_backoff`), floor included:
a probe costs at most `PROBE_SHARE` of the AR time between probes.

A probe starts as a screen: only `screen` of the gated requests (at least SCREEN_MIN where that leaves
one out; the engine takes those whose context pass is cheapest) draft, and verify one node each: the cheapest tree that still
reads acceptance (the pass pads every request to the widest pack: 2 of 16 requests with 3 nodes cost
73 ms, with 1 node 54 ms, against 37 ms for AR). Only where their fresh masses, as if the whole batch
drafted like them, price drafting at or above AR does the next round try every gated request
(`screened`), for `span` rounds (`tried`) before the gates' choices are read. Trying all 26 of a c = 32
batch at once cost 350 ms over a 70 ms AR round (a context pass over ~2,000 prompt rows and a draft
pass for 26, 2-core CPU), 3% of a 48-token run, on text where drafting never paid; a screen of 4 costs
a sixth of it.

Between probes, `settle` checks the gates' own choices as the round will run them (the few's
nodes widen only their own packs, and the pass pads every request of the batch to the widest): each
gate prices drafting as if the whole batch drafted like it, but when only a few draft (a request
whose try found its text predictable, gates that priced at an older, smaller batch) those few
gain their few tokens for a whole draft pass and a wider verify (one request drafting in 16 on
2 cores: 93 ms against a 48 ms AR round, for about one more token). Their pooled masses are
priced at the round's batch with the draft pass of just them; where that loses to AR, none draft.
Gates playing AR join a round that drafts where their best nodes pay for the draft pass grown to them.
A probe that confirmed AR speaks for the texts it was taken on: once none of the requests live at it
is left (`expire`), the backoff drops to `ProbeBackoff.settled` tries, as a new request's gate inherits
the engine's (a far-off price still waits the longest; a close call waits every << settled rounds).
(c = 4 continuous, 2-core CPU, runs back to back: a backoff of 32 rounds learned on GSM8K answers held
the next batch of synthetic prompts, where cast:3 won 1.04x AR, on AR for its whole run.) The new texts'
price is still the old texts' evidence, so a turnover is first looked at afresh: the backoff starts at no
tries and the screen comes after `every` rounds, whatever the price; a look that confirms AR puts the backoff
back at `settled`, and looks come on ever fewer turnovers (every 2nd, 4th, up to every FRESH_EVERY-th) while
they find AR. (Same runs: the synthetic batch after GSM8K answers, priced below `margin` on the answers'
acceptance, played AR for its first 5-20 of ~20 rounds, auto 0.96-0.98x of cast:3 over 12 runs.)
Pure numpy; the engine calls `settle` and `tick` (then `ready`, the pricing, only once the wait is
over) before a round, `tried`, `confirmed` and `expire` after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from cast_trtllm.engine_evidence import all_left
from cast_trtllm.probe_backoff import PROBE_GAIN, ProbeBackoff, try_cost_rounds, try_pays

if TYPE_CHECKING:
    from cast_trtllm.cost_model import OnlineCostModel


PROBE_PACKED = 4  # tokens per request a probe round is priced at (a small tree)
SCREEN = 0.125  # the share of the gated requests a probe first tries (at least SCREEN_MIN)
# a screen of one request is one node's Bernoulli trial: c = 4 continuous, 2-core CPU, a new batch's screen
# node (priced ~0.5-0.9) was rejected, the screen confirmed AR and all 4 played AR for 15 rounds where cast:3
# won. A second screened request costs 2.4 ms more draft pass (9.6 against 7.2 ms) over a 33 ms AR round.
SCREEN_MIN = 2
FRESH_EVERY = 8  # at most this many turnovers of the batch's texts between fresh looks (`LoadProbe.expire`)


@dataclass(slots=True)
class LoadProbe:
    costs: OnlineCostModel
    every: int = 4  # AR rounds before the first probe
    max_backoff: int = 5  # the interval grows to every << max_backoff
    # probe only while drafting is priced at >= margin x AR's tokens/ms. At 0.8 a 2-core CPU at c = 16
    # probed while drafting could not pay, and cast:auto gave 0.88x AR against 0.96x with no probe
    # (3 rotated runs each); at 0.9 with max_backoff 5 it probed no more there (perf/results/README.md)
    margin: float = 0.9
    screen: float = SCREEN
    # rounds a try of every gated request runs before it is judged: an answer's first blocks accept less than
    # its text will (`DraftGate.min_drafted`). c = 4 continuous, 2-core CPU: a try of all in the answers' 2nd
    # round read corrections 0.56-0.78 where the pool read 0.89, confirmed AR, and the batch waited 128 rounds
    # on AR for the rest of its run (auto 87.0 tok/s, cast:3 95.2)
    span: int = 4
    _tried: int = field(default=0, init=False)  # rounds of the running try of all
    _since: int = field(default=0, init=False)  # rounds since the last probe
    _backoff: ProbeBackoff = field(init=False)
    _wait: int | None = field(default=None, init=False)  # this wait's length (rounds since the last probe), as priced
    _next: int = field(default=0, init=False)  # the round (since the last probe) `ready` prices the wait again
    _full: bool = field(default=False, init=False)  # a screen looked promising: the next probe tries every request
    screening: bool = field(default=False, init=False)  # the probe `trying` sized is a screen
    _texts: tuple = field(default=(), init=False)  # the requests live at the last probe that confirmed AR
    _looking: bool = field(default=False, init=False)  # the next verdict is a fresh look's, at new texts
    _misses: int = field(default=0, init=False)  # fresh looks in a row that confirmed AR
    _turnovers: int = field(default=0, init=False)  # turnovers of the texts since the last fresh look

    def __post_init__(self) -> None:
        if not 0 < self.screen <= 1:
            raise ValueError(f"LoadProbe: screen is a share of the gated requests in (0, 1], got {self.screen}")
        if self.span < 1:
            raise ValueError(f"LoadProbe: a try of all runs span >= 1 rounds, got {self.span}")
        try:
            self._backoff = ProbeBackoff(self.every, self.max_backoff, self.margin)
        except ValueError as e:
            raise ValueError(f"LoadProbe: {e}") from None

    @property
    def interval(self) -> int:
        return self._backoff.interval()

    @property
    def lead(self) -> int:
        """Rounds the next probe spends before the batch could draft on what it finds: a screen, then a
        try of all; a try of all alone. Its gain can only come in the rounds after them: a screen 4 tokens
        before a c = 16 batch's end (2-core CPU) cost 54 ms, 2.4% of its run, and could win nothing."""
        return 2 if self.screening else 1

    @property
    def pending(self) -> bool:
        """A screen looked promising: the next round tries every gated request, also where some gates
        chose to draft on their own (the screened ones, their evidence restarted by what they accepted)."""
        return self._full

    def trying(self, gated: int) -> int:
        """How many of `gated` requests the next probe drafts: a screen of a few, or all of them
        once a screen looked promising (or where the screen would be all of them anyway)."""
        few = min(gated, max(1, math.ceil(gated * self.screen), min(SCREEN_MIN, gated - 1)))
        self.screening = not self._full and few < gated
        return few if self.screening else gated

    def due(self, masses: Sequence[np.ndarray], batch: int, once_ms: float = 0.0,
            horizon: float | None = None, trying: int | None = None, held: bool = False, new: bool = False) -> bool:
        """Called once per AR round under load: whether this round should draft for `trying` gated
        requests (None: the whole batch). `tick` counts the round, `ready` prices the probe."""
        return self.tick(held, new) and self.ready(masses, batch, once_ms, horizon, trying, new)

    def tick(self, held: bool = False, new: bool = False) -> bool:
        """Count an AR round under load towards the wait; -> whether a probe may be due this round (`ready`
        decides): the interval is over, and the wait as last priced or the interval since that pricing. The
        engine reads the gates' masses only then, so between probes a batch playing AR prices once an interval
        at most (issue 40). held: a veto of the realized guard is holding (`RealizedGuard.holding`); a try now
        could not lift it and would only back this probe off, so none is due (the round still counts towards
        the wait). (c = 4 continuous, 2-core CPU: a screen
        7 rounds into a 16-round hold, then a try of all 4, doubled the wait, and the batch played AR to its
        end, where cast:3 won 1.18x AR.) new: every gated request is new (no round of its own), `ready` may screen
        them at once."""
        self._since += 1
        return not held and (self._full or new or self._since >= max(self.interval, self._next))

    def ready(self, masses: Sequence[np.ndarray], batch: int, once_ms: float = 0.0,
              horizon: float | None = None, trying: int | None = None, new: bool = False) -> bool:
        """After a `tick` that allows it: whether the probe is due now (at the backoff's interval, at its
        longest while drafting is priced below `margin` of AR at `batch`, priced again every interval of a
        longer wait: a price read on a slow stretch of the machine must not hold the batch on AR for the whole
        longest wait (c = 4 continuous, 2-core CPU: a price of 0.76x AR, where cast:3 won 1.08x, held 128
        rounds, two runs, though the table read 0.96x from the next run on); at once after a promising screen),
        and only where it can pay back (`probe_backoff.try_pays`) in the rounds after its `lead`: once_ms, the
        drafter's context pass over the trying requests' rows since their last draft; horizon, the rounds the
        batch has left (None: unbounded). masses: every gated request's typical masses. new: every gated
        request is new, its price the engine's pooled evidence from other texts: at a close call (>= `margin`)
        the probe is due at once, not after the wait that keeps a probe's cost a PROBE_SHARE of the AR time
        between probes (c = 4 all at once, 2-core CPU, after B = 1 cells: each new batch priced at 0.94-0.99x AR
        on the pool's masses waited 6-7 of its ~19 rounds on AR for that floor, then drafted at 1.3-1.5x; auto
        drafted 41-65% of rounds in 9 of 15 runs where cast:3 won 1.20x AR)."""
        if not masses:
            return False
        ar_ms, probe_ms = self.costs.round_ms(1, batch, drafted=False), self._probe_ms(batch, trying)
        if self._full:
            self._wait = 0
        elif new or self._wait is None or self._since >= self._next:  # priced again each interval: the table moves
            priced = self.costs.best_rate(_pooled(masses), batch) / self.costs.ar_rate(batch)
            close = new and priced >= self.margin
            self._wait = 0 if close else self._backoff.interval(priced, try_cost_rounds(ar_ms, probe_ms, once_ms))
        if self._since < self._wait:
            self._next = min(self._wait, self._since + self.interval)
            return False
        if horizon is not None and not try_pays(horizon - self.lead, ar_ms, probe_ms, once_ms):
            return False  # the batch is about to finish or its context pass is dear: checked again next round
        self._since, self._wait, self._next = 0, None, 0
        return True

    def settle(self, wants: Sequence[np.ndarray], others: Sequence[np.ndarray], batch: int) -> tuple[bool, bool]:
        """(whether the gated requests whose gates chose to draft should, whether gated requests playing AR
        join them), priced once as the round runs: `wants`' pooled masses (one array each) spread over their
        own packs, the draft pass of just them, against an AR round of the batch; a round that drafts pads
        every request to its bucket, so each of `others` gains its best bucket - 1 nodes for only the draft
        pass grown to it, and they join where the round's tokens/ms rise and still beat AR. (c = 4
        continuous, 2-core CPU: one request priced at 0.96x AR sat out 17 of 50 rounds while three drafted;
        pricing the pooled round with it, as if its nodes took the others' slots, kept one request on AR for
        30 drafted rounds while it committed 1 token each: auto 0.82x of cast:3.)"""
        if not wants:
            return False, False
        n = min(len(wants), batch)
        alone, ar = self.costs.choose(_pooled(wants), batch, explore=False, drafting=n), self.costs.ar_rate(batch)
        if others:
            slots, beta = max(alone.bucket - 1, 0), self.costs.mass_exponent  # calibrated as the width rule reads
            gain = sum(float((np.asarray(m, np.float64)[:slots] ** beta).sum()) for m in others)  # each descending
            ms = self.costs.round_ms(alone.bucket, batch, drafted=False) + self.costs.draft_ms(n)
            extra = max(self.costs.draft_ms(min(n + len(others), batch)) - self.costs.draft_ms(n), 0.0)
            together = (alone.predicted_tokens_per_ms * ms + gain) / (ms + extra)  # the round's tokens/ms with them
            if gain > 0 and together >= max(alone.predicted_tokens_per_ms, ar):
                return True, True
        return alone.predicted_tokens_per_ms >= ar, False

    def _probe_ms(self, batch: int, trying: int | None) -> float:
        """A probe round's ms: a screen drafts for `trying` of `batch` requests and verifies one node each
        (the pass pads every request to 2 tokens); a probe of all (None, or `trying` == batch) packs
        PROBE_PACKED each. Both pay the draft pass of those trying."""
        trying = batch if trying is None else min(trying, batch)
        packed = PROBE_PACKED if trying == batch else 2
        return self.costs.round_ms(packed, batch, drafted=False) + self.costs.draft_ms(trying)

    def screened(self, tried: Sequence[np.ndarray], batch: int, once_ms: float = 0.0,
                 horizon: float | None = None, live: Sequence = ()) -> bool:
        """After a screen: the screened requests' fresh typical masses, as if every request of the
        batch drafted like them, priced against AR. Promising, and the gain so priced over the `horizon`
        rounds left after that probe's own round (None: unbounded) repays the try's cost: the next probe
        tries them all (True); else the screen confirmed AR (back off). live: the batch's requests (`expire`).
        The try's rounds draft the table's best trees for those masses, so at the priced rate (at or above
        AR) they commit at least AR's tokens for their ms: what the gain must repay is `once_ms`, the
        context pass of every gated request.
        (c = 4 continuous, 2-core CPU: pricing the try's 4 rounds as pure cost over AR, ~4 x 60 ms, turned
        down screens priced at 1.4x AR; the new arrivals, on the pool's pessimistic price, played AR to the
        end where cast:3 won; auto 0.963-0.970x of cast:3, 8 paired runs.)"""
        if tried:
            like = [tried[i % len(tried)] for i in range(batch)]
            rate, ar_rate = self.costs.best_rate(_pooled(like), batch), self.costs.ar_rate(batch)
            ar_ms = self.costs.round_ms(1, batch, drafted=False)
            self._full = rate >= ar_rate and (horizon is None or try_pays(  # the try's rounds: no cost over AR
                horizon - 1, ar_ms, ar_ms, once_ms, gain=min(PROBE_GAIN, 1 - ar_rate / rate)))
        if not self._full:
            self.confirmed(still_ar=True, live=live)
        return self._full

    def tried(self) -> bool:
        """After a round of a try of all: whether it goes on next round (it runs `span` rounds before the
        gates' choices are judged, `confirmed`)."""
        self._tried += 1
        self._full = self._tried < self.span
        return self._full

    def confirmed(self, still_ar: bool, live: Sequence = ()) -> None:
        """After a try of all (or a veto): AR still wins (back off) or the batch now
        drafts (reset). live: the requests of the batch, any objects (`expire`)."""
        self._full, self._tried = False, 0
        self._backoff.record(still_ar)
        self._texts = tuple(live) if still_ar else ()
        if self._looking:  # a fresh look at new texts: AR puts the backoff back where it stood (`expire`)
            self._looking, self._misses = False, self._misses + 1 if still_ar else 0
            if still_ar:
                self._backoff.confirmed = max(self._backoff.confirmed, self._backoff.settled)

    def expire(self, live: Sequence) -> None:
        """Once none of the requests live at the last probe that confirmed AR is `live` (new texts), the
        backoff drops to `settled` tries and the wait is priced afresh; on a turnover that is due a fresh
        look (every one at first, ever fewer while looks find AR), to no tries: a screen after `every` rounds."""
        if self._texts and all_left(self._texts, live):
            self._texts, self._wait, self._next = (), None, 0
            self._looking = self._turnovers >= min(1 << self._misses, FRESH_EVERY) - 1
            self._turnovers = 0 if self._looking else self._turnovers + 1
            self._backoff.confirmed = 0 if self._looking else min(self._backoff.confirmed, self._backoff.settled)


def _pooled(masses: Sequence[np.ndarray]) -> np.ndarray:
    """Several requests' descending masses as one descending array (the batch's best-first order)."""
    return np.sort(np.concatenate([np.asarray(m, np.float64) for m in masses]))[::-1]
