"""Width policy: how many nodes N a round should pack, from the measured verify cost.

Terminology (paper §3.1, §3.3, App. B.3-B.4):
- packed count n = N + 1: tokens in one verify pass (pending root + N tree nodes).
- latency curve ell(n): measured verify-forward ms at packed count n (a width profile row).
- prefix masses rho_(1) >= rho_(2) >= ...: the sorted node masses of the candidate
  universe; g(N) = rho_(1) + ... + rho_(N) is the expected accepted length of the best
  budget-N tree, so a round commits 1 + g(N) tokens in expectation.
- throughput f(N) = (1 + g(N)) / ell(N) tokens/ms; batched: (G(M) + B) / ell(M, B) for a
  total budget M shared by B requests (the masses are then the pooled order statistics).
- bucket: a packed width compiled/captured ahead; a tree of N nodes pays the latency of
  the smallest bucket >= N + 1 (per request: >= (B + M) / B).

Everything here is pure numpy. The runtime calls `WidthPolicy.choose` once per round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:  # cast_trtllm.profile imports this module; no import cycle at run time
    from cast_trtllm.profile import WidthProfile

RULES = ("table", "marginal")


# ----------------------------------------------------------------------------------------
# Cost curve: affine fit, cliffs, buckets
# ----------------------------------------------------------------------------------------
def fit_affine(n: np.ndarray, ms: np.ndarray, lo: int, hi: int) -> tuple[float, float]:
    """Least-squares ell(n) ~= c0 + c1 * n over the measured n in [lo, hi] (paper §3.1).

    Returns (c0 intercept ms, c1 slope ms per packed token). c1 may come out negative on
    a flat, noisy curve (paper Table 6, 1k prefix); callers clamp it where a rule needs
    c1 >= 0.
    """
    n, ms = _as_curve(n, ms)
    keep = (n >= lo) & (n <= hi)
    if keep.sum() < 2:
        raise ValueError(f"fit range [{lo}, {hi}] holds {int(keep.sum())} measured packed "
                         f"counts of {n.tolist()}; an affine fit needs at least 2")
    c1, c0 = np.polyfit(n[keep].astype(np.float64), ms[keep], deg=1)
    return float(c0), float(c1)


def detect_cliffs(n: np.ndarray, ms: np.ndarray, rel_jump: float = 0.10,
                  min_n: int = 2, window: int = 4) -> list[int]:
    """Packed counts where the latency jumps far above the local slope (a kernel/tile cliff).

    The step n[i] -> n[i+1] is a cliff when the rise that PERSISTS (min of ms[i+1:], so a
    one-point transient such as the A100 n=32 cell of Table 5 does not count) exceeds what
    the affine fit over the up-to-`window` previous counts predicts by more than
    `rel_jump * ms[i]`. Returns the counts n[i+1] landed on (Blackwell/Qwen3-8B: [128]).
    Only counts >= min_n are compared: leaving n = 1 switches from decode to multi-token
    kernels, a cost every tree, even the plain chain, pays (paper App. D.1). A step needs
    two earlier counts >= min_n to estimate its local slope; earlier steps are not flagged.
    The slope used is never below the median step slope of the whole curve, so a noisy or
    non-monotone start (CPU n = 2 slower than n = 4) does not make an ordinary rise look
    like a cliff.
    """
    n, ms = _as_curve(n, ms)
    if rel_jump <= 0:
        raise ValueError(f"rel_jump must be > 0, got {rel_jump}")
    cliffs = []
    first = int(np.searchsorted(n, min_n))
    steps = np.diff(ms[first:]) / np.diff(n[first:]).astype(np.float64)
    trend = max(float(np.median(steps)), 0.0) if len(steps) else 0.0
    for i in range(first + 1, len(n) - 1):  # step i -> i+1 with >= 2 prior points
        lo = max(first, i + 1 - window)
        c1, _ = np.polyfit(n[lo:i + 1].astype(np.float64), ms[lo:i + 1], deg=1)
        expected = max(c1, trend) * (n[i + 1] - n[i])
        persistent_rise = ms[i + 1:].min() - ms[i]
        if persistent_rise - expected > rel_jump * ms[i]:
            cliffs.append(int(n[i + 1]))
    return cliffs


def choose_buckets(n: np.ndarray, ms: np.ndarray, max_buckets: int,
                   rel_jump: float = 0.10) -> list[int]:
    """Pick at most `max_buckets` measured packed counts to compile/capture ahead.

    Always kept: the widest measured count and the count just below every detected cliff
    (so a tree can stop short of it). The rest are added greedily, each time the count that
    most reduces the padding waste sum_i (ell(bucket(n_i)) - ell(n_i)) over measured n_i.
    """
    n, ms = _as_curve(n, ms)
    below_cliffs = [int(n[np.searchsorted(n, c) - 1]) for c in detect_cliffs(n, ms, rel_jump)]
    chosen = sorted(set(below_cliffs) | {int(n[-1])})
    if len(chosen) > max_buckets:
        raise ValueError(f"max_buckets={max_buckets} is too small: the widest count and the "
                         f"counts below cliffs need {len(chosen)} buckets ({chosen})")

    def waste(buckets: list[int]) -> float:
        b = np.array(sorted(buckets))
        return float((ms[np.searchsorted(n, b[np.searchsorted(b, n)])] - ms).sum())

    while len(chosen) < min(max_buckets, len(n)):
        options = [int(v) for v in n if v not in chosen]
        costs = [waste(chosen + [v]) for v in options]
        chosen = sorted(chosen + [options[int(np.argmin(costs))]])
    return chosen


# ----------------------------------------------------------------------------------------
# Width rules
# ----------------------------------------------------------------------------------------
def marginal_stopping_width(masses_desc: np.ndarray, ell0_ms: float, c1_ms: float,
                            n_min: int = 0, n_max: int | None = None) -> int:
    """Theorem 2: budget N* under the affine round time ell(N) = ell0 + c1 * N.

    From N = n_min, add node N+1 while rho_(N+1) >= (1 + g(N)) / ell(N) * c1 (the next
    node's mass pays at least the token-time exchange rate). Throughput is unimodal, so
    the first failure is a maximizer; n_max (default: all masses) is the other boundary.
    """
    return batched_stopping_width(masses_desc, 1, ell0_ms, c1_ms, n_min, n_max)


def batched_stopping_width(global_masses_desc: np.ndarray, batch: int, ell0_ms: float,
                           c1_ms: float, m_min: int = 0, m_max: int | None = None) -> int:
    """Proposition 3: total budget M* for B requests sharing one verify pass.

    `global_masses_desc` are the pooled order statistics of all B requests' universes
    (Proposition 2); ell(M, B) = ell0 + c1 * M. Add global node M+1 while
    rho_(M+1) >= (G(M) + B) / ell(M, B) * c1. B = 1 is Theorem 2.
    """
    rho = _as_masses(global_masses_desc)  # [U]
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if ell0_ms <= 0 or c1_ms < 0:
        raise ValueError(f"need ell0_ms > 0 and c1_ms >= 0 (Theorem 2), got "
                         f"ell0_ms={ell0_ms}, c1_ms={c1_ms}; clamp a negative fitted slope to 0")
    lo, hi = _budget_range(len(rho), m_min, m_max)
    committed = batch + np.concatenate([[0.0], np.cumsum(rho)])  # [U+1] G(M) + B
    m = np.arange(lo, hi)                                         # candidate M to grow from
    grow = rho[m] * (ell0_ms + c1_ms * m) >= committed[m] * c1_ms  # rho_(M+1) ell(M) >= (G+B) c1
    stops = np.flatnonzero(~grow)
    return int(m[stops[0]]) if len(stops) else hi


def table_rule_width(masses_desc: np.ndarray, buckets_n: np.ndarray, bucket_ms: np.ndarray,
                     fixed_ms: float = 0.0, n_min: int = 0, n_max: int | None = None,
                     batch: int = 1) -> tuple[int, int]:
    """Exact width over a measured bucket table: argmax_N (B + g(N)) / (fixed + ell(bucket(N))).

    A budget N pays the latency of the smallest bucket >= (B + N) / B packed tokens per
    request (B = 1: >= N + 1). No affine assumption, so a cliff is crossed only when the
    extra mass pays for it. Returns (N, bucket); ties go to the smaller N.
    """
    rho = _as_masses(masses_desc)  # [U]
    buckets, ms = _as_curve(buckets_n, bucket_ms)
    if fixed_ms < 0:
        raise ValueError(f"fixed_ms must be >= 0, got {fixed_ms}")
    capacity = batch * (int(buckets[-1]) - 1)
    lo, hi = _budget_range(min(len(rho), capacity), n_min, n_max)
    budgets = np.arange(lo, hi + 1)                                      # [C]
    slot = _bucket_slot(buckets, budgets, batch)                        # [C] bucket index
    committed = batch + np.concatenate([[0.0], np.cumsum(rho)])[budgets]
    best = int(np.argmax(committed / (fixed_ms + ms[slot])))
    return int(budgets[best]), int(buckets[slot[best]])


# ----------------------------------------------------------------------------------------
# Per-round policy
# ----------------------------------------------------------------------------------------
class WidthChoice(NamedTuple):
    budget: int                     # N (batch 1) or total M (batch B): nonroot nodes to pack
    bucket: int                     # packed width per request the verify is padded to
    predicted_tokens_per_ms: float  # (B + g) / (fixed + ell(bucket))


@dataclass(frozen=True, slots=True)
class WidthPolicy:
    """Per-round width from a bucket table (one prefix bucket of a width profile).

    `bucket_ms[b][j]` is the verify latency of `batch_sizes[b]` requests each packing
    `buckets[j]` tokens; `intercept_ms`/`slope_ms` the affine fit per batch (marginal
    rule); `fixed_ms` the per-batch drafter + overhead ms. Batches between measured sizes
    are interpolated linearly, beyond them clamped. Budgets are per request.
    """

    buckets: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    bucket_ms: tuple[tuple[float, ...], ...]  # [batch][bucket]
    intercept_ms: tuple[float, ...]           # [batch]
    slope_ms: tuple[float, ...]               # [batch], ms per packed token per request
    fixed_ms: tuple[float, ...]               # [batch]
    rule: str = "table"
    rank_cap: int = 8                         # K: tokens kept per drafted position
    min_budget: int = 0
    max_budget: int | None = None             # None: widest bucket - 1
    mass_exponent: float = 1.0                # calibration: a node's acceptance ~= rho ** exponent

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"WidthPolicy.rule must be one of {RULES}, got {self.rule!r}")
        for name in ("buckets", "batch_sizes"):
            values = getattr(self, name)
            if not values or values[0] < 1 or np.any(np.diff(values) <= 0):
                raise ValueError(f"WidthPolicy.{name} must be strictly ascending and >= 1, "
                                 f"got {values}")
        nb = len(self.batch_sizes)
        for name in ("bucket_ms", "intercept_ms", "slope_ms", "fixed_ms"):
            if len(getattr(self, name)) != nb:
                raise ValueError(f"WidthPolicy.{name}: expected {nb} rows (one per batch size)")
        table = np.asarray(self.bucket_ms, dtype=np.float64)
        if table.shape != (nb, len(self.buckets)) or not np.all(table > 0):
            raise ValueError(f"WidthPolicy.bucket_ms must be positive with shape "
                             f"({nb}, {len(self.buckets)}), got shape {table.shape}")
        if self.rank_cap < 1:
            raise ValueError(f"WidthPolicy.rank_cap must be >= 1, got {self.rank_cap}")
        if not self.mass_exponent > 0:
            raise ValueError(f"WidthPolicy.mass_exponent must be > 0, got {self.mass_exponent}")
        widest = self.buckets[-1] - 1
        if self.max_budget is None:
            object.__setattr__(self, "max_budget", widest)
        if not 0 <= self.min_budget <= self.max_budget <= widest:
            raise ValueError(f"need 0 <= min_budget <= max_budget <= widest bucket - 1 = "
                             f"{widest}, got {self.min_budget}, {self.max_budget}")

    @classmethod
    def from_profile(cls, profile: WidthProfile, prefix_len: int, rule: str = "table",
                     rank_cap: int = 8, min_budget: int = 0,
                     max_budget: int | None = None, mass_exponent: float = 1.0) -> WidthPolicy:
        """Bucket table of the profile's prefix bucket for `prefix_len`, all batch sizes."""
        prefix = profile.prefix_bucket(prefix_len)
        cols = [profile.packed_counts.index(b) for b in profile.buckets]
        batches = profile.batch_sizes
        return cls(
            buckets=profile.buckets, batch_sizes=batches,
            bucket_ms=tuple(tuple(profile.latency_ms[prefix][b][c] for c in cols) for b in batches),
            intercept_ms=tuple(profile.fits[prefix][b].intercept_ms for b in batches),
            slope_ms=tuple(profile.fits[prefix][b].slope_ms for b in batches),
            fixed_ms=tuple(profile.fixed_ms(b) for b in batches),
            rule=rule, rank_cap=rank_cap, min_budget=min_budget, max_budget=max_budget,
            mass_exponent=mass_exponent)

    def choose(self, masses_desc: np.ndarray, batch: int = 1) -> WidthChoice:
        """Budget for this round from the round's sorted prefix masses.

        masses_desc: [U] descending plug-in node masses (batch > 1: pooled over the B
        requests); they are calibrated here as rho ** mass_exponent (monotone, so the
        order and hence the tree are unchanged; only how far it pays to grow it).
        """
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        rho = _as_masses(masses_desc) ** self.mass_exponent

        def row(values) -> float:  # linear in batch size between measured sizes
            return float(np.interp(batch, self.batch_sizes, values))

        ms = np.array([row(col) for col in zip(*self.bucket_ms)])  # [buckets]
        fixed = row(self.fixed_ms)
        lo = min(batch * self.min_budget, len(rho))
        hi = min(batch * self.max_budget, len(rho))
        if self.rule == "table":
            budget, bucket = table_rule_width(rho, self.buckets, ms, fixed, lo, hi, batch)
        else:  # ell(M, B) = fixed + c0 + c1 * (B + M) / B per-request packed count
            c1 = max(row(self.slope_ms), 0.0)
            ell0 = fixed + row(self.intercept_ms) + c1
            budget = batched_stopping_width(rho, batch, ell0, c1 / batch, lo, hi)
            bucket = self.buckets[_bucket_slot(self.buckets, budget, batch)]
        cost = fixed + ms[self.buckets.index(bucket)]
        return WidthChoice(budget, bucket, float((batch + rho[:budget].sum()) / cost))


# ----------------------------------------------------------------------------------------
# Input checks
# ----------------------------------------------------------------------------------------
def _as_curve(n, ms) -> tuple[np.ndarray, np.ndarray]:
    n = np.asarray(n, dtype=np.int64)
    ms = np.asarray(ms, dtype=np.float64)
    if n.ndim != 1 or ms.shape != n.shape or len(n) == 0:
        raise ValueError(f"packed counts and latencies must be 1-D of equal, nonzero length, "
                         f"got {n.shape} and {ms.shape}")
    if n[0] < 1 or np.any(np.diff(n) <= 0):
        raise ValueError(f"packed counts must be strictly ascending and >= 1, got {n.tolist()}")
    if not np.all(np.isfinite(ms)):
        raise ValueError(f"latencies must be finite, got {ms.tolist()}")
    return n, ms


def _as_masses(masses_desc) -> np.ndarray:
    rho = np.asarray(masses_desc, dtype=np.float64)
    if rho.ndim != 1:
        raise ValueError(f"masses must be 1-D, got shape {rho.shape}")
    if np.any(rho < 0) or np.any(rho > 1 + 1e-9) or np.any(np.diff(rho) > 1e-12):
        raise ValueError("masses must be probabilities in [0, 1] sorted in descending order "
                         "(use tree.sorted_prefix_masses)")
    return rho


def _bucket_slot(buckets, budget, batch: int):
    """Index of the smallest bucket >= (batch + budget) / batch packed tokens per request."""
    return np.searchsorted(buckets, np.ceil((batch + np.asarray(budget)) / batch))


def _budget_range(available: int, n_min: int, n_max: int | None) -> tuple[int, int]:
    hi = available if n_max is None else min(n_max, available)
    if n_min < 0 or n_min > hi:
        raise ValueError(f"need 0 <= n_min <= n_max, got n_min={n_min}, n_max={n_max} "
                         f"with {available} candidate nodes available")
    return n_min, hi
