"""The device round's tree build, masks and greedy walk equal the host reference
(`cast_trtllm.tree.build_tree`, `cast_trtllm.masks.ancestor_matrix`, `cast_trtllm.verify.greedy_walk`)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from cast_trtllm.masks import ancestor_matrix
from cast_trtllm.tree import build_chain, build_tree
from cast_trtllm.verify import greedy_walk
from runtime.device_trees import best_first, chain, greedy_accept


def _topk(rng, B, L, K, vocab=50, ties=False):
    """Sorted top-K log-probs [B, L, K] (float32, as the drafter's topk gives) and distinct ids."""
    logits = rng.normal(size=(B, L, vocab)) * 2
    if ties:  # few distinct values: equal path scores everywhere
        logits = np.round(logits)
    lp = torch.log_softmax(torch.tensor(logits, dtype=torch.float32), -1)
    values, ids = torch.topk(lp, K, dim=-1, sorted=True)
    return ids, values


def _host_tree(device_tree, b):
    arrays = {k: getattr(device_tree, k).numpy() for k in ("tokens", "parent", "depth", "score")}
    return device_tree.to_host(arrays)[b]


def _same_tree(got, want):
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(got.parent, want.parent)
    np.testing.assert_array_equal(got.depth, want.depth)
    np.testing.assert_array_equal(got.score, want.score)


@pytest.mark.parametrize("ties", [False, True])
def test_best_first_equals_host_search_at_n127_k8_l15(ties):
    rng = np.random.default_rng(7 + ties)
    for _ in range(6):
        ids, lp = _topk(rng, B=4, L=15, K=8, ties=ties)
        tree = best_first(ids, lp, 127)
        for b in range(4):
            want = build_tree(ids[b].numpy(), lp[b].numpy(), 127)
            _same_tree(_host_tree(tree, b), want)
            for n in (1, 7, 31):  # a head is the top-n tree
                sizes = torch.full((4,), n)
                _same_tree(_host_tree(tree.head(sizes), b), build_tree(ids[b].numpy(), lp[b].numpy(), n))


@settings(max_examples=40, deadline=None)
@given(B=st.integers(1, 3), L=st.integers(1, 6), K=st.integers(1, 5), width=st.integers(1, 40),
       seed=st.integers(0, 10_000), ties=st.booleans())
def test_best_first_equals_host_search_on_small_shapes(B, L, K, width, seed, ties):
    ids, lp = _topk(np.random.default_rng(seed), B, L, K, vocab=8, ties=ties)
    tree = best_first(ids, lp, width)
    for b in range(B):
        _same_tree(_host_tree(tree, b), build_tree(ids[b].numpy(), lp[b].numpy(), width))


def test_zero_mass_nodes_are_absent_as_on_the_host():
    ids, lp = _topk(np.random.default_rng(3), B=2, L=4, K=4)
    lp[:, :, 2:] = -torch.inf  # two ranks per position carry no mass
    tree = best_first(ids, lp, 40)
    for b in range(2):
        want = build_tree(ids[b].numpy(), lp[b].numpy(), 40)
        assert want.size == 2 + 4 + 8 + 16  # every positive-mass string, fewer than 40
        _same_tree(_host_tree(tree, b), want)


def test_chain_and_ancestor_masks_equal_host():
    ids, lp = _topk(np.random.default_rng(5), B=3, L=6, K=4)
    for b in range(3):
        _same_tree(_host_tree(chain(ids, lp), b), build_chain(ids[b].numpy(), lp[b].numpy()))
    tree = best_first(ids, lp, 20)
    seen = tree.ancestors()
    for b in range(3):
        np.testing.assert_array_equal(seen[b].numpy(), ancestor_matrix(_host_tree(tree, b)))


@pytest.mark.parametrize("follow", [0.0, 0.5, 0.9, 1.0])
def test_greedy_accept_equals_host_walk_at_n127_k8_l15(follow):
    """Target argmax rows that follow the tree with probability `follow` per row (else a random token)."""
    rng = np.random.default_rng(int(follow * 10))
    for _ in range(5):
        B = 4
        ids, lp = _topk(rng, B, L=15, K=8)
        sizes = torch.tensor(rng.integers(0, 128, size=B))
        tree = best_first(ids, lp, 127).head(sizes)
        roots = torch.tensor(rng.integers(0, 50, size=B))
        argmax = torch.tensor(rng.integers(0, 50, size=(B, 128)))
        for b in range(B):  # row r's argmax is the token of one of its children, often
            host = _host_tree(tree, b)
            for r in range(host.num_packed):
                kids = host.children(r)
                if len(kids) and rng.random() < follow:
                    argmax[b, r] = int(host.tokens[rng.choice(kids) - 1])
        rows, accepted, committed = greedy_accept(tree, roots, argmax)
        for b in range(B):
            host = _host_tree(tree, b)
            want = greedy_walk(host, argmax[b, : host.num_packed].numpy())
            a = int(accepted[b])
            assert a == want.num_accepted
            np.testing.assert_array_equal(rows[b, 1: a + 1].numpy(), want.path)
            np.testing.assert_array_equal(committed[b, : a + 1].numpy(), want.committed)
