"""`ProbeBackoff`: how long a gate playing AR waits before it tries drafting again.

One rule for a request alone (`cast_trtllm.draft_gate.DraftGate`) and for a batch under
load (`cast_trtllm.load_probe.LoadProbe`):

- the first try comes after `every` AR rounds; each try that confirms AR doubles the wait,
  up to `every << max_backoff` rounds; a try that turns drafting on resets it;
- once `settled` tries in a row have confirmed AR while the cost table prices drafting
  below `margin` x AR's tokens/ms, the wait is the longest one at once: a far-off arm can
  hardly win, but text does change (random words turning to code), so it is still looked
  at, rarely. (Not before: the first drafted blocks after a prompt are the least certain,
  and one early reading must not park a head that pays.)
- whatever the schedule, tries cost at most `PROBE_SHARE` of the AR time between them: a
  try that costs `cost_rounds` AR rounds more than the AR round it replaces waits at least
  cost_rounds / PROBE_SHARE rounds. Alone on a 2-core CPU a try costs ~0.4 AR round, so the
  backoff's own waits (4, 8, ...) hold; 16 requests trying at once cost 3-5 AR rounds (a
  draft pass for 16 and a context pass over ~1,100 rows: 135-260 ms against 48 ms): two such
  tries in the first 25 rounds made cast:auto 0.73x AR there (issue 40); now they wait 25-50.
  At 0.05 the waits alone grew to 8-10 rounds, and on text where drafting barely pays (MATH-500,
  MT-Bench: cast:3 1.1x AR) a gate that turned to AR by chance came back too late (auto 0.92x
  of cast:3, 32-token outputs).

A try of drafting is a drafted round that commits ~1 token where AR would: on a 2-core CPU
with the embedded model it costs about one more AR round, plus the drafter's context pass
over every row committed since the last draft (a new request's whole prompt). At the longest
wait (128 rounds by default) that is < 1% of the AR rounds it sits between.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# the share of the AR time left that a try of drafting hopes to win: about what this engine's best
# widths gain over AR on a 2-core CPU (1.2-1.4x); a try that could not win back its own cost (a drafted
# round over an AR round, plus the drafter's context pass over the rows since the last draft) at that
# rate is skipped (requests about to finish). `DraftGate` and `LoadProbe` both read it.
PROBE_GAIN = 0.25
# tries of drafting from AR cost at most this share of the AR time between them (the wait's floor)
PROBE_SHARE = 0.1
# a try of drafting that accepts at least this share of the drafter's forecast, where the request's evidence
# made that improbable, says the text changed (random words turned to code): `text_changed`
PROMISING = 0.5
SURPRISE = 0.05  # ... improbable: at most this upper-tail probability under that evidence


def try_cost_rounds(ar_ms: float, drafted_ms: float, once_ms: float) -> float:
    """A try's cost over the AR round it replaces, in AR rounds."""
    return (max(drafted_ms - ar_ms, 0.0) + once_ms) / ar_ms if ar_ms > 0 else 0.0


def try_pays(horizon: float, ar_ms: float, drafted_ms: float, once_ms: float, gain: float = PROBE_GAIN) -> bool:
    """Whether a try of drafting can pay back: `gain` (a share of the AR time; PROBE_GAIN where the
    try's outcome is unknown) of `horizon` AR rounds of `ar_ms` covers the drafted round's extra ms and
    the one-off context pass `once_ms`."""
    return gain * horizon * ar_ms >= max(drafted_ms - ar_ms, 0.0) + once_ms


def text_changed(accepted: int, forecast: float, correction: float) -> bool:
    """Whether a try of drafting says the request's text changed, so its acceptance evidence restarts from the
    try (`DraftGate.record`): it accepted at least PROMISING of the drafter's `forecast` (accepted tokens), and at
    least that many had at most SURPRISE chance under the evidence it would discard (accepted tokens Poisson of
    mean `correction` x forecast). One token is not enough where chance gives one often: at T = 1 on AIPerf's
    Shakespeare words (c = 1, 2-core CPU) tries accepting 1 of a 0.6-1.7 forecast at a correction of 0.2 (a
    22-30% chance) or 2 of 1.9 at 0.34 (13%) restarted requests that then drafted 12-15 rounds for ~0.2
    tokens each (34 of 368 rounds in one run); a text turned to code accepts 2 or more at a correction near 0."""
    if not accepted >= PROMISING * forecast > 0:
        return False
    mean = max(correction, 0.0) * forecast
    term = below = math.exp(-mean)  # P(X = k) and P(X <= k) from k = 0
    for k in range(1, accepted):
        term *= mean / k
        below += term
    return 1.0 - below <= SURPRISE


@dataclass(slots=True)
class ProbeBackoff:
    every: int = 4  # AR rounds before the first try
    max_backoff: int = 5  # the wait grows to every << max_backoff
    margin: float = 0.9  # priced below margin x AR (and settled): wait the longest at once
    settled: int = 2  # tries in a row confirming AR before a far-off price waits the longest
    confirmed: int = 0  # tries in a row that confirmed AR

    def __post_init__(self) -> None:
        if self.every < 1 or self.max_backoff < 0 or not 0 < self.margin <= 1:
            raise ValueError(f"a probe backoff needs every >= 1, max_backoff >= 0 and 0 < margin <= 1; got "
                             f"{self.every}, {self.max_backoff}, {self.margin}")

    @property
    def longest(self) -> int:
        return self.every << self.max_backoff

    def interval(self, priced: float | None = None, cost_rounds: float = 0.0) -> int:
        """AR rounds to wait; priced: drafting's tokens/ms over AR's (None: not priced); cost_rounds:
        what the try costs over the AR round it replaces, in AR rounds (the wait's floor)."""
        floor = math.ceil(cost_rounds / PROBE_SHARE) if cost_rounds > 0 else 0
        if priced is not None and priced < self.margin and self.confirmed >= self.settled:
            return max(self.longest, floor)
        return max(self.every << min(self.confirmed, self.max_backoff), floor)

    def record(self, still_ar: bool) -> None:
        """After a try: AR still wins (wait longer) or drafting is on (reset)."""
        self.confirmed = self.confirmed + 1 if still_ar else 0
