"""The tree benchmark's heapq reference (paper App. C) must agree with cast_trtllm.tree."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cast_trtllm.tree import Tree, allocate_shared_budget, build_tree
from click.testing import CliRunner

from perf.bench import bench
from perf.bench_tree import heap_best_first, synthetic_marginals, token_paths


def _ordered_paths(tree: Tree) -> list[tuple[int, ...]]:
    paths: list[tuple[int, ...]] = []
    for i in range(tree.size):
        parent = int(tree.parent[i])
        paths.append((paths[parent] if parent >= 0 else ()) + (int(tree.tokens[i]),))
    return paths


def _tied_marginals(seed: int, L: int, K: int, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """Log-probs drawn from a few values (many exact ties), some zero-mass tails; ids unique per row."""
    rng = np.random.default_rng(seed)
    values = np.log(np.array([0.9, 0.5, 0.25, 0.125, 0.05])[:levels])
    lp = -np.sort(-rng.choice(values, size=(L, K)), axis=1)
    if seed % 3 == 0:
        lp[:, K - 1 :] = -np.inf
    return np.arange(L * K).reshape(L, K), lp


def test_heapq_reference_selects_the_same_nodes_as_cast_trtllm():
    rng = np.random.default_rng(1)
    single = synthetic_marginals(6, 4, rng)
    assert token_paths(build_tree(*single, 40)) == token_paths(heap_best_first([single], 40)[0])
    many = [synthetic_marginals(6, 4, rng) for _ in range(3)]
    ours = [token_paths(t) for t in allocate_shared_budget(many, 50)]
    assert ours == [token_paths(t) for t in heap_best_first(many, 50)]


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), L=st.integers(1, 8), K=st.integers(1, 6), levels=st.integers(1, 5),
       budget=st.integers(1, 150))
@example(seed=87705, L=2, K=6, levels=5, budget=8)  # ties one rounding ulp from the seed bound
def test_build_tree_equals_the_heapq_best_first_order_even_with_ties(seed, L, K, levels, budget):
    single = _tied_marginals(seed, L, K, levels)
    assert _ordered_paths(build_tree(*single, budget)) == _ordered_paths(heap_best_first([single], budget)[0])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), B=st.integers(1, 4), L=st.integers(1, 6), K=st.integers(1, 4),
       levels=st.integers(1, 5), total=st.integers(1, 120), cap=st.one_of(st.none(), st.integers(1, 40)))
def test_shared_budget_equals_the_heapq_global_best_first_even_with_ties(seed, B, L, K, levels, total, cap):
    many = [_tied_marginals(seed + r, L, K, levels) for r in range(B)]
    ours = [_ordered_paths(t) for t in allocate_shared_budget(many, total, cap=cap)]
    assert ours == [_ordered_paths(t) for t in heap_best_first(many, total, cap=cap)]


def test_synthetic_marginals_are_sorted_log_probabilities_that_fall_with_depth():
    ids, lp = synthetic_marginals(15, 8, np.random.default_rng(0))
    assert ids.shape == lp.shape == (15, 8)
    assert np.all(np.diff(lp, axis=1) <= 0) and np.all(lp <= 0)
    assert np.exp(lp[:3, 0]).mean() > np.exp(lp[-3:, 0]).mean()


def test_tree_mode_checks_both_constructions_and_writes_their_timings(tmp_path):
    out = tmp_path / "tree.json"
    result = CliRunner().invoke(bench, ["tree", "--budget", "20", "--rank-cap", "4", "--block", "6", "--batch", "3",
                                        "--total", "30", "--repeats", "3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    results = json.loads(out.read_text())["results"]
    assert results["build_tree"]["budget_N"] == 20 and results["allocate_shared_budget"]["same_node_set"]
    assert results["build_tree"]["heapq_median_us"] > 0
