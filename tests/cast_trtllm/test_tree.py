"""Tree construction: prefix closure and Theorem 1 / Proposition 2 optimality."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cast_trtllm.tree import (
    Tree,
    allocate_shared_budget,
    build_chain,
    build_tree,
    build_trees,
    sorted_prefix_masses,
    topk_per_position,
)


def _topk(seed: int, L: int, K: int, vocab: int = 12, sharpness: float = 2.0):
    logits = torch.randn(L, vocab, generator=torch.Generator().manual_seed(seed)) * sharpness
    ids, lp = topk_per_position(logits, K)
    return ids.numpy(), lp.double().numpy()


def _is_prefix_closed(tree: Tree) -> bool:
    return all(tree.parent[i] < i for i in range(tree.size))


def _universe(L: int, K: int):
    """All rank paths of the retained universe, as tuples."""
    return [p for d in range(1, L + 1) for p in itertools.product(range(K), repeat=d)]


def _brute_force_best(lps: list[np.ndarray], budget: int) -> float:
    """max Σ mass over prefix-closed selections of size `budget` in the pooled universe."""
    nodes = [(r, p) for r, lp in enumerate(lps) for p in _universe(*lp.shape)]
    mass = {
        (r, p): float(np.exp(sum(lps[r][j, k] for j, k in enumerate(p)))) for r, p in nodes
    }
    best = -1.0
    for subset in itertools.combinations(nodes, budget):
        chosen = set(subset)
        if all(len(p) == 1 or (r, p[:-1]) in chosen for r, p in chosen):
            best = max(best, sum(mass[v] for v in chosen))
    return best


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), L=st.integers(1, 6), K=st.integers(1, 4), budget=st.integers(1, 40))
def test_every_tree_is_prefix_closed_with_parents_first(seed, L, K, budget):
    ids, lp = _topk(seed, L, K)
    tree = build_tree(ids, lp, budget)
    assert _is_prefix_closed(tree)
    assert tree.size == min(budget, sum(K**d for d in range(1, L + 1)))
    # scores are the path products of the original marginals
    for i in range(tree.size):
        parent_score = 0.0 if tree.parent[i] < 0 else tree.score[tree.parent[i]]
        step = tree.score[i] - parent_score
        d = tree.depth[i] - 1
        assert np.isclose(step, lp[d][ids[d] == tree.tokens[i]][0])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), L=st.integers(1, 3), K=st.integers(1, 3), budget=st.integers(1, 6))
def test_build_tree_attains_brute_force_optimum(seed, L, K, budget):
    ids, lp = _topk(seed, L, K)
    if budget > len(_universe(L, K)):
        return
    tree = build_tree(ids, lp, budget)
    assert np.isclose(np.exp(tree.score).sum(), _brute_force_best([lp], budget), rtol=1e-9)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), B=st.integers(1, 3), total=st.integers(1, 6))
def test_shared_allocation_equals_pooled_brute_force(seed, B, total):
    reqs = [_topk(seed + r, 2, 2) for r in range(B)]
    if total > B * 6:
        return
    trees = allocate_shared_budget(reqs, total)
    assert sum(t.size for t in trees) == total
    assert all(_is_prefix_closed(t) for t in trees)
    got = sum(np.exp(t.score).sum() for t in trees)
    assert np.isclose(got, _brute_force_best([lp for _, lp in reqs], total), rtol=1e-9)


def test_shared_allocation_respects_per_request_cap_and_stays_prefix_closed():
    reqs = [_topk(s, 6, 4, vocab=40, sharpness=s + 1.0) for s in range(5)]
    trees = allocate_shared_budget(reqs, 30, cap=7)
    assert all(t.size <= 7 for t in trees)
    assert sum(t.size for t in trees) == 30
    assert all(_is_prefix_closed(t) for t in trees)
    for (ids, lp), tree in zip(reqs, trees):  # each request keeps its own best prefix
        alone = build_tree(ids, lp, tree.size)
        assert np.allclose(np.sort(alone.score), np.sort(tree.score))


def test_single_request_shared_allocation_equals_build_tree():
    ids, lp = _topk(3, 8, 4, vocab=30)
    (tree,) = allocate_shared_budget([(ids, lp)], 25)
    alone = build_tree(ids, lp, 25)
    assert np.array_equal(tree.tokens, alone.tokens) and np.array_equal(tree.parent, alone.parent)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10_000), B=st.integers(1, 5), L=st.integers(1, 7), K=st.integers(1, 5),
       sharpness=st.sampled_from([0.3, 2.0, 8.0]), rounded=st.booleans(), data=st.data())
def test_one_search_for_several_requests_builds_each_requests_own_top_n_tree_node_for_node(
        seed, B, L, K, sharpness, rounded, data):
    """`build_trees` (one round's fixed budgets, or auto's widest search, under load) returns what
    `build_tree` returns for each request alone: the same nodes in the same order, ties included."""
    pairs = [_topk(seed + r, L, K, vocab=12, sharpness=sharpness) for r in range(B)]
    ids = np.stack([i for i, _ in pairs])
    lp = np.stack([np.round(l, 1) if rounded else l for _, l in pairs])  # rounded: many exact ties
    budgets = data.draw(st.lists(st.integers(0, 40), min_size=B, max_size=B))
    for r, tree in enumerate(build_trees(ids, lp, budgets)):
        alone = build_tree(ids[r], lp[r], budgets[r])
        for field in ("tokens", "depth", "parent", "score"):
            assert np.array_equal(getattr(tree, field), getattr(alone, field)), (r, field)


def test_ties_go_to_shorter_prefixes():
    # q = 1 at every position: every string has mass 1; the top-3 must be a chain's
    # prefixes ordered by depth, never a deep node before its ancestor.
    ids = np.array([[5, 6], [7, 8], [9, 10]])
    lp = np.array([[0.0, -np.inf], [0.0, -np.inf], [0.0, -np.inf]])
    tree = build_tree(ids, lp, 3)
    assert tree.depth.tolist() == [1, 2, 3]
    assert tree.tokens.tolist() == [5, 7, 9]


def test_zero_mass_strings_are_never_proposed():
    ids = np.array([[1, 2], [3, 4]])
    lp = np.array([[0.0, -np.inf], [0.0, -np.inf]])
    assert build_tree(ids, lp, 10).size == 2


def test_chain_is_the_top1_path():
    ids, lp = _topk(1, 5, 3)
    chain = build_chain(ids, lp)
    assert chain.tokens.tolist() == ids[:, 0].tolist()
    assert chain.parent.tolist() == [-1, 0, 1, 2, 3]
    assert build_chain(ids, lp, 2).size == 2


def test_sorted_prefix_masses_are_the_tree_node_masses():
    ids, lp = _topk(7, 6, 4, vocab=30)
    masses = sorted_prefix_masses(lp, 20)
    assert np.all(np.diff(masses) <= 0)
    assert np.allclose(masses, np.exp(build_tree(ids, lp, 20).score))


def test_head_of_a_best_first_tree_is_the_smaller_budget_tree():
    ids, lp = _topk(11, 6, 4, vocab=30)
    wide = build_tree(ids, lp, 40)
    np.testing.assert_allclose(np.exp(wide.score), sorted_prefix_masses(lp, 40))
    for n in (0, 1, 7, 40):
        small, head = build_tree(ids, lp, n), wide.head(n)
        assert all(np.array_equal(getattr(small, f), getattr(head, f)) for f in ("tokens", "depth", "parent", "score"))
    with pytest.raises(ValueError, match="head"):
        wide.head(41)


def test_topk_per_position_stays_on_device_and_sorts():
    logits = torch.randn(4, 100)
    ids, lp = topk_per_position(logits, 5)
    assert ids.shape == (4, 5) and ids.device == logits.device
    assert torch.all(lp[:, :-1] >= lp[:, 1:])
    assert torch.allclose(lp[:, 0], torch.log_softmax(logits, -1).max(-1).values)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: build_tree(np.zeros((2, 2)), np.zeros((2, 3)), 1), "must both be"),
        (lambda: build_tree(np.zeros((2, 2)), np.array([[-1.0, -0.5], [-1, -2]]), 1), "sorted"),
        (lambda: build_tree(np.zeros((1, 1)), np.zeros((1, 1)), -1), "budget"),
        (lambda: topk_per_position(torch.zeros(2, 3), 4), "rank cap"),
        (lambda: allocate_shared_budget([], 3), "at least one"),
        (lambda: build_trees(np.zeros((2, 2, 2)), np.zeros((2, 2, 2)), [1]), "B budgets"),
        (lambda: build_trees(np.zeros((1, 2, 2)), np.zeros((1, 2, 2)), [-1]), "budgets must be >= 0"),
    ],
)
def test_bad_input_raises_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
