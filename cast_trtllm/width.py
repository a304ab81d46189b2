"""`WidthPolicy`: the per-round width from a width profile's measured bucket table.

One prefix bucket of a `WidthProfile` (cast_trtllm.profile) becomes a bucket table per
batch size; `choose` applies the table rule or the marginal rule of
`cast_trtllm.width_rules` to the round's sorted prefix masses. The runtime calls `choose`
once per round. The profile format knows nothing of this policy; the policy reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cast_trtllm.json_fields import ascending_ints
from cast_trtllm.profile import WidthProfile
from cast_trtllm.width_rules import (
    WidthChoice, batched_stopping_width, bucket_slot, check_masses, check_policy, table_rule_width, width_choice,
)

RULES = ("table", "marginal")


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
    max_budget: int | None = None             # None: widest bucket - 1
    mass_exponent: float = 1.0                # calibration: a node's acceptance ~= rho ** exponent

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"WidthPolicy.rule must be one of {RULES}, got {self.rule!r}")
        for name in ("buckets", "batch_sizes"):
            object.__setattr__(self, name, ascending_ints(getattr(self, name), f"WidthPolicy.{name}"))
        nb = len(self.batch_sizes)
        for name in ("bucket_ms", "intercept_ms", "slope_ms", "fixed_ms"):
            if len(getattr(self, name)) != nb:
                raise ValueError(f"WidthPolicy.{name}: expected {nb} rows (one per batch size)")
        table = np.asarray(self.bucket_ms, dtype=np.float64)
        if table.shape != (nb, len(self.buckets)) or not np.all(table > 0):
            raise ValueError(f"WidthPolicy.bucket_ms must be positive with shape "
                             f"({nb}, {len(self.buckets)}), got shape {table.shape}")
        object.__setattr__(self, "max_budget", check_policy("WidthPolicy", self.buckets, self.rank_cap,
                                                            self.mass_exponent, self.max_budget))

    @classmethod
    def from_profile(cls, profile: WidthProfile, prefix_len: int, rule: str = "table", rank_cap: int = 8,
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
            rule=rule, rank_cap=rank_cap, max_budget=max_budget, mass_exponent=mass_exponent)

    def choose(self, masses_desc: np.ndarray, batch: int = 1) -> WidthChoice:
        """Budget for this round from the round's sorted prefix masses.

        masses_desc: [U] descending plug-in node masses (batch > 1: pooled over the B
        requests); they are calibrated here as rho ** mass_exponent (monotone, so the
        order and hence the tree are unchanged; only how far it pays to grow it).
        """
        rho = check_masses(masses_desc) ** self.mass_exponent

        def row(values) -> float:  # linear in batch size between measured sizes
            return float(np.interp(batch, self.batch_sizes, values))

        ms = np.array([row(col) for col in zip(*self.bucket_ms)])  # [buckets]
        fixed, hi = row(self.fixed_ms), batch * self.max_budget
        if self.rule == "table":
            budget, bucket = table_rule_width(rho, self.buckets, ms, fixed, hi, batch)
        else:  # ell(M, B) = fixed + c0 + c1 * (B + M) / B per-request packed count
            c1 = max(row(self.slope_ms), 0.0)
            budget = batched_stopping_width(rho, batch, fixed + row(self.intercept_ms) + c1, c1 / batch, hi)
            bucket = self.buckets[bucket_slot(self.buckets, budget, batch)]
        return width_choice(rho, budget, bucket, self.buckets, ms, fixed, batch)
