"""Reduced draft vocabulary: frequency map, EAGLE-3 `d2t` offsets, checkpoint round trip,
validation, and decoding with such a head stays lossless."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from cast_trtllm.spec_config import SpecConfig
from cast_trtllm.tree import topk_per_position
from runtime.drafter import DrafterExecutor, load_drafter, random_drafter, save_drafter, with_draft_vocab
from runtime.engine import LLMEngine, Request
from runtime.drafter.config import WEIGHTS_NAME
from runtime.drafter.vocab import DraftHead, DraftScores, coverage, d2t_from_ids, frequent_ids, ids_from_d2t, target_to_draft

from tests.runtime.doubles import tiny_target


@pytest.fixture(scope="module")
def model():
    return tiny_target()[1]


def test_frequent_ids_keep_the_most_common_tokens_and_the_forced_ones_sorted():
    lists = [torch.tensor([5, 5, 5, 9, 9, 1]), torch.tensor([9, 3, 5])]
    assert frequent_ids(lists, vocab_size=12, size=2).tolist() == [5, 9]
    assert frequent_ids(lists, vocab_size=12, size=3, always=[11]).tolist() == [5, 9, 11]
    assert coverage(lists, torch.tensor([5, 9]), 12) == pytest.approx(7 / 9)
    with pytest.raises(ValueError, match="draft vocabulary size"):
        frequent_ids(lists, vocab_size=12, size=13)


def test_d2t_follows_the_eagle3_offset_convention():
    ids = torch.tensor([0, 4, 7, 30])
    d2t = d2t_from_ids(ids)
    assert (torch.arange(4) + d2t).tolist() == ids.tolist()  # target id = draft id + d2t[draft id]
    assert ids_from_d2t(d2t).tolist() == ids.tolist()
    assert target_to_draft(ids, 32)[[0, 4, 7, 30, 1]].tolist() == [0, 1, 2, 3, -1]


def test_a_reduced_vocab_head_saves_d2t_beside_the_zlab_keys_and_loads_exactly(tmp_path, model):
    vocab = torch.tensor([1, 2, 3, 10, 20, 63])
    d = random_drafter(model.config, block_size=5, target_layer_ids=[0, 2], draft_vocab_ids=vocab)
    save_drafter(d, tmp_path)
    tensors = load_file(str(tmp_path / WEIGHTS_NAME))
    assert tensors["d2t"].dtype == torch.int64 and ids_from_d2t(tensors["d2t"]).tolist() == vocab.tolist()
    loaded = load_drafter(tmp_path, model.config, dtype=torch.float64)
    assert loaded.config.draft_vocab_size == 6 and loaded.d2t.dtype == torch.int64
    assert torch.equal(loaded.d2t, d.d2t)


def test_widening_the_draft_vocabulary_keeps_the_weights_and_the_scores_of_the_old_tokens(tmp_path, model):
    d = random_drafter(model.config, block_size=5, target_layer_ids=[0, 2], draft_vocab_ids=torch.tensor([1, 2, 3, 10]))
    wide = with_draft_vocab(d, torch.tensor([20, 1, 2, 3, 10, 40]))
    assert wide.config.draft_vocab_size == 6 and ids_from_d2t(wide.d2t).tolist() == [1, 2, 3, 10, 20, 40]
    assert d.config.draft_vocab_size == 4  # the original head is left as it was
    weights = {k: v for k, v in d.state_dict().items() if k != "d2t"}
    assert all(torch.equal(v, wide.state_dict()[k]) for k, v in weights.items())
    lm_head = model.lm_head.weight.detach()
    hidden = torch.randn(3, model.config.hidden_size)
    narrow_logits, wide_logits = DraftHead(lm_head, d.d2t)(hidden), DraftHead(lm_head, wide.d2t)(hidden)
    assert torch.equal(wide_logits[:, [1, 2, 3, 10]], narrow_logits[:, [1, 2, 3, 10]])
    assert torch.isfinite(wide_logits[:, [20, 40]]).all() and torch.isinf(narrow_logits[:, [20, 40]]).all()
    save_drafter(wide, tmp_path)
    assert torch.equal(load_drafter(tmp_path, model.config).d2t, wide.d2t)
    with pytest.raises(ValueError, match="draft_vocab_size"):
        with_draft_vocab(d, torch.arange(model.config.vocab_size + 1))


def test_a_d2t_that_names_ids_outside_the_target_vocab_is_rejected(tmp_path, model):
    d = random_drafter(model.config, block_size=5, target_layer_ids=[0, 2], draft_vocab_ids=torch.tensor([1, 2, 3]))
    save_drafter(d, tmp_path)
    tensors = load_file(str(tmp_path / WEIGHTS_NAME))
    tensors["d2t"] = torch.tensor([1, 1, 99])
    save_file(tensors, str(tmp_path / WEIGHTS_NAME))
    with pytest.raises(ValueError, match="d2t"):
        load_drafter(tmp_path, model.config)


def test_greedy_decoding_with_a_reduced_vocab_head_equals_ar(model):
    vocab = torch.arange(0, 64, 3)  # a third of the vocabulary: most target tokens are unnameable
    drafter = DrafterExecutor(random_drafter(model.config, block_size=6, draft_vocab_ids=vocab, seed=2), model)
    engine = LLMEngine(model, drafter)
    ar = LLMEngine(model, None, spec=SpecConfig(method="ar")).generate([Request([4, 5, 6], 30)])[0].token_ids
    for method, budget in (("chain", None), ("cast", 15)):
        assert engine.generate([Request([4, 5, 6], 30, method=method, budget=budget)])[0].token_ids == ar


def test_draft_scores_topk_over_the_draft_vocabulary_equals_topk_over_the_spread_logits():
    """The engine's fast path (top K over Vd columns, ids mapped to target ids) must
    give exactly the tree inputs the [B, L, V] contract gives."""
    gen = torch.Generator().manual_seed(3)
    V, Vd = 400, 90
    target_ids = torch.randperm(V, generator=gen)[:Vd].sort().values
    scores = DraftScores(torch.randn(2, 5, Vd, generator=gen), target_ids, V)
    full = scores.full()  # [2, 5, V]
    assert full.shape == (2, 5, V) and torch.isinf(full).sum() == 2 * 5 * (V - Vd)
    ids, lp = scores.topk(8, positions=4)
    assert ids.shape == lp.shape == (2, 4, 8)
    for b in range(2):
        want_ids, want_lp = topk_per_position(full[b, :4], 8)
        np.testing.assert_array_equal(ids[b], want_ids.numpy())
        np.testing.assert_allclose(lp[b], want_lp.numpy(), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="draft-vocabulary ids"):
        DraftScores(torch.randn(1, 5, Vd + 1), target_ids, V)
