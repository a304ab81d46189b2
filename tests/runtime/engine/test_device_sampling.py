"""The device walk at T > 0 (`runtime.device_sampling.sampled_accept`) follows the target law.

The same Monte-Carlo checks as the host walk's (tests/cast_trtllm/test_verify.py, whose
trees and helpers these reuse): n = 10^5 walks of one tree run as one batch, and the
empirical law of what they commit must sit within the 99.9% bound of n draws of the law.
"""

import numpy as np
import pytest
import torch

from cast_trtllm.sampling import SamplingParams, target_probs
from cast_trtllm.tree import Tree
from runtime.device_sampling import sampled_accept
from runtime.device_trees import TreeBatch
from tests.cast_trtllm.test_verify import N_DRAWS, V, make_tree, random_tree
from tests.law import assert_law


def walk(tree: Tree, logits: torch.Tensor, params: list[SamplingParams], seed: int, C: int = V):
    """Each walk's first committed token, its accepted count and committed tokens [B, levels]."""
    B = len(params)
    batch = TreeBatch.from_host([tree], "cpu").select(torch.zeros(B, dtype=torch.int64))
    K = C + 2  # the rank cap the uniforms are laid out for; C child slots are tried
    u = torch.rand(B, tree.max_depth + 1, 2 * K + 1, generator=torch.Generator().manual_seed(seed),
                   dtype=torch.float64)
    rows, accepted, committed = sampled_accept(batch, logits, torch.zeros(B, dtype=torch.int64), params, u, C)
    assert torch.equal(rows[:, 0], torch.zeros(B, dtype=torch.int64))
    return committed[:, 0].numpy(), accepted.numpy(), committed.numpy(), rows.numpy()


@pytest.mark.parametrize("seed, depth, branch, params", [
    (0, 1, 1.0, SamplingParams(temperature=1.0)),
    (3, 3, 0.8, SamplingParams(temperature=0.9)),
    (7, 2, 1.0, SamplingParams(temperature=1.0, top_k=3)),
    (8, 2, 1.0, SamplingParams(temperature=0.8, top_p=0.7)),
])
def test_the_first_committed_token_follows_the_target_law(seed, depth, branch, params):
    rng = np.random.default_rng(seed)
    tree = random_tree(rng, V, depth, branch, rng.dirichlet(np.full(V, 0.5), size=depth))
    logits = torch.from_numpy(rng.normal(size=(tree.num_packed, V)) * 1.5)
    first, accepted, _, rows = walk(tree, logits, [params] * N_DRAWS, seed)
    assert_law(np.bincount(first, minlength=V), target_probs(logits[:1], params)[0].numpy(), f"device seed {seed}")
    assert 0 < (accepted == 0).mean() < 1  # both branches: accepting a child, and all rejected
    assert depth < 3 or accepted.max() >= 2  # the multi-level tree's deep paths were accepted too
    path_ok = [tree.tokens[r - 1] for r in rows[accepted > 0, 1]]  # row 1 of the path is the first token's node
    assert np.array_equal(path_ok, first[accepted > 0])


def test_each_walk_follows_its_own_law_in_a_mixed_batch():
    rng = np.random.default_rng(11)
    tree = random_tree(rng, V, 2, 1.0, rng.dirichlet(np.ones(V), size=2))
    logits = torch.from_numpy(rng.normal(size=(tree.num_packed, V)) * 1.5)
    laws = [SamplingParams(temperature=1.3, top_k=4), SamplingParams(temperature=2.0, top_p=0.9)]
    first, *_ = walk(tree, logits, [laws[i % 2] for i in range(N_DRAWS)], 11)
    for i, law in enumerate(laws):
        assert_law(np.bincount(first[i::2], minlength=V), target_probs(logits[:1], law)[0].numpy(), f"law {i}")


def test_two_token_joint_law_on_a_depth_two_tree_matches_autoregressive_sampling():
    """Second token: from the tree when the walk accepted >= 1 node (the committed column 1);
    otherwise the next round's AR step, drawn here from p2 after the first token."""
    rng = np.random.default_rng(9)
    params = SamplingParams(temperature=1.0, top_k=5)
    p1_logits = torch.from_numpy(rng.normal(size=V) * 1.5)
    p2_logits = torch.from_numpy(rng.normal(size=(V, V)) * 1.5)  # row a: target after token a
    tree = random_tree(rng, V, 2, 1.0, rng.dirichlet(np.ones(V), size=2))
    rows = [p1_logits] + [p2_logits[tree.tokens[i]] if tree.depth[i] == 1 else torch.from_numpy(rng.normal(size=V))
                          for i in range(tree.size)]
    first, accepted, committed, _ = walk(tree, torch.stack(rows), [params] * N_DRAWS, 9)
    second = committed[:, 1].copy()
    fresh = accepted == 0
    p2 = target_probs(p2_logits, params)
    gen = torch.Generator().manual_seed(1)
    second[fresh] = torch.multinomial(p2[torch.from_numpy(first[fresh])], 1, generator=gen)[:, 0].numpy()
    joint = (target_probs(p1_logits[None], params)[0][:, None] * p2).numpy().ravel()
    assert_law(np.bincount(first * V + second, minlength=V * V), joint, "device two-token joint")


def test_a_proposal_equal_to_the_target_on_its_support_never_rejects():
    p = torch.tensor([[0.0, 0.5, 0.3, 0.2, 0.0, 0.0]], dtype=torch.float64)
    tree = make_tree([1, 2, 3], [-1, -1, -1], [0.5, 0.3, 0.2])
    logits = torch.log(torch.cat([p, torch.full((3, V), 1.0 / V, dtype=torch.float64)]))
    _, accepted, _, _ = walk(tree, logits, [SamplingParams()] * 20_000, 0)
    assert np.all(accepted == 1)


def test_an_empty_tree_is_one_autoregressive_draw_from_the_target_law():
    rng = np.random.default_rng(4)
    logits = torch.from_numpy(rng.normal(size=(1, V)))
    first, accepted, _, _ = walk(Tree.empty(), logits, [SamplingParams(temperature=1.0)] * N_DRAWS, 4, C=1)
    assert np.all(accepted == 0)
    assert_law(np.bincount(first, minlength=V), target_probs(logits, SamplingParams())[0].numpy(), "AR step")


def test_the_walk_refuses_uniforms_too_short_for_the_tree():
    tree = make_tree([1, 2], [-1, 0])
    args = TreeBatch.from_host([tree], "cpu"), torch.zeros(3, V), torch.zeros(1, dtype=torch.int64), [SamplingParams()]
    with pytest.raises(ValueError, match="levels"):
        sampled_accept(*args, torch.rand(1, 2, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="children"):
        sampled_accept(*args, torch.rand(1, 3, 5, dtype=torch.float64), children=3)
