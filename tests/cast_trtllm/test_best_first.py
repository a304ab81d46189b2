"""The best-first search: its seed bound is a true lower bound, its work stays bounded."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cast_trtllm.best_first import best_first_pool, seed_bound
from cast_trtllm.tree import build_tree, sorted_prefix_masses


def _sorted_logprobs(seed: int, B: int, L: int, K: int) -> np.ndarray:
    logits = np.random.default_rng(seed).standard_normal((B, L, K + 3)) * 2.0
    lp = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
    return -np.sort(-lp, axis=-1)[..., :K]


def _all_scores(lp: np.ndarray) -> np.ndarray:
    """Every node's score of one request's universe (small L, K only)."""
    level, out = lp[0], [lp[0]]
    for d in range(1, lp.shape[0]):
        level = (level[:, None] + lp[d]).ravel()
        out.append(level)
    return np.concatenate(out)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), L=st.integers(1, 5), K=st.integers(1, 4), keep=st.integers(1, 60))
def test_seed_bound_never_exceeds_the_true_keep_th_best_score(seed, L, K, keep):
    lp = _sorted_logprobs(seed, 2, L, K)
    scores = [np.sort(_all_scores(lp[r]))[::-1] for r in range(2)]
    pooled = np.sort(np.concatenate(scores))[::-1]
    (tau,) = seed_bound(lp, keep, per_request=False)
    assert keep > len(pooled) or tau <= pooled[keep - 1]
    for r, t in enumerate(seed_bound(lp, keep, per_request=True)):
        assert keep > len(scores[r]) or t <= scores[r][keep - 1]


def test_flat_marginals_tighten_the_bound_so_the_work_stays_near_the_budget():
    lp = np.full((1, 15, 8), np.log(1 / 8))  # every depth-d node ties: the seed is loose here
    pool = best_first_pool(lp, 127, per_request=False)
    assert len(pool.score) < 1000  # not the 8^6 nodes the seed alone would admit
    tree = build_tree(np.arange(120).reshape(15, 8), lp[0], 127)
    assert np.bincount(tree.depth).tolist() == [0, 8, 64, 55]  # shorter prefixes first


def _brute_force_order(lp: np.ndarray) -> list[tuple[float, int, int, tuple[int, ...]]]:
    """Every positive-mass node of B small universes as (score, depth, request, rank path),
    in Theorem 1 order; scores summed root to leaf like the search's."""
    nodes = []
    for r in range(lp.shape[0]):
        level = [(0.0, ())]
        for d in range(lp.shape[1]):
            level = [(s + lp[r, d, k], path + (k,)) for s, path in level for k in range(lp.shape[2])]
            level = [(s, path) for s, path in level if s > -np.inf]
            nodes += [(s, d + 1, r, path) for s, path in level]
    return sorted(nodes, key=lambda n: (-n[0], n[1], n[2], n[3]))


def _pool_order(pool) -> list[tuple[float, int, int, tuple[int, ...]]]:
    paths: list[tuple[int, ...]] = []
    for i in range(len(pool.score)):
        paths.append((paths[pool.parent[i]] if pool.parent[i] >= 0 else ()) + (int(pool.rank[i]),))
    return list(zip(pool.score.tolist(), pool.depth.tolist(), pool.request.tolist(), paths))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), B=st.integers(1, 3), L=st.integers(1, 4), K=st.integers(1, 4),
       levels=st.integers(1, 4), keep=st.integers(1, 40), per_request=st.booleans())
def test_pool_heads_are_the_brute_force_theorem_1_order_even_with_ties(seed, B, L, K, levels, keep, per_request):
    # log-probs from a few values, zero and -inf among them: exact ties, and levels wider than keep
    values = np.array([0.0, np.log(0.5), np.log(0.25), -np.inf])[:levels]
    lp = -np.sort(-np.random.default_rng(seed).choice(values, size=(B, L, K)), axis=-1)
    got, want = _pool_order(best_first_pool(lp, keep, per_request)), _brute_force_order(lp)
    if not per_request:
        assert got[:keep] == want[:keep]
    for r in range(B if per_request else 0):
        assert [n for n in got if n[2] == r][:keep] == [n for n in want if n[2] == r][:keep]


def test_a_level_wider_than_keep_is_cut_so_certain_strings_stay_cheap():
    lp = np.zeros((1, 15, 8))  # every string has mass 1: 8^15 nodes tie
    pool = best_first_pool(lp, 127, per_request=False)
    assert len(pool.score) <= 15 * 127
    tree = build_tree(np.arange(120).reshape(15, 8), lp[0], 127)
    assert np.bincount(tree.depth).tolist() == [0, 8, 64, 55]
    assert tree.tokens[:3].tolist() == [0, 1, 2]  # ties: lexicographic in rank


def test_sorted_prefix_masses_rejects_unsorted_rows():
    with pytest.raises(ValueError, match="sorted"):
        sorted_prefix_masses(np.log([[0.2, 0.7]]), 2)
