"""The measured verify-cost curve ell(n): affine fit, kernel cliffs, bucket choice (paper §3.1, App. D).

ell(n) is the verify-forward latency in ms at packed count n = N + 1 (pending root + N
tree nodes), one row of a width profile or a learned cost table. These functions read a
curve; they know nothing of masses or width rules. Pure numpy.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

CLIFF_JUMP = 0.10  # a cliff rises this fraction of ms[i] above the local slope's prediction
CLIFF_MIN_N = 2  # n = 1 runs the decode kernels: steps from it are never cliffs
CLIFF_WINDOW = 4  # previous counts the local slope is fitted over


def fit_affine(n: np.ndarray, ms: np.ndarray, lo: int, hi: int) -> tuple[float, float]:
    """Least-squares ell(n) ~= c0 + c1 * n over the measured n in [lo, hi] (paper §3.1).

    Returns (c0 intercept ms, c1 slope ms per packed token). c1 may come out negative on
    a flat, noisy curve (paper Table 6, 1k prefix); callers clamp it where a rule needs
    c1 >= 0.
    """
    n, ms = check_curve(n, ms)
    keep = (n >= lo) & (n <= hi)
    if keep.sum() < 2:
        raise ValueError(f"fit range [{lo}, {hi}] holds {int(keep.sum())} measured packed "
                         f"counts of {n.tolist()}; an affine fit needs at least 2")
    c1, c0 = np.polyfit(n[keep].astype(np.float64), ms[keep], deg=1)
    return float(c0), float(c1)


def detect_cliffs(n: np.ndarray, ms: np.ndarray) -> list[int]:
    """Packed counts where the latency jumps far above the local slope (a kernel/tile cliff).

    The step n[i] -> n[i+1] is a cliff when the rise that PERSISTS (min of ms[i+1:], so a
    one-point transient such as the A100 n=32 cell of Table 5 does not count) exceeds what
    the affine fit over the up-to-CLIFF_WINDOW previous counts predicts by more than
    `CLIFF_JUMP * ms[i]`. Returns the counts n[i+1] landed on (Blackwell/Qwen3-8B: [128]).
    Only counts >= CLIFF_MIN_N are compared: leaving n = 1 switches from decode to multi-token
    kernels, a cost every tree, even the plain chain, pays (paper App. D.1). A step needs
    two earlier counts >= CLIFF_MIN_N to estimate its local slope; earlier steps are not flagged.
    The slope used is never below the median step slope of the whole curve, so a noisy or
    non-monotone start (CPU n = 2 slower than n = 4) does not make an ordinary rise look
    like a cliff.
    """
    n, ms = check_curve(n, ms)
    cliffs = []
    first = int(np.searchsorted(n, CLIFF_MIN_N))
    steps = np.diff(ms[first:]) / np.diff(n[first:]).astype(np.float64)
    trend = max(float(np.median(steps)), 0.0) if len(steps) else 0.0
    for i in range(first + 1, len(n) - 1):  # step i -> i+1 with >= 2 prior points
        lo = max(first, i + 1 - CLIFF_WINDOW)
        c1, _ = np.polyfit(n[lo:i + 1].astype(np.float64), ms[lo:i + 1], deg=1)
        expected = max(c1, trend) * (n[i + 1] - n[i])
        persistent_rise = ms[i + 1:].min() - ms[i]
        if persistent_rise - expected > CLIFF_JUMP * ms[i]:
            cliffs.append(int(n[i + 1]))
    return cliffs


def choose_buckets(n: np.ndarray, ms: np.ndarray, max_buckets: int) -> list[int]:
    """Pick at most `max_buckets` measured packed counts to compile/capture ahead.

    Always kept: the widest measured count and the count just below every detected cliff
    (so a tree can stop short of it). The rest are added greedily, each time the count that
    most reduces the padding waste sum_i (ell(bucket(n_i)) - ell(n_i)) over measured n_i.
    """
    n, ms = check_curve(n, ms)
    below_cliffs = [int(n[np.searchsorted(n, c) - 1]) for c in detect_cliffs(n, ms)]
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


def check_curve(n, ms) -> tuple[np.ndarray, np.ndarray]:
    """Validate a curve: packed counts [C] strictly ascending >= 1, finite ms [C]."""
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


def robust_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Theil-Sen fit y ~ intercept + slope * x (median pairwise slope): one outlier cell among
    three or more does not tilt it. (nan, nan) when x has fewer than two distinct values."""
    i, j = np.triu_indices(len(x), k=1)
    apart = x[i] != x[j]
    if not apart.any():
        return float("nan"), float("nan")
    slope = float(np.median((y[j] - y[i])[apart] / (x[j] - x[i])[apart]))
    return slope, float(np.median(y - slope * x))


def fill_curve(x: np.ndarray, x_cells: np.ndarray, y_cells: np.ndarray,
               prior: Mapping[int, float] | None = None) -> np.ndarray:
    """ell at packed-token totals x [C] from measured cells (totals x_cells [M], ms y_cells [M]): the
    prior's shape (packed count -> ms) mapped onto the cells by a robust affine fit; without a prior an
    affine fit of the cells; with no cells, the prior (or 1 ms)."""
    if len(x_cells) == 0:
        return np.ones_like(x) if prior is None else prior_at(prior, x)
    if prior is None:
        slope, intercept = robust_line(x_cells, y_cells)
        if not slope > 0:  # one width read, or no rise: flat (optimistic) until more are read
            return np.full_like(x, np.median(y_cells))
        return intercept + slope * x
    basis = prior_at(prior, x_cells)
    slope, intercept = robust_line(basis, y_cells)
    if slope > 0:  # the prior's shape at the live level and slope
        return intercept + slope * prior_at(prior, x)
    return prior_at(prior, x) * float(np.median(y_cells / basis))  # one width read, or no trend: scale


def prior_at(prior: Mapping[int, float], n: np.ndarray) -> np.ndarray:
    """A prior curve (packed count -> ms) at packed counts n; linear beyond its widest count, flat below its first."""
    pn, pm = list(prior), list(prior.values())
    out = np.interp(n, pn, pm)
    if len(pn) >= 2:
        slope = max((pm[-1] - pm[-2]) / (pn[-1] - pn[-2]), 0.0)
        out = np.where(n > pn[-1], pm[-1] + slope * (n - pn[-1]), out)
    return out
