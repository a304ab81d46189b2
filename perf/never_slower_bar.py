"""Issue 40's bar for a `perf.never_slower` cell, and the statistics it is judged with: runs paired by
repeat (`paired`), how many repeats a cell needs (`timed_repeats`), and the verdict (`verdict`)."""

from __future__ import annotations

import math

import numpy as np


def timed_repeats(warm: dict, repeats: int, min_seconds: float, max_repeats: int, floor_repeats: int) -> int:
    """`cell`'s repeats from its warm-up walls by label: enough for `min_seconds` each (up to `max_repeats`), and
    at least `floor_repeats` where cast:3 ran slower than AR: the bar is then auto's best run >= 0.98x AR's, and a
    best of 3-5 runs that move 10-25% apart (c = 16, 2-core CPU) cannot resolve 2%."""
    repeats = min(max(repeats, math.ceil(min_seconds / min(warm.values()))), max(max_repeats, repeats))
    return max(repeats, floor_repeats) if warm.get("cast:3", 0.0) > warm.get("ar", math.inf) else repeats


# one-sided 95% quantiles of Student's t, 1..15 degrees of freedom (then the normal's)
T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753)


def paired(runs, reference) -> tuple[float, float] | None:
    """A method's runs over a reference's, paired by repeat (the two ran back to back): (geometric
    mean ratio, its one-sided 95% upper bound), from the per-repeat log ratios' mean and standard
    error (Student's t); None with fewer than two pairs. An upper bound >= 1: the runs cannot
    tell this method slower than the reference."""
    if len(runs) < 2 or len(runs) != len(reference):
        return None
    d = np.log(np.asarray(runs, dtype=float) / np.asarray(reference, dtype=float))
    t = T95[len(d) - 2] if len(d) - 1 <= len(T95) else 1.645
    return float(np.exp(d.mean())), float(np.exp(d.mean() + t * d.std(ddof=1) / math.sqrt(len(d))))


# the largest shortfall an A/A run may read between identical work, paired by repeat: 13 cells of two
# `perf.never_slower_aa` runs (cast:3 or AR against itself, 2-core CPU) read 0.989-1.017, one of them
# measurably under 1 (MT-Bench B = 1: 0.989, bound 0.995; its twin ran right after cast:3 in 3 of 4 repeats)
AA_MARGIN = 0.015


def verdict(rows: dict, floor: float = 0.98) -> str:
    """Issue 40's bar for one cell: where cast:3 does not beat AR, auto >= `floor` x AR (best runs);
    where it does, auto >= cast:3 (best runs). Else within noise of the reference (AR where no width
    pays, cast:3 where one does): paired by repeat, auto's runs over the reference's read at least
    1 - AA_MARGIN, what identical work reads apart (`paired`'s mean; stricter than `floor` on the mean).
    A best-run ratio alone cannot say that: A/A runs read identical work's best runs 0.965-1.045 apart,
    and where no width pays it reads whichever method had the luckiest run (AIPerf c = 8 at 2546624, auto
    and AR only, 8 repeats, 2-core CPU: best runs 0.96x, paired 0.997). Without AR's runs in `rows` a
    no-width cell is judged on best runs alone."""
    auto, static = rows["cast:auto"], rows["cast:3"]
    if auto["vs_ar"] >= (floor if no_width(rows) else static["vs_ar"]):
        return "meets"
    ratio = paired(auto.get("runs_tokens_per_s", ()), reference(rows).get("runs_tokens_per_s", ()))
    return "within noise" if ratio is not None and ratio[0] >= 1.0 - AA_MARGIN else "MISS"


def reference(rows: dict) -> dict:
    """The row auto is judged against within noise: AR's where cast:3 does not beat AR, else cast:3's
    ({} where AR's row is not given)."""
    return rows.get("ar", {}) if no_width(rows) else rows["cast:3"]


def no_width(rows: dict) -> bool:
    """Whether no static width pays in this cell: cast:3 reads at most AR's tokens/s on best runs."""
    return rows["cast:3"]["vs_ar"] <= 1.0
