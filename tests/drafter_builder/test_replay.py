"""Offline greedy replay: its committed round lengths are those the real decoding loop
commits, round for round, and its diagnostics count what they claim."""

import numpy as np
import pytest
import torch

from cast_trtllm.spec_config import SpecConfig
from cast_trtllm.tree import build_tree
from drafter_builder.blocks import FrozenTarget
from drafter_builder.replay import (
    AnchorScores,
    accepted_path,
    budget_rule,
    chain_rule,
    depth1_reliability,
    first_rejection_ranks,
    mle_exponent,
    node_hits,
    replay,
    score_anchors,
)
from runtime.drafter import DEFAULT_DRAFTER, DrafterExecutor, load_drafter
from runtime.engine import LLMEngine, Request
from runtime.loader import encode_prompt
from tests.runtime.doubles import prefilled


def _scores(ids, prompt_len, topk_ids, topk_lp):
    return AnchorScores(np.array(ids), prompt_len, np.array(topk_ids), np.log(np.array(topk_lp, dtype=np.float32)))


def test_accepted_path_follows_matching_children_only():
    # block of 2 positions, K=2: depth-1 candidates (7, 8), depth-2 candidates (9, 4)
    tree = build_tree(np.array([[7, 8], [9, 4]]), np.log(np.array([[0.6, 0.4], [0.7, 0.3]])), 6)
    assert len(accepted_path(tree, np.array([8, 4, 1]))) == 2  # off-rank branch at both depths
    assert len(accepted_path(tree, np.array([7, 1]))) == 1
    assert len(accepted_path(tree, np.array([5]))) == 0


def test_replay_commits_accepted_path_plus_one_and_is_cut_at_the_end():
    # ids: prompt [0], response 1..5; every anchor proposes the true next two tokens as top-1
    ids = [0, 1, 2, 3, 4, 5]
    topk = [[[ids[p + 1] if p + 1 < 6 else 0, 60], [ids[p + 2] if p + 2 < 6 else 0, 61]] for p in range(1, 5)]
    lp = [[[0.9, 0.1], [0.9, 0.1]]] * 4
    lengths, sizes = replay(_scores(ids, 1, topk, lp), chain_rule)
    assert lengths == [3, 1]  # round at p=1 accepts 2, +1 → p=4; then only 1 token is left
    assert sizes == [2, 2]


def test_depth1_reliability_and_first_rejection_rank_count_hits():
    ids = [0, 1, 2, 3]  # prompt [0]; anchors p = 1, 2 with next tokens 2, 3
    topk = [[[9, 2], [5, 5]], [[9, 7], [5, 5]]]  # p=1: truth at rank 2; p=2: truth outside the top-2
    lp = [[[0.8, 0.2], [0.8, 0.2]]] * 2
    s = _scores(ids, 1, topk, lp)
    rel = depth1_reliability([s])
    assert [(b["mean_score"], b["hit_rate"], b["count"]) for b in rel["bins"]] == [(0.2, 0.5, 2), (0.8, 0.0, 2)]
    assert rel["ece"] == pytest.approx(0.5 * 0.3 + 0.5 * 0.8, abs=1e-4)
    ranks = first_rejection_ranks([s])
    assert ranks == {"events": 2, "rank_2_4": 0.5, "rank_5_2": 0.0, "beyond_2": 0.5}


def test_mle_exponent_recovers_the_power_that_generated_the_hits():
    rng = np.random.default_rng(0)
    logmass = np.log(rng.uniform(0.02, 1.0, 20000))
    for beta in (0.7, 1.0, 2.0):
        hit = rng.uniform(size=logmass.size) < np.exp(beta * logmass)
        assert mle_exponent(logmass, hit) == pytest.approx(beta, rel=0.06)


def test_node_hits_are_the_nodes_the_greedy_walk_accepts():
    ids = [0, 1, 2, 3, 4]
    topk = [[[2, 9], [3, 9], [9, 4]]] + [[[9, 8], [9, 8], [9, 8]]] * 2  # p=1: truth 2, 3 top-1, 4 at rank 2
    lp = [[[0.6, 0.4], [0.6, 0.4], [0.6, 0.4]]] * 3
    logmass, hit = node_hits(_scores(ids, 1, topk, lp), budget=14)  # the whole 2+4+8 universe
    assert hit.sum() == 3 + 0 + 0  # anchor 1 accepts 2, 3, 4; anchors 2 and 3 accept nothing
    assert logmass.shape == hit.shape == (42,)
    assert node_hits(_scores(ids, 1, topk, lp), budget=7)[1].sum() == 2  # 2-3-4 (mass 0.144) is not in the top 7


@pytest.fixture(scope="module")
def shipped(embedded):
    return load_drafter(DEFAULT_DRAFTER, embedded.model.config)


@pytest.mark.parametrize("method, budget", [("chain", 1), ("cast", 15)])
def test_replay_round_lengths_equal_the_decoding_loop_on_the_embedded_target(embedded, shipped, method, budget):
    prompt = encode_prompt(embedded.tokenizer, "Write a Python function that adds two numbers.", chat=True)
    drafter = DrafterExecutor(shipped, embedded.model)
    engine = LLMEngine(embedded.model, drafter, spec=SpecConfig(method, budget))
    out = engine.generate([Request(prompt, max_new_tokens=40)])[0]
    ids = torch.tensor(prompt + out.token_ids)
    taps = prefilled(embedded.model, ids[:-1], drafter.tap_layer_ids)[3]  # taps of every token but the last, as the data shards hold
    frozen = FrozenTarget(embedded.model.embed_tokens.weight, embedded.model.lm_head.weight)
    scores = score_anchors(shipped, frozen, {"ids": ids, "prompt_len": len(prompt), "taps": taps})
    lengths, _ = replay(scores, chain_rule if method == "chain" else budget_rule(budget))
    assert lengths == out.accept_lengths
    assert max(lengths) > 1
