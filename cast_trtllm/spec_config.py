"""The ONE speculative-decoding configuration: every command, the server and the
`--extra-llm-api-options` YAML map onto `SpecConfig`, and every value is checked here.

Terms (paper §2-3): method `ar` (no drafter), `chain` (standard DFlash: the top-1 token
at each of the L block positions) or `cast` (best-first top-N tree); budget N = nonroot
tree nodes per verify, or `auto` (chosen per round from the measured verify cost);
rank cap K = tokens kept per drafted position; max_draft_len = drafted positions used
(≤ the drafter's block positions L). A tree can hold at most L × K nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

METHODS = ("ar", "chain", "cast")
WIDTH_RULES = ("table", "marginal")
AUTO = "auto"


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_budget(budget: object, name: str = "budget") -> int | str:
    """An integer N >= 0 or 'auto' (strings of digits are accepted)."""
    if isinstance(budget, str) and budget.strip().isdigit():
        budget = int(budget)
    if budget != AUTO and (not is_int(budget) or budget < 0):
        raise ValueError(f"{name} must be 'auto' or an integer >= 0, got {budget!r}")
    return budget


@dataclass(frozen=True, slots=True)
class SpecConfig:
    method: str = "cast"  # default method of a request that names none
    budget: int | str = AUTO  # cast: N nonroot nodes per verify, or "auto"
    rank_cap: int = 8  # K: tokens kept per drafted position
    max_draft_len: int | None = None  # drafted positions used per round; None = the drafter's L
    width_profile: str | None = None  # verify-cost table for auto (the prior of the online cost model)
    width_rule: str = "table"  # auto: table rule over measured buckets, or Theorem 2's marginal rule
    draft_gate: bool = True  # auto: skip drafting in rounds where AR measures faster
    # rounds between tries of the other arm of the draft gate (16 left code prompts undrafted
    # for too long: perf/results/gate_probe_cpu.md)
    gate_probe_every: int = 4
    max_request_width: int = 64  # auto under load: most nodes one request takes from the shared budget
    max_concurrency: int | None = None  # above this many live requests, rounds do not draft (TensorRT-LLM's field)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        object.__setattr__(self, "budget", check_budget(self.budget))
        optional = ("max_draft_len", "max_concurrency")  # None: the drafter's L / no limit
        for name in ("rank_cap", "gate_probe_every", "max_request_width", *optional):
            value = getattr(self, name)
            if not (value is None and name in optional) and (not is_int(value) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.width_rule not in WIDTH_RULES:
            raise ValueError(f"width_rule must be one of {WIDTH_RULES}, got {self.width_rule!r}")
        if self.width_profile is not None and (not isinstance(self.width_profile, str) or not self.width_profile):
            raise ValueError(f"width_profile must be a non-empty path, got {self.width_profile!r}")

    def with_overrides(self, **changes: Any) -> "SpecConfig":
        """A copy with the non-None `changes` applied (validated again)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    def draft_positions(self, block_positions: int) -> int:
        """Positions used per round with a drafter of L = `block_positions`."""
        if self.max_draft_len is None:
            return block_positions
        if self.max_draft_len > block_positions:
            raise ValueError(f"max_draft_len {self.max_draft_len} exceeds the drafter's block of "
                             f"L = {block_positions} positions; pass max_draft_len <= {block_positions}")
        return self.max_draft_len

    def max_nodes(self, block_positions: int) -> int:
        """L × K: the most nodes a tree can hold with this drafter."""
        return self.draft_positions(block_positions) * self.rank_cap

    def check_budget_fits(self, budget: int | str, block_positions: int) -> None:
        """Refuse a fixed budget beyond the L × K nodes the drafter can offer."""
        limit = self.max_nodes(block_positions)
        if budget != AUTO and budget > limit:
            raise ValueError(
                f"budget {budget} exceeds the {limit} nodes the drafter can offer (L = "
                f"{self.draft_positions(block_positions)} positions × K = {self.rank_cap} tokens each); "
                f"pass a budget <= {limit}, 'auto', or a larger rank cap")
