"""Our compact target forward, as the engine runs it (`TorchTarget`), equals the HF model
(logits, taps, packed verify, commit)."""

import numpy as np
import pytest
import torch

from cast_trtllm.tree import Tree
from runtime.engine.backend import TorchTarget
from runtime.model.llama import LlamaTarget, TargetConfig

from tests.runtime.doubles import fresh_kv, prefilled, tiny_target
from tests.runtime.hf_checkpoints import FAMILIES, tiny_hf_model


def _tree(parent, tokens):
    parent = np.asarray(parent, np.int32)
    depth = np.zeros(len(parent), np.int32)
    for i, p in enumerate(parent):
        depth[i] = 1 if p < 0 else depth[p] + 1
    return Tree(np.asarray(tokens, np.int64), depth, parent, np.zeros(len(parent)))


def _hf_logits_and_hidden(hf, ids):
    with torch.no_grad():
        out = hf(torch.as_tensor(ids)[None], output_hidden_states=True)
    return out.logits[0], [h[0] for h in out.hidden_states]


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_prefill_logits_and_taps_equal_hf(model_type):
    hf, model = tiny_target(model_type)
    ids = [3, 17, 5, 42, 9, 11, 60, 2]
    ref_logits, hidden = _hf_logits_and_hidden(hf, ids)
    _, _, logits, taps = prefilled(model, ids, [0, 2])  # 2 = last layer (HF: after final norm)
    assert torch.allclose(logits[0], ref_logits[-1], rtol=1e-5, atol=1e-4)
    assert torch.allclose(taps, torch.cat([hidden[1], hidden[3]], dim=-1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_equals_hf_with_its_biases_norms_and_rope(family):
    """llama: llama3 RoPE scaling, untied head; qwen2: random q/k/v biases; qwen3: q/k norm."""
    hf = tiny_hf_model(family)
    model = LlamaTarget.from_hf(hf)
    assert model.config.attention_bias == (family == "qwen2") and not model.config.o_proj_bias
    assert model.layers[0].self_attn.q_proj.bias is None or model.layers[0].self_attn.q_proj.bias.abs().sum() > 0
    ids = [257, 3, 17, 5, 42, 9, 11, 60, 2, 258]
    ref_logits, hidden = _hf_logits_and_hidden(hf, ids)
    _, _, logits, taps = prefilled(model, ids, [0, 1])
    assert (logits[0] - ref_logits[-1]).abs().max().item() <= 1e-4
    assert torch.allclose(taps, torch.cat([hidden[1], hidden[2]], dim=-1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "model_type, changes, message",
    [
        ("gpt2", {}, "model_type 'gpt2' is not supported; supported: llama, qwen2, qwen3"),
        ("llama", {"mlp_bias": True}, "mlp_bias"),
        ("llama", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ("llama", {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
         "RoPE type 'dynamic'"),
        ("qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}, "sliding-window"),
    ],
)
def test_checkpoint_features_the_forward_does_not_compute_are_refused(model_type, changes, message):
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type, num_hidden_layers=2, **changes)
    with pytest.raises(ValueError, match=message):
        TargetConfig.from_hf(config)


def test_packed_tree_verify_equals_separate_causal_passes():
    hf, model = tiny_target()
    prompt = [1, 2, 3, 4]
    # root b=7 with children 8, 9; 8 has child 10; 9 has child 11
    tree = _tree([-1, -1, 0, 1], [8, 9, 10, 11])
    backend, slot, _, _ = prefilled(model, prompt, [1])
    logits, taps = backend.verify([slot], [np.array([7, 8, 9, 10, 11])], [tree])
    for row, path in enumerate([[7], [7, 8], [7, 9], [7, 8, 10], [7, 9, 11]]):
        ref, hidden = _hf_logits_and_hidden(hf, prompt + path)
        assert torch.allclose(logits[row], ref[-1], rtol=1e-5, atol=1e-4), row
        assert torch.allclose(taps[row], hidden[2][-1], rtol=1e-5, atol=1e-4), row


def test_commit_leaves_the_cache_of_a_fresh_prefill():
    _, model = tiny_target()
    prompt = [1, 2, 3, 4]
    tree = _tree([-1, -1, 0, 1], [8, 9, 10, 11])
    backend, slot, _, _ = prefilled(model, prompt, [1])
    backend.verify([slot], [np.array([7, 8, 9, 10, 11])], [tree])
    backend.commit(slot, np.array([0, 2, 4]))  # the root, then accept 9 and 11
    assert backend.prefix_len(slot) == 7
    for ours, fresh in zip(backend.pool.committed(slot), fresh_kv(model, prompt + [7, 9, 11])):
        np.testing.assert_allclose(ours, fresh, rtol=1e-5, atol=1e-4)


def test_embedded_logits_equal_hf_fp32(embedded_hf, embedded):
    hf, tok = embedded_hf
    ids = tok("The CAST decoder verifies a tree of drafted tokens in one pass.").input_ids
    with torch.no_grad():
        ref = hf(torch.tensor(ids)[None]).logits[0]
    backend, slot, _, _ = prefilled(embedded.model, ids[:-4])
    chain = _tree([-1, 0, 1], ids[-3:])
    logits, _ = backend.verify([slot], [np.array(ids[-4:])], [chain])
    assert (logits - ref[-4:]).abs().max().item() <= 1e-4


def test_tap_ids_outside_the_target_are_rejected():
    _, model = tiny_target()
    with pytest.raises(ValueError, match="outside the target's 3 layers"):
        TorchTarget(model, tap_layer_ids=[3])
