"""The tree benchmark's heapq reference (paper App. C) must agree with cast_trtllm.tree."""

from __future__ import annotations

import numpy as np

from cast_trtllm.tree import allocate_shared_budget, build_tree
from perf.bench_tree import heap_best_first, synthetic_marginals, token_paths


def test_heapq_reference_selects_the_same_nodes_as_cast_trtllm():
    rng = np.random.default_rng(1)
    single = synthetic_marginals(6, 4, rng)
    assert token_paths(build_tree(*single, 40)) == token_paths(heap_best_first([single], 40)[0])
    many = [synthetic_marginals(6, 4, rng) for _ in range(3)]
    ours = [token_paths(t) for t in allocate_shared_budget(many, 50)]
    assert ours == [token_paths(t) for t in heap_best_first(many, 50)]


def test_synthetic_marginals_are_sorted_log_probabilities_that_fall_with_depth():
    ids, lp = synthetic_marginals(15, 8, np.random.default_rng(0))
    assert ids.shape == lp.shape == (15, 8)
    assert np.all(np.diff(lp, axis=1) <= 0) and np.all(lp <= 0)
    assert np.exp(lp[:3, 0]).mean() > np.exp(lp[-3:, 0]).mean()
