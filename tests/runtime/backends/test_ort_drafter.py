"""The onnxruntime drafter keeps the drafter's law: its block logits equal the torch
`DrafterExecutor`'s (fp32, <= 1e-4) after several context appends, with the full and a
reduced draft vocabulary, one request or a ragged batch; and the one engine on
onnxruntime target + drafter reproduces AR token for token (chain, CAST N = 15)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cast_trtllm.spec_config import SpecConfig
from runtime.drafter import DrafterExecutor, random_drafter
from runtime.engine import LLMEngine, Request
from runtime.backends.slot_pool import CacheFullError
from tests.runtime.doubles import random_target

ort = pytest.importorskip("onnxruntime")
from runtime.backends.ort_drafter import OrtDrafter  # noqa: E402  (needs onnxruntime)
from runtime.backends.ort_target import OrtTarget  # noqa: E402

VOCAB, BLOCK, ATOL = 64, 8, 1e-4
DRAFT_IDS = torch.tensor([0, 2, 3, 5, 8, 13, 21, 34, 40, 55, 63])  # a reduced draft vocabulary (sorted)
PROMPTS = [(1, 2, 3), (40, 41, 7, 7, 7, 2), (9,), (63, 0, 12, 33, 8, 5, 5, 19, 21)]


@pytest.fixture(scope="module")
def model():
    return random_target(seed=5, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx")


def drafters(model, cache_dir, draft_ids=None, seed=3):
    """(onnxruntime, torch) drafters over the same random weights."""
    weights = random_drafter(model.config, num_layers=2, block_size=BLOCK, target_layer_ids=(0, 1), seed=seed, init_std=0.3,
                             draft_vocab_ids=draft_ids)
    return OrtDrafter(weights, model, threads=1, cache_dir=cache_dir), DrafterExecutor(weights, model)


def random_taps(m: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn(m, width, generator=torch.Generator().manual_seed(seed))  # [m, F]


@pytest.mark.parametrize("draft_ids", [None, DRAFT_IDS], ids=["full-vocab", "draft-vocab"])
def test_draft_logits_match_the_torch_executor_after_several_appends(model, cache_dir, draft_ids):
    ours, reference = drafters(model, cache_dir, draft_ids)
    assert (ours.tap_layer_ids, ours.num_draft_positions, ours.mass_exponent) == (
        reference.tap_layer_ids, reference.num_draft_positions, reference.mass_exponent)
    width = len(ours.tap_layer_ids) * model.config.hidden_size
    states = [d.new_state(64) for d in (ours, reference)]
    for round_, m in enumerate((11, 1, 4, 0, 7)):  # prefill, then committed rounds of 1 + A rows
        taps = random_taps(m, width, seed=round_)
        for d, s in zip((ours, reference), states):
            d.append_context(s, taps)
        got, want = (d.draft([s], [round_ * 7 + 1]) for d, s in zip((ours, reference), states))
        assert got.shape == (1, BLOCK - 1, VOCAB)
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        finite = torch.isfinite(want)
        np.testing.assert_allclose(got[finite].numpy(), want[finite].numpy(), atol=ATOL, rtol=0)
    if draft_ids is not None:  # -inf exactly outside the draft vocabulary
        outside = torch.ones(VOCAB, dtype=torch.bool).index_fill_(0, draft_ids, False)
        assert torch.isinf(got[..., outside]).all() and torch.isfinite(got[..., draft_ids]).all()


def test_ragged_batch_draft_returns_each_requests_block_in_order(model, cache_dir):
    ours, reference = drafters(model, cache_dir)
    width = len(ours.tap_layer_ids) * model.config.hidden_size
    out = []
    for d in (ours, reference):
        states = [d.new_state(32) for _ in range(3)]
        for i, s in enumerate(states):  # different context lengths P
            d.append_context(s, random_taps(3 + 5 * i, width, seed=10 + i))
        out.append(d.draft(states, [4, 50, 17]))
    np.testing.assert_allclose(out[0].numpy(), out[1].numpy(), atol=ATOL, rtol=0)


def test_one_context_pass_and_one_draft_pass_over_a_subset_out_of_slot_order(model, cache_dir):
    """append_contexts over several requests at once, then a draft over some of them, in an
    order other than their slots' (a slot in the middle freed): each block equals its own."""
    ours, reference = drafters(model, cache_dir, DRAFT_IDS)
    width = len(ours.tap_layer_ids) * model.config.hidden_size
    taps = [random_taps(2 + 4 * i, width, seed=30 + i) for i in range(4)]
    states = [ours.new_state(48) for _ in taps]
    ours.append_contexts(states, taps)
    ours.append_contexts([states[3], states[0]], [random_taps(3, width, seed=40), random_taps(0, width, seed=0)])
    ours.release(states[1])
    got = ours.draft([states[3], states[0], states[2]], [5, 9, 13])
    for b, (i, root) in enumerate(((3, 5), (0, 9), (2, 13))):
        single = reference.new_state(48)
        reference.append_context(single, taps[i])
        if i == 3:
            reference.append_context(single, random_taps(3, width, seed=40))
        want = reference.draft([single], [root])[0]
        finite = torch.isfinite(want)
        np.testing.assert_allclose(got[b][finite].numpy(), want[finite].numpy(), atol=ATOL, rtol=0)


def test_graphs_are_exported_once_per_drafter_identity(model, cache_dir, capfd):
    drafters(model, cache_dir, seed=11)
    assert "exporting" in capfd.readouterr().err
    drafters(model, cache_dir, seed=11)
    assert "exporting" not in capfd.readouterr().err  # the same weights: reused


def test_refuses_a_full_feature_cache(model, cache_dir):
    ours = drafters(model, cache_dir)[0]
    state = ours.new_state(4)
    with pytest.raises(CacheFullError):
        ours.append_context(state, random_taps(5, len(ours.tap_layer_ids) * model.config.hidden_size, seed=0))


def _generate(target, drafter, prompts, method, budget=None, max_new=40) -> list[list[int]]:
    engine = LLMEngine(target, drafter, spec=SpecConfig(method=method))
    return [r.token_ids for r in engine.generate([Request(p, max_new, method=method, budget=budget) for p in prompts])]


@pytest.mark.parametrize("method, budget", [("chain", None), ("cast", 15)])
def test_greedy_engine_on_onnxruntime_target_and_drafter_reproduces_ar(model, cache_dir, method, budget):
    drafter = drafters(model, cache_dir, DRAFT_IDS)[0]
    target = OrtTarget(model, drafter.tap_layer_ids, threads=1, cache_dir=cache_dir)
    ar = _generate(model, None, PROMPTS, "ar")
    assert _generate(target, drafter, PROMPTS[:1], method, budget) == ar[:1]  # B = 1
    assert _generate(target, drafter, PROMPTS, method, budget) == ar  # B = 4, ragged


def test_a_mixed_batch_of_16_on_onnxruntime_equals_each_request_decoded_alone(model, cache_dir):
    """ar / chain / cast:N / auto (a shared best-first budget) in one batch, requests joining
    while others run: every greedy output equals its prompt decoded alone by torch fp32 AR."""
    from runtime.engine.trees import MeanBudget

    drafter = drafters(model, cache_dir, DRAFT_IDS)[0]
    target = OrtTarget(model, drafter.tap_layer_ids, threads=1, cache_dir=cache_dir)
    gen = torch.Generator().manual_seed(12)
    prompts = [torch.randint(0, VOCAB, (int(n),), generator=gen).tolist() for n in torch.randint(1, 12, (16,))]
    methods = [("ar", None), ("chain", None), ("cast", 3), ("cast", 15), ("cast", "auto")] * 4
    engine = LLMEngine(target, drafter, spec=SpecConfig(method="cast", draft_gate=False), width=lambda _: MeanBudget(4))
    seqs = [engine.add_request(Request(p, 24, method=m, budget=b)) for p, (m, b) in zip(prompts[:10], methods)]
    engine.step()
    seqs += [engine.add_request(Request(p, 24, method=m, budget=b)) for p, (m, b) in zip(prompts[10:], methods[10:])]
    while engine.active:
        engine.step()
    alone = [_generate(model, None, [tuple(p)], "ar", max_new=24)[0] for p in prompts]  # B = 1 each, torch
    assert [s.tokens for s in seqs] == alone
