"""Width rules: how many nodes N to pack, given the round's masses and a cost curve (paper §3.3, App. B.3-B.4).

Terminology:
- packed count n = N + 1: tokens in one verify pass (pending root + N tree nodes).
- prefix masses rho_(1) >= rho_(2) >= ...: the sorted node masses of the candidate
  universe; g(N) = rho_(1) + ... + rho_(N) is the expected accepted length of the best
  budget-N tree, so a round commits 1 + g(N) tokens in expectation.
- throughput f(N) = (1 + g(N)) / ell(N) tokens/ms; batched: (G(M) + B) / ell(M, B) for a
  total budget M shared by B requests (the masses are then the pooled order statistics).
- bucket: a packed width compiled/captured ahead; a tree of N nodes pays the latency of
  the smallest bucket >= N + 1 (per request: >= (B + M) / B).

The rules are pure numpy functions. `WidthPolicy` applies the table rule or the marginal
rule to one prefix bucket of a `WidthProfile` (the format knows nothing of this policy);
`OnlineCostModel` (a learned table) calls the same rules. The runtime asks either once per
round, with the round's sorted prefix masses, and gets a `WidthChoice`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from cast_trtllm.cost_curve import check_curve
from cast_trtllm.profile import WidthProfile


class WidthChoice(NamedTuple):
    budget: int                     # N (batch 1) or total M (batch B): nonroot nodes to pack
    bucket: int                     # packed width per request the verify is padded to
    predicted_tokens_per_ms: float  # (B + g) / (fixed + ell(bucket))


def batched_stopping_width(global_masses_desc: np.ndarray, batch: int, ell0_ms: float,
                           c1_ms: float, m_max: int | None = None) -> int:
    """Proposition 3: total budget M* for B requests sharing one verify pass (B = 1: Theorem 2).

    `global_masses_desc` are the pooled order statistics of all B requests' universes
    (Proposition 2); ell(M, B) = ell0 + c1 * M. From M = 0, add global node M+1 while
    rho_(M+1) >= (G(M) + B) / ell(M, B) * c1 (the next node's mass pays at least the
    token-time exchange rate). Throughput is unimodal, so the first failure is a maximizer;
    m_max (default: all masses) is the other boundary.
    """
    rho = check_masses(global_masses_desc)  # [U]
    check_batch(batch)
    if ell0_ms <= 0 or c1_ms < 0:
        raise ValueError(f"need ell0_ms > 0 and c1_ms >= 0 (Theorem 2), got "
                         f"ell0_ms={ell0_ms}, c1_ms={c1_ms}; clamp a negative fitted slope to 0")
    hi = _budget_limit(len(rho), m_max)
    committed = batch + np.concatenate([[0.0], np.cumsum(rho)])  # [U+1] G(M) + B
    m = np.arange(hi)                                              # candidate M to grow from
    grow = rho[m] * (ell0_ms + c1_ms * m) >= committed[m] * c1_ms  # rho_(M+1) ell(M) >= (G+B) c1
    stops = np.flatnonzero(~grow)
    return int(m[stops[0]]) if len(stops) else hi


def table_rule_width(masses_desc: np.ndarray, buckets_n: np.ndarray, bucket_ms: np.ndarray,
                     fixed_ms: float = 0.0, n_max: int | None = None, batch: int = 1,
                     drafting: int | None = None) -> tuple[int, int]:
    """Exact width over a measured bucket table: argmax_N (B + g(N)) / (fixed + ell(bucket(N))).

    A budget N spread over the D drafting requests of the B (None: all) pays the latency of the
    smallest bucket >= (D + N) / D packed tokens per request (B = 1: >= N + 1): the pass pads every
    request of the batch to the widest pack, so ell is the B-request table's cell. No affine
    assumption, so a cliff is crossed only when the extra mass pays for it. Returns (N, bucket);
    ties go to the smaller N.
    """
    rho = check_masses(masses_desc)  # [U]
    buckets, ms = check_curve(buckets_n, bucket_ms)
    spread = drafting_of(drafting, batch)
    if fixed_ms < 0:
        raise ValueError(f"fixed_ms must be >= 0, got {fixed_ms}")
    return best_budget(rho, *round_costs(buckets, ms, fixed_ms, n_max, spread), buckets, batch)


def round_costs(buckets, ms: np.ndarray, fixed_ms: float, n_max: int | None,
                spread: int) -> tuple[np.ndarray, np.ndarray]:
    """The table rule's denominators: [C + 1] ms of a round packing budgets 0..C over `spread` requests'
    packs (C: n_max, at most what the widest bucket holds) and each budget's bucket index. They depend on
    the table alone, not on the masses: the cost model keeps them until its table moves."""
    budgets = np.arange(_budget_limit(spread * (int(buckets[-1]) - 1), n_max) + 1)  # [C + 1]
    slot = bucket_slot(buckets, budgets, spread)  # [C + 1] bucket index
    return fixed_ms + ms[slot], slot


def best_budget(rho: np.ndarray, round_ms: np.ndarray, slot: np.ndarray, buckets, batch: int) -> tuple[int, int]:
    """argmax_N (B + g(N)) / round_ms[N] over the budgets the masses reach (ties: the smaller N) -> (N, bucket)."""
    reach = min(len(rho), len(round_ms) - 1)
    committed = batch + np.concatenate([[0.0], np.cumsum(rho[:reach])])  # [reach + 1]
    best = int(np.argmax(committed / round_ms[:reach + 1]))
    return best, int(buckets[slot[best]])


def width_choice(rho: np.ndarray, budget: int, bucket: int, buckets: tuple[int, ...], bucket_ms: np.ndarray,
                 fixed_ms: float, batch: int) -> WidthChoice:
    """The `WidthChoice` of packing `budget` nodes padded to `bucket`, with its predicted tokens/ms."""
    cost = fixed_ms + bucket_ms[buckets.index(bucket)]
    return WidthChoice(budget, bucket, float((batch + rho[:budget].sum()) / cost))


def check_masses(masses_desc) -> np.ndarray:
    """Validate [U] masses: probabilities sorted descending."""
    rho = np.asarray(masses_desc, dtype=np.float64)
    if rho.ndim != 1:
        raise ValueError(f"masses must be 1-D, got shape {rho.shape}")
    if rho.size and (rho.min() < 0 or rho.max() > 1 + 1e-9 or (rho[1:] - rho[:-1] > 1e-12).any()):
        raise ValueError("masses must be probabilities in [0, 1] sorted in descending order "
                         "(use tree.sorted_prefix_masses)")
    return rho


def check_batch(batch: int) -> None:
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")


def drafting_of(drafting: int | None, batch: int) -> int:
    """The requests of a round of `batch` whose trees share the budget (None: all of them)."""
    check_batch(batch)
    if drafting is not None and not 1 <= drafting <= batch:
        raise ValueError(f"{drafting} drafting requests in a round of {batch}")
    return batch if drafting is None else drafting


def check_policy(owner: str, buckets: tuple[int, ...], rank_cap: int, mass_exponent: float,
                 max_budget: int | None) -> int:
    """Validate the knobs `WidthPolicy` and `OnlineCostModel` share; returns max_budget (None: widest)."""
    if rank_cap < 1:
        raise ValueError(f"{owner}.rank_cap must be >= 1, got {rank_cap}")
    if not mass_exponent > 0:
        raise ValueError(f"{owner}.mass_exponent must be > 0, got {mass_exponent}")
    widest = buckets[-1] - 1
    max_budget = widest if max_budget is None else max_budget
    if not 0 <= max_budget <= widest:
        raise ValueError(f"{owner}: need 0 <= max_budget <= widest bucket - 1 = {widest}, got {max_budget}")
    return max_budget


def bucket_slot(buckets, budget, spread: int):
    """Index of the smallest bucket >= (spread + budget) / spread packed tokens per request: `budget`
    nodes spread evenly over `spread` requests' packs."""
    return np.searchsorted(buckets, np.ceil((spread + np.asarray(budget)) / spread))


def _budget_limit(available: int, n_max: int | None) -> int:
    if n_max is not None and n_max < 0:
        raise ValueError(f"need n_max >= 0, got {n_max}")
    return available if n_max is None else min(n_max, available)


RULES = ("table", "marginal")


@dataclass(frozen=True, slots=True)
class WidthPolicy:
    """Per-round width from a bucket table (one prefix bucket of a width profile).

    `bucket_ms[b][j]` is the verify latency of `batch_sizes[b]` requests each packing
    `buckets[j]` tokens; `intercept_ms`/`slope_ms` the affine fit per batch (marginal
    rule); `fixed_ms` the per-batch drafter + overhead ms. Batches between measured sizes
    are interpolated linearly, beyond them clamped. Budgets are per request. The tables
    come from a `WidthProfile` (`from_profile`), which validated them; only the policy
    knobs are checked here.
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

    def choose(self, masses_desc: np.ndarray, batch: int = 1, drafting: int | None = None) -> WidthChoice:
        """Budget for this round from the round's sorted prefix masses.

        masses_desc: [U] descending plug-in node masses (batch > 1: pooled over the drafting
        requests); they are calibrated here as rho ** mass_exponent (monotone, so the
        order and hence the tree are unchanged; only how far it pays to grow it).
        drafting: how many of the `batch` requests draft (None: all); the budget spreads over
        them, the verify row is the batch's, the drafter's fixed cost that of those drafting.
        """
        rho = check_masses(masses_desc) ** self.mass_exponent
        spread = drafting_of(drafting, batch)

        def row(values, at: int = batch) -> float:  # linear in batch size between measured sizes
            return float(np.interp(at, self.batch_sizes, values))

        ms = np.array([row(col) for col in zip(*self.bucket_ms)])  # [buckets]
        fixed, hi = row(self.fixed_ms, spread), spread * self.max_budget
        if self.rule == "table":
            budget, bucket = table_rule_width(rho, self.buckets, ms, fixed, hi, batch, spread)
        else:  # ell(M, B) = fixed + c0 + c1 * (D + M) / D per-request packed count, D drafting
            c1 = max(row(self.slope_ms), 0.0)
            budget = batched_stopping_width(rho, batch, fixed + row(self.intercept_ms) + c1, c1 / spread, hi)
            bucket = self.buckets[bucket_slot(self.buckets, budget, spread)]
        return width_choice(rho, budget, bucket, self.buckets, ms, fixed, batch)
