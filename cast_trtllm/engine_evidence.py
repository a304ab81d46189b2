"""`EngineEvidence`: what the engine's drafted auto rounds said lately, pooled over requests.

A new auto request starts from it (`DraftGate.inherit`) instead of paying drafted warm-up
rounds of its own: the typical prefix masses, the realized / predicted acceptance and the
backoff level of its tries. Pooled, not one request's: handing over the last drafting
request's gate let one lucky try decide for every arrival after it (a probe at c = 8 reset
one gate's evidence on a 2-token accept; each later arrival inherited it and drafted at
R = 1.18, cast:auto 0.89x AR against 0.98x without it). Acceptance sums decay by `decay`
per drafted request-round (about the last 50), and the masses are averaged over the same window: their
mean until 1 / (1 - decay) rounds are in, then an EWMA of weight 1 - decay. One request-round's mass sum
moves 0.6-6.4 about a mean of ~2.5 (c = 4, synthetic + GSM8K, 2-core CPU); with the old weight of 0.2 the
pool held the last ~5 request-rounds, so each new batch was priced on the previous batch's last uncapped
rounds (sum 1.77, 0.98x AR, where the batch's own rounds priced 1.2-1.3x and cast:3 won 1.16x) and screened
before drafting. Pure numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NEW_TEXT_EVERY = 8  # at most this many arrivals between new-text tries (`EngineEvidence.new_text_due`)


def all_left(members, live) -> bool:
    """Whether none of `members` (requests, any objects) is `live`, by identity: evidence read on them
    speaks for their texts only (`LoadProbe.expire`, `RealizedGuard.expire`). The callers hold the
    members, so their ids are not reused."""
    alive = {id(x) for x in live}
    return not any(id(m) in alive for m in members)


def blend(old: np.ndarray | None, new: np.ndarray, alpha: float) -> np.ndarray:
    """EWMA of descending mass vectors (zero-padded to the longer): it stays descending."""
    new = np.asarray(new, dtype=np.float64)
    if old is None:
        return new.copy()
    n = max(len(old), len(new))
    a, b = np.zeros(n), np.zeros(n)  # both zero-padded to n (np.pad took ~40 us a call)
    a[:len(old)], b[:len(new)] = old, new
    return a + alpha * (b - a)


@dataclass(slots=True)
class EngineEvidence:
    decay: float = 0.98  # acceptance sums shrink by this per drafted request-round; masses weigh 1 - decay
    masses: np.ndarray | None = None  # drafted rounds' sorted prefix masses: the window's mean (`add`; None: none yet)
    packed: int | None = None  # packed tokens of the last drafted round
    realized: float = 0.0  # decayed accepted (non-root) tokens
    predicted: float = 0.0  # their decayed forecast
    confirmed: int = 0  # tries in a row that confirmed AR, as the last drafted request's backoff counts them
    new_text_misses: int = 0  # new requests' first-round tries in a row that found AR (`new_text_due`)
    arrivals: int = 0  # new requests since the last such try
    rounds: int = 0  # drafted request-rounds whose masses are in `masses`

    def __post_init__(self) -> None:
        if not 0 < self.decay <= 1:
            raise ValueError(f"EngineEvidence needs 0 < decay <= 1, got {self.decay}")

    def ratio(self, prior_tokens: float = 1.0) -> float:
        """Realized / predicted accepted tokens, shrunk to 1 by `prior_tokens` (1 with nothing drafted)."""
        return (self.realized + prior_tokens) / (self.predicted + prior_tokens)

    def add(self, committed: int, expected: float, masses: np.ndarray | None, packed: int, confirmed: int) -> None:
        """One drafted auto round of one request: committed tokens, its forecast committed length,
        its sorted prefix masses (None: not the text's, a tree capped near max_tokens) and packed
        tokens, and that request's backoff level after it."""
        if committed < 1 or expected < 1:
            raise ValueError(f"a drafted round commits >= 1 token and forecasts >= 1, got {committed}, {expected}")
        self.realized = self.decay * self.realized + committed - 1
        self.predicted = self.decay * self.predicted + expected - 1
        if masses is not None:  # their mean over the window the acceptance sums cover (module docstring)
            self.rounds += 1
            weight = max(1.0 - self.decay, 1.0 / self.rounds)
            self.masses, self.packed = blend(self.masses, masses, weight), packed
        self.confirmed = confirmed

    def new_text_due(self) -> bool:
        """Whether a new request alone whose inherited evidence says AR tries its new text at once: every
        arrival at first, then every 2nd, 4th, up to every NEW_TEXT_EVERY-th while such tries find AR. On
        text no width pays (24-token requests, T = 1, 2-core CPU) each try cost ~1.4 AR rounds of 24."""
        due = self.arrivals >= min(1 << self.new_text_misses, NEW_TEXT_EVERY) - 1
        self.arrivals = 0 if due else self.arrivals + 1
        return due

    def new_text_tried(self, found: bool) -> None:
        """A new request's first-round try found drafting paying (or its text changed), or AR."""
        self.new_text_misses = 0 if found else self.new_text_misses + 1
