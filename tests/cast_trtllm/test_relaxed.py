"""Relaxed (lossy) acceptance rules: opt-in, formulas, per-step TV, Eq. 4 proxy."""

import numpy as np
import pytest
import torch

from hypothesis import given, settings
from hypothesis import strategies as st

from cast_trtllm.relaxed import (
    RULES,
    RelaxedRule,
    committed_law,
    relaxed_targets,
    relaxed_speedup,
    relaxed_walk,
    total_variation,
)
from cast_trtllm.sampling import SamplingParams, target_probs
from cast_trtllm.tree import Tree
from cast_trtllm.verify import walk_samples

V = 6
LOSSY_ALPHA = {"cactus": 0.25, "mentored": 0.5, "r-fuzzy": 0.6, "spec-casc": 1.0, "ensemble": 0.3, "spec-contrastive": 0.5}
LOSSLESS_ALPHA = {"cactus": 0.0, "mentored": 0.0, "r-fuzzy": 0.0, "spec-casc": -10.0, "ensemble": 0.0, "spec-contrastive": 0.0}
P = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05], dtype=torch.float64)
Q = torch.tensor([0.05, 0.10, 0.50, 0.20, 0.10, 0.05], dtype=torch.float64)  # peaked where p is not


def depth1_tree(tokens, masses) -> Tree:
    k = len(tokens)
    return Tree(np.asarray(tokens, np.int64), np.ones(k, np.int32), np.full(k, -1, np.int32), np.log(masses))


def test_constructing_a_rule_without_the_lossy_opt_in_fails_and_says_why():
    for name in RULES:
        with pytest.raises(ValueError, match="breaks the target's sampling law.*lossy=True"):
            RelaxedRule(name, 0.5)


@pytest.mark.parametrize(
    "name, alpha",
    [("nope", 0.1), ("mentored", 1.0), ("ensemble", 1.5), ("cactus", -0.1), ("spec-casc", float("nan"))],
)
def test_unknown_rules_and_out_of_range_alpha_raise(name, alpha):
    with pytest.raises(ValueError):
        RelaxedRule(name, alpha, lossy=True)


@pytest.mark.parametrize("name", RULES)
def test_every_rule_runs_a_tree_walk_and_returns_a_root_path(name):
    rule = RelaxedRule(name, LOSSY_ALPHA[name], lossy=True)
    rng = np.random.default_rng(0)
    tree = Tree(
        tokens=np.array([2, 3, 0, 1, 4], np.int64),
        depth=np.array([1, 1, 2, 2, 3], np.int32),
        parent=np.array([-1, -1, 0, 0, 2], np.int32),
        score=np.log([0.5, 0.2, 0.5 * 0.4, 0.5 * 0.3, 0.5 * 0.4 * 0.6]),
    )
    target = torch.from_numpy(rng.normal(size=(tree.num_packed, V)))
    draft = torch.from_numpy(rng.normal(size=(4, V)))
    params = SamplingParams(temperature=0.9, top_k=5)
    for seed in range(5):
        acc = relaxed_walk(tree, target, draft, params, rule, torch.Generator().manual_seed(seed))
        assert np.all(tree.pack_parent[acc.path] == np.concatenate([[0], acc.path[:-1]]))
        assert acc.tokens.tolist() == tree.tokens[acc.path - 1].tolist() and 0 <= acc.next_root < V


@pytest.mark.parametrize("name", RULES)
def test_every_rule_is_lossy_where_draft_and_target_disagree(name):
    tv = total_variation(committed_law(RelaxedRule(name, LOSSY_ALPHA[name], lossy=True), P, Q), P)
    print(f"{name} alpha={LOSSY_ALPHA[name]}: per-step TV from p = {tv:.4f}")
    assert tv > 0.01


@pytest.mark.parametrize("name", RULES)
def test_every_rule_is_lossless_at_its_limiting_alpha(name):
    assert total_variation(committed_law(RelaxedRule(name, LOSSLESS_ALPHA[name], lossy=True), P, Q), P) < 1e-12


def test_rules_with_a_draft_independent_target_commit_exactly_that_target():
    ens = committed_law(RelaxedRule("ensemble", 0.3, lossy=True), P, Q)
    torch.testing.assert_close(ens, 0.3 * Q + 0.7 * P)
    fuzzy = committed_law(RelaxedRule("r-fuzzy", 0.6, lossy=True), P, Q)  # JS(p, q) < 0.6
    torch.testing.assert_close(fuzzy, Q)
    contrast = committed_law(RelaxedRule("spec-contrastive", 0.5, lossy=True), P, Q)
    torch.testing.assert_close(contrast, P**1.5 / Q**0.5 / (P**1.5 / Q**0.5).sum())
    # spec-casc defers to q only when q is confident enough
    casc = RelaxedRule("spec-casc", 0.0, lossy=True)
    torch.testing.assert_close(committed_law(casc, P, Q), Q)  # max q 0.5 >= max p 0.3
    torch.testing.assert_close(committed_law(casc, Q, P), Q)  # max p 0.3 < max q 0.5: stays p(=Q)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), name=st.sampled_from(RULES), alpha=st.floats(0.0, 0.95))
def test_committed_law_is_a_law_for_random_p_q_and_proposal(seed, name, alpha):
    gen = torch.Generator().manual_seed(seed)
    p, q, prop = (torch.softmax(3 * torch.randn(V, generator=gen, dtype=torch.float64), 0) for _ in range(3))
    prop[torch.rand(V, generator=gen) < 0.5] = 0.0
    prop[0] += 1e-3
    law = committed_law(RelaxedRule(name, alpha, lossy=True), p, q, prop / prop.sum())
    assert torch.all(law >= 0)
    torch.testing.assert_close(law.sum(), torch.tensor(1.0, dtype=torch.float64))


def test_cactus_and_mentored_accept_the_draft_more_often_than_strict_sampling():
    for name in ("cactus", "mentored"):
        law = committed_law(RelaxedRule(name, LOSSY_ALPHA[name], lossy=True), P, Q)
        torch.testing.assert_close(law.sum(), torch.tensor(1.0, dtype=torch.float64))
        assert law[2] > P[2]  # the drafter's favourite: lossless sampling commits it with P[2]


@pytest.mark.parametrize("name", RULES)
def test_tree_walk_commits_the_rule_law_with_the_children_proposal(name):
    """Empirical root law of 10^5 walks vs `committed_law(p, q, proposal=q~)` (q~ = drafter
    mass on the 3 retained children, renormalized), within the Monte-Carlo bound."""
    rule = RelaxedRule(name, LOSSY_ALPHA[name], lossy=True)
    params = SamplingParams(temperature=1.0)
    children, masses = [2, 0, 4], np.array([0.5, 0.05, 0.1])
    tree = depth1_tree(children, masses)
    target = torch.cat([torch.log(P)[None], torch.randn(3, V, generator=torch.Generator().manual_seed(1), dtype=torch.float64)])
    draft = torch.log(Q)[None]
    proposal = torch.zeros(V, dtype=torch.float64).index_put_((torch.tensor(children),), torch.from_numpy(masses / masses.sum()))
    law = committed_law(rule, target_probs(target[:1], params)[0], Q, proposal).numpy()
    n = 100_000
    targets = relaxed_targets(tree, target, draft, params, rule)
    last, next_root = walk_samples(tree, targets, n, torch.Generator().manual_seed(2))
    first = np.where(last > 0, tree.tokens[np.maximum(last, 1) - 1], next_root)
    counts = np.bincount(first, minlength=V)
    tv = 0.5 * np.abs(counts / n - law).sum()
    null = 0.5 * np.abs(np.random.default_rng(0).multinomial(n, law, size=2000) / n - law).sum(1)
    print(f"{name}: tree-walk TV vs rule law {tv:.5f}, floor {null.mean():.5f}, bound {np.quantile(null, 0.999):.5f}")
    assert tv <= np.quantile(null, 0.999)


def test_relaxed_walk_rejects_greedy_params_and_short_draft_logits():
    rule = RelaxedRule("ensemble", 0.1, lossy=True)
    tree = depth1_tree([1, 2], np.array([0.6, 0.4]))
    target = torch.zeros(3, V)
    with pytest.raises(ValueError, match="temperature"):
        relaxed_walk(tree, target, torch.zeros(1, V), SamplingParams(temperature=0.0), rule, torch.Generator())
    with pytest.raises(ValueError, match="draft_logits"):
        relaxed_walk(tree, target, torch.zeros(0, V), SamplingParams(), rule, torch.Generator())


def test_eq4_speedup_proxy_scales_with_acceptance_cost_and_response_length():
    assert relaxed_speedup(3.0, 5, 0.2) == pytest.approx(2.0)  # (3 + 1) / (1 + 5 * 0.2)
    assert relaxed_speedup(3.0, 5, 0.2, mean_len_ar=100, mean_len_relaxed=200) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        relaxed_speedup(3.0, 5, 0.2, mean_len_relaxed=0.0)
