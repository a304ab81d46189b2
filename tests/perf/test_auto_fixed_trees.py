"""The ablation's swap (`perf.auto_fixed_trees.packed_as_static`): inside it a round of enough auto
requests packs cast:3's three nodes each whatever the width rule chose; outside it, the rule's split."""

from __future__ import annotations

from cast_trtllm.spec_config import SpecConfig
from perf.auto_fixed_trees import STATIC, packed_as_static
from runtime.engine.trees import MeanBudget, choose_trees
from tests.runtime.engine.test_auto_split import B, marginals


def sizes(ids, lp, budget: int) -> list[int]:
    trees = choose_trees(["cast"] * B, ["auto"] * B, [10] * B, ids, lp, SpecConfig(),
                         lambda prefix: MeanBudget(budget), [1.0] * B)[0]
    return [t.size for t in trees]


def test_a_round_of_enough_auto_requests_packs_static_trees_only_inside_the_swap():
    ids, lp = marginals(0)
    rule = sizes(ids, lp, 5)  # 20 nodes split by best-first mass: the confident request takes more
    assert sum(rule) == 5 * B and rule != [STATIC] * B
    with packed_as_static(B):
        assert sizes(ids, lp, 5) == [STATIC] * B
    with packed_as_static(B + 1):  # fewer requests than it swaps for: the rule's split stands
        assert sizes(ids, lp, 5) == rule
    assert sizes(ids, lp, 5) == rule  # swapped back on leaving
