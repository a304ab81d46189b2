"""Acceptance: greedy tree walk and the distribution-preserving stochastic walk (Theorem 3).

Distribution tests compare the empirical law of committed tokens from n = 10^5 seeded
walks with the true target law. The Monte-Carlo floor is the total variation that an
empirical law of n draws of the TRUE law itself shows: we simulate 2,000 such empirical
laws (multinomial), report their mean TV ("floor") and assert the walk's TV is below
their 99.9% quantile.
"""

import numpy as np
import pytest
import torch

from cast_trtllm.sampling import SamplingParams, sample_from, target_probs
from cast_trtllm.tree import Tree, build_chain, build_tree
from cast_trtllm.verify import (
    greedy_walk,
    lossless_targets,
    stochastic_walk,
    walk_samples,
)
from tests.law import assert_law

N_DRAWS = 100_000
V = 6


def make_tree(tokens, parent, q_of_node=None) -> Tree:
    """Tree from token/parent lists; score = log path product of per-node drafter mass."""
    parent = np.asarray(parent, np.int32)
    depth = np.zeros(len(tokens), np.int32)
    score = np.zeros(len(tokens))
    mass = np.full(len(tokens), 0.5) if q_of_node is None else np.asarray(q_of_node, float)
    for i, par in enumerate(parent):
        depth[i] = 1 if par < 0 else depth[par] + 1
        score[i] = np.log(mass[i]) + (0.0 if par < 0 else score[par])
    return Tree(np.asarray(tokens, np.int64), depth, parent, score)


# pack 1: A=10 (root child), 2: B=11 (root child), 3: C=12 (under A), 4: D=13 (under A),
# 5: E=14 (under C), 6: F=15 (under B). Longest path: A -> C -> E.
BRANCHY = make_tree([10, 11, 12, 13, 14, 15], [-1, -1, 0, 0, 2, 1])


def argmax_rows(n, **rows):
    out = np.full(n, 99, np.int64)
    for row, tok in rows.items():
        out[int(row[1:])] = tok
    return out


def test_greedy_walk_accepts_nothing_when_no_root_child_matches():
    acc = greedy_walk(BRANCHY, argmax_rows(7, r0=42))
    assert acc.path.tolist() == [] and acc.tokens.tolist() == [] and acc.next_root == 42


def test_greedy_walk_accepts_a_path_that_is_not_the_longest():
    acc = greedy_walk(BRANCHY, argmax_rows(7, r0=11, r2=15, r6=7))
    assert acc.path.tolist() == [2, 6] and acc.tokens.tolist() == [11, 15] and acc.next_root == 7


def test_greedy_walk_accepts_the_longest_path_and_takes_a_bonus_token():
    acc = greedy_walk(BRANCHY, argmax_rows(7, r0=10, r1=12, r3=14, r5=42))
    assert acc.path.tolist() == [1, 3, 5] and acc.tokens.tolist() == [10, 12, 14]
    assert acc.next_root == 42 and acc.committed.tolist() == [10, 12, 14, 42]


def test_greedy_walk_stops_at_a_mismatch_inside_the_tree():
    acc = greedy_walk(BRANCHY, argmax_rows(7, r0=10, r1=13, r4=5))
    assert acc.path.tolist() == [1, 4] and acc.next_root == 5


def test_greedy_walk_on_a_depth_one_tree():
    tree = make_tree([3, 1, 4], [-1, -1, -1])
    acc = greedy_walk(tree, np.array([1, 8, 9, 7]))
    assert acc.path.tolist() == [2] and acc.tokens.tolist() == [1] and acc.next_root == 9


def test_greedy_walk_on_a_chain_shaped_tree():
    chain = build_chain(np.array([[5], [6], [7], [8]]), np.log(np.array([[0.9], [0.8], [0.7], [0.6]])))
    assert greedy_walk(chain, np.array([5, 6, 0, 0, 0])).path.tolist() == [1, 2]
    acc = greedy_walk(chain, np.array([5, 6, 7, 8, 9]))
    assert acc.tokens.tolist() == [5, 6, 7, 8] and acc.next_root == 9


def test_greedy_walk_on_the_root_only_tree_is_one_autoregressive_step():
    acc = greedy_walk(Tree.empty(), np.array([17]))
    assert acc.num_accepted == 0 and acc.next_root == 17


def test_greedy_walk_rejects_target_rows_of_the_wrong_length():
    with pytest.raises(ValueError, match="target_argmax"):
        greedy_walk(BRANCHY, np.zeros(6, np.int64))


# ----------------------------------------------------------------------------- sampling


def depth1_ancestor(tree: Tree) -> np.ndarray:
    """[n] pack index of each row's depth-1 ancestor (0 for the root)."""
    anc = np.zeros(tree.num_packed, np.int64)
    for i, par in enumerate(tree.parent):
        anc[i + 1] = i + 1 if par < 0 else anc[par + 1]
    return anc


def first_tokens(tree: Tree, last: np.ndarray, next_root: np.ndarray) -> np.ndarray:
    anc = depth1_ancestor(tree)
    return np.where(last > 0, tree.tokens[np.maximum(anc[last], 1) - 1] if tree.size else 0, next_root)


def random_tree(rng, vocab: int, max_depth: int, branch: float, q_marginals: np.ndarray) -> Tree:
    """Random prefix-closed tree; each node keeps a random nonempty subset of tokens as
    children; score = sum of log q_d (DFlash marginals depend on the position only)."""
    tokens, parent, mass = [], [], []
    frontier = [(-1, 0)]
    while frontier:
        node, d = frontier.pop(0)
        if d == max_depth or (d > 0 and rng.random() > branch):
            continue
        kids = rng.choice(vocab, size=int(rng.integers(1, vocab)), replace=False)
        for tok in kids:
            tokens.append(int(tok)), parent.append(node), mass.append(q_marginals[d, tok])
            frontier.append((len(tokens) - 1, d + 1))
    return make_tree(tokens, parent, mass)


def check_first_token_law(tree: Tree, logits: torch.Tensor, params: SamplingParams, seed: int, label: str):
    targets = lossless_targets(tree, logits, params)
    last, next_root = walk_samples(tree, targets, N_DRAWS, torch.Generator().manual_seed(seed))
    counts = np.bincount(first_tokens(tree, last, next_root), minlength=logits.shape[1])
    assert_law(counts, target_probs(logits[:1], params)[0].numpy(), label)
    return last


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_committed_first_token_follows_p_on_random_depth_one_trees(seed):
    rng = np.random.default_rng(seed)
    q = rng.dirichlet(np.full(V, 0.5), size=1)
    tree = random_tree(rng, V, 1, 1.0, q)
    logits = torch.from_numpy(rng.normal(size=(tree.num_packed, V)) * 1.5)
    check_first_token_law(tree, logits, SamplingParams(temperature=1.0), seed, f"depth-1 seed {seed}")


@pytest.mark.parametrize("seed", [3, 4])
def test_committed_first_token_follows_p_on_random_multi_level_trees(seed):
    rng = np.random.default_rng(seed)
    q = rng.dirichlet(np.full(V, 0.5), size=3)
    tree = random_tree(rng, V, 3, 0.8, q)
    assert tree.max_depth == 3
    logits = torch.from_numpy(rng.normal(size=(tree.num_packed, V)) * 1.5)
    last = check_first_token_law(tree, logits, SamplingParams(temperature=0.9), seed, f"multi-level seed {seed}")
    assert tree.pack_depth[last].max() >= 2  # deep paths were actually accepted


def test_committed_first_token_follows_p_when_proposal_equals_target():
    rng = np.random.default_rng(5)
    logits = torch.from_numpy(rng.normal(size=(1, V)) * 1.5)
    p = target_probs(logits, SamplingParams())[0].numpy()
    keep = np.argsort(-p)[:3]  # the drafter's top-3 of q == p
    tree = make_tree(keep, [-1, -1, -1], p[keep])
    full = torch.cat([logits, torch.from_numpy(rng.normal(size=(3, V)))])
    check_first_token_law(tree, full, SamplingParams(), 5, "p == q")


def test_proposal_equal_to_target_on_its_support_never_rejects():
    p = torch.tensor([[0.0, 0.5, 0.3, 0.2, 0.0, 0.0]], dtype=torch.float64)
    tree = make_tree([1, 2, 3], [-1, -1, -1], [0.5, 0.3, 0.2])
    logits = torch.log(torch.cat([p, torch.full((3, V), 1.0 / V, dtype=torch.float64)]))
    targets = lossless_targets(tree, logits, SamplingParams())
    last, _ = walk_samples(tree, targets, 20_000, torch.Generator().manual_seed(0))
    assert np.all(last > 0)


def test_committed_first_token_follows_p_when_the_drafter_has_zeros_outside_one_child():
    rng = np.random.default_rng(6)
    tree = make_tree([2, 4, 0], [-1, 0, 1], [1.0, 1.0, 1.0])  # chain; q a point mass per position
    logits = torch.from_numpy(rng.normal(size=(4, V)))
    check_first_token_law(tree, logits, SamplingParams(), 6, "q point mass (zeros outside the child)")


def test_committed_first_token_follows_top_k_law_with_children_outside_the_top_k():
    rng = np.random.default_rng(7)
    logits = torch.from_numpy(rng.normal(size=(1, V)) * 2)
    order = np.argsort(-logits[0].numpy())
    kids = [order[5], order[0], order[3], order[1]]  # two children have zero target mass
    tree = make_tree(kids, [-1, -1, -1, -1], [0.4, 0.1, 0.3, 0.2])
    full = torch.cat([logits, torch.from_numpy(rng.normal(size=(4, V)))])
    check_first_token_law(tree, full, SamplingParams(temperature=1.0, top_k=3), 7, "top-k 3")


def test_committed_first_token_follows_top_p_law():
    rng = np.random.default_rng(8)
    q = rng.dirichlet(np.ones(V), size=2)
    tree = random_tree(rng, V, 2, 1.0, q)
    logits = torch.from_numpy(rng.normal(size=(tree.num_packed, V)) * 1.5)
    check_first_token_law(tree, logits, SamplingParams(temperature=0.8, top_p=0.7), 8, "top-p 0.7 T 0.8")


def test_two_token_joint_law_on_a_depth_two_tree_matches_autoregressive_sampling():
    """Second token: from the tree when the round accepted >= 1 node, else from the
    next round (an autoregressive step at prefix b, a). Law: p1(a) * p2[a](b)."""
    rng = np.random.default_rng(9)
    params = SamplingParams(temperature=1.0, top_k=5)
    p1_logits = torch.from_numpy(rng.normal(size=V) * 1.5)
    p2_logits = torch.from_numpy(rng.normal(size=(V, V)) * 1.5)  # row a: target after token a
    tree = random_tree(rng, V, 2, 1.0, rng.dirichlet(np.ones(V), size=2))
    rows = [p1_logits]
    for i in range(tree.size):  # depth-1 rows see a; deeper rows are irrelevant noise
        rows.append(p2_logits[tree.tokens[i]] if tree.depth[i] == 1 else torch.from_numpy(rng.normal(size=V)))
    logits = torch.stack(rows)
    gen = torch.Generator().manual_seed(9)
    last, next_root = walk_samples(tree, lossless_targets(tree, logits, params), N_DRAWS, gen)
    first = first_tokens(tree, last, next_root)
    depth = tree.pack_depth[last]
    second = np.where(depth >= 2, 0, next_root)
    deep = depth >= 2  # depth-2 ancestor is the node after the first
    second[deep] = [tree.tokens[tree.path_to(v)[1] - 1] for v in last[deep]]
    fresh = depth == 0  # round committed one token: the next round samples after it
    p2 = target_probs(p2_logits, params)
    u = torch.rand(int(fresh.sum()), generator=gen, dtype=torch.float64)
    second[fresh] = sample_from(p2[torch.from_numpy(first[fresh])], u).numpy()
    joint = (target_probs(p1_logits[None], params)[0][:, None] * p2).numpy().ravel()
    counts = np.bincount(first * V + second, minlength=V * V)
    assert_law(counts, joint, "two-token joint, depth-2 tree, top-k 5")


def test_stochastic_walk_is_reproducible_from_the_generator_seed():
    rng = np.random.default_rng(10)
    tree = random_tree(rng, V, 3, 0.7, rng.dirichlet(np.ones(V), size=3))
    logits = torch.from_numpy(rng.normal(size=(tree.num_packed, V)))
    params = SamplingParams(temperature=1.0, seed=123)
    runs = [stochastic_walk(tree, logits, params, params.generator()) for _ in range(2)]
    assert runs[0].path.tolist() == runs[1].path.tolist() and runs[0].next_root == runs[1].next_root
    outcomes = {tuple(stochastic_walk(tree, logits, params, torch.Generator().manual_seed(s)).committed) for s in range(40)}
    assert len(outcomes) > 1


def test_stochastic_walk_at_temperature_zero_is_the_greedy_walk():
    logits = torch.full((7, 20), -5.0)
    for row, tok in {0: 10, 1: 12, 3: 14, 5: 3}.items():
        logits[row, tok] = 5.0
    acc = stochastic_walk(BRANCHY, logits, SamplingParams(temperature=0.0), torch.Generator())
    assert acc.path.tolist() == [1, 3, 5] and acc.next_root == 3


def test_stochastic_walk_rejects_bad_inputs():
    gen = torch.Generator()
    with pytest.raises(ValueError, match="target_logits"):
        stochastic_walk(BRANCHY, torch.zeros(6, 20), SamplingParams(), gen)
    twins = make_tree([3, 3], [-1, -1])
    with pytest.raises(ValueError, match="distinct"):
        stochastic_walk(twins, torch.zeros(3, 8), SamplingParams(), gen)
    with pytest.raises(ValueError, match="temperature"):
        lossless_targets(BRANCHY, torch.zeros(7, 20), SamplingParams(temperature=0.0))


def test_the_law_check_catches_a_verifier_that_resamples_rejections_from_p():
    """Power check: resampling a rejected node from p instead of (p - q~)_+ is biased."""
    rng = np.random.default_rng(12)
    tree = make_tree([0, 1], [-1, -1], [0.7, 0.3])
    logits = torch.from_numpy(rng.normal(size=(3, V)))
    params = SamplingParams()

    def resample_from_p(row, child_tokens, q):
        p = target_probs(logits[row : row + 1], params)[0]
        if len(child_tokens) == 0:
            return p, None
        q_vec = torch.zeros(V, dtype=torch.float64).index_put_((child_tokens,), q)
        return p, lambda x: (p[x], (p + q_vec).expand(len(x), -1))  # (p + q~ - q~)_+ = p

    last, next_root = walk_samples(tree, resample_from_p, N_DRAWS, torch.Generator().manual_seed(0))
    counts = np.bincount(first_tokens(tree, last, next_root), minlength=V)
    with pytest.raises(AssertionError, match="above the Monte-Carlo bound"):
        assert_law(counts, target_probs(logits[:1], params)[0].numpy(), "resample-from-p (wrong)")


def test_an_exhausted_residual_falls_back_to_the_node_target_law():
    tree = make_tree([2], [-1])
    point_mass = torch.zeros(V, dtype=torch.float64).index_fill_(0, torch.tensor([5]), 1.0)

    def always_reject_with_empty_residual(row, child_tokens, q):
        if len(child_tokens) == 0:
            return point_mass, None
        q_vec = torch.zeros(V, dtype=torch.float64).index_put_((child_tokens,), q)
        return point_mass, lambda x: (torch.zeros(len(x), dtype=torch.float64), q_vec.expand(len(x), -1))

    last, next_root = walk_samples(tree, always_reject_with_empty_residual, 100, torch.Generator())
    assert np.all(last == 0) and np.all(next_root == 5)
