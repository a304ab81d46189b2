"""Monte-Carlo law checks shared by the sampling tests."""

from __future__ import annotations

import numpy as np


def monte_carlo_floor(law: np.ndarray, n: int, seed: int = 0) -> tuple[float, float]:
    """(mean, 99.9% quantile) of the TV of an n-draw empirical law of `law` itself."""
    counts = np.random.default_rng(seed).multinomial(n, law / law.sum(), size=2000)
    tv = 0.5 * np.abs(counts / n - law).sum(1)
    return float(tv.mean()), float(np.quantile(tv, 0.999))


def assert_law(empirical_counts: np.ndarray, law: np.ndarray, label: str) -> None:
    n = int(empirical_counts.sum())
    tv = 0.5 * np.abs(empirical_counts / n - law).sum()
    floor, bound = monte_carlo_floor(law, n)
    print(f"{label}: TV {tv:.5f}  floor {floor:.5f}  bound(q99.9) {bound:.5f}  n {n}")
    assert np.all(empirical_counts[law == 0] == 0), f"{label}: a zero-mass token was committed"
    assert tv <= bound, f"{label}: TV {tv:.5f} above the Monte-Carlo bound {bound:.5f} (floor {floor:.5f})"
