"""The exported graphs are wired right: onnxruntime (or onnx's reference evaluator, for the
custom-node flavour) reproduces the torch executors' logits and K/V in fp32."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cast_trtllm.masks import additive_mask, bitmask, position_ids
from cast_trtllm.tree import build_tree, topk_per_position
from engine_builder.onnx_export import (
    export_context, export_draft, export_verify, mask_words, optimization_profiles, profile_shapes,
    truncate_target,
)
from plugins.onnx_schema import register_onnx_schema
from plugins.tree_attention import tree_attention_reference
from runtime.drafter.checkpoint import random_drafter
from runtime.drafter.executor import DrafterExecutor
from runtime.model.graphs import bitmask_to_additive
from tests.runtime.doubles import prefilled, random_target

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
ATOL = 1e-4


def random_tree(vocab: int, budget: int, seed: int, depth: int = 6):
    """A real best-first tree (build_tree over the top-8 of random drafter logits)."""
    logits = torch.randn(depth, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    ids, logprobs = topk_per_position(logits, 8)
    return build_tree(ids.numpy(), logprobs.numpy(), budget)


def verify_case(model, prompt: torch.Tensor, tree, words: int, tap_layer_ids=()):
    """The engine's verify output (logits, taps) plus the matching ONNX feed (prefix K/V layer-major)."""
    backend, slot, _, _ = prefilled(model, prompt, tap_layer_ids, prompt.numel() + tree.num_packed)
    p = backend.prefix_len(slot)
    past_k, past_v = backend.pool.committed(slot)  # [P, layers, Hkv, d]
    pack = np.concatenate([[int(prompt[-1])], tree.tokens]).astype(np.int64)
    logits, taps = backend.verify([slot], [pack], [tree])
    feed = {
        "input_ids": pack, "position_ids": position_ids(tree, p), "bitmask": bitmask(tree, words),
        "past_keys": np.ascontiguousarray(past_k.transpose(1, 0, 2, 3)),  # [layers, P, Hkv, d]
        "past_values": np.ascontiguousarray(past_v.transpose(1, 0, 2, 3)),
    }
    new_keys = slot.pending[0].transpose(0, 1).numpy()  # pending [n, layers, Hkv, d] -> [layers, n, Hkv, d]
    return SimpleNamespace(logits=logits, taps=taps), feed, new_keys


def run_ort(path, feed):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)


def test_bitmask_expands_to_the_additive_ancestor_mask_with_padding_words():
    tree = random_tree(64, budget=40, seed=1)
    words = bitmask(tree, num_words=3)  # 41 tokens: 2 words needed, 1 padding word
    got = bitmask_to_additive(torch.from_numpy(words), torch.float32)
    assert torch.equal(got, additive_mask(tree, 0)[0, 0])


def test_profiles_tile_the_packed_range_one_per_bucket():
    profiles = optimization_profiles([1, 16, 32, 64], mask_words(64), prefix_opt=1024, prefix_max=8192)
    assert [(p["n"]["min"], p["n"]["opt"], p["n"]["max"]) for p in profiles] == [
        (1, 1, 1), (2, 16, 16), (17, 32, 32), (33, 64, 64)]
    inputs = {"input_ids": {"shape": ["n"]}, "bitmask": {"shape": ["n", 2]}, "past_keys": {"shape": [2, "past", 3, 8]}}
    shapes = profile_shapes(profiles[2], inputs)
    assert shapes["bitmask"] == {"min": [17, 2], "opt": [32, 2], "max": [32, 2]}
    assert shapes["past_keys"]["max"] == [2, 8192, 3, 8]
    with pytest.raises(ValueError, match="does not fit"):
        optimization_profiles([16, 128], mask_words(64), 16, 64)


def test_standard_ops_verify_graph_matches_executor_on_random_target(tmp_path):
    model = random_target(seed=1, vocab_size=64)
    prompt = torch.randint(0, 64, (20,), generator=torch.Generator().manual_seed(0))
    record = export_verify(model, tmp_path / "verify.onnx", "onnx", mask_words=2, tap_layer_ids=(0, 1))
    onnx.checker.check_model(str(tmp_path / "verify.onnx"), full_check=True)
    assert record["outputs"] == ["logits", "new_keys", "new_values", "taps"]
    for budget in (0, 15, 40):  # root only, one word, two words: one graph, dynamic n
        tree = random_tree(64, budget, seed=budget)
        out, feed, new_keys = verify_case(model, prompt, tree, words=2, tap_layer_ids=(0, 1))
        logits, keys, _, taps = run_ort(tmp_path / "verify.onnx", feed)
        np.testing.assert_allclose(logits, out.logits.numpy(), atol=ATOL, rtol=0)
        np.testing.assert_allclose(keys, new_keys, atol=ATOL, rtol=0)
        np.testing.assert_allclose(taps, out.taps.numpy(), atol=ATOL, rtol=0)


def test_plugin_node_verify_graph_matches_executor_with_reference_node(tmp_path):
    """The cast::tree_attention flavour, evaluated by onnx's reference evaluator with the
    node implemented by the op's torch reference (TensorRT itself is not available here)."""
    from onnx.reference import ReferenceEvaluator
    from onnx.reference.op_run import OpRun

    class tree_attention(OpRun):  # noqa: N801 (class name = ONNX op_type)
        op_domain = "cast"

        def _run(self, *inputs, scale=None, plugin_namespace=None, plugin_version=None, aot=None):
            return (tree_attention_reference(*(torch.from_numpy(np.asarray(x)) for x in inputs), scale=scale).numpy(),)

    model = random_target(seed=2, vocab_size=64)
    prompt = torch.randint(0, 64, (11,), generator=torch.Generator().manual_seed(1))
    export_verify(model, tmp_path / "verify_plugin.onnx", "plugin", mask_words=1)
    register_onnx_schema()
    graph = onnx.load(str(tmp_path / "verify_plugin.onnx"))
    onnx.checker.check_model(graph, full_check=True)
    nodes = [n for n in graph.graph.node if n.domain == "cast"]
    assert len(nodes) == model.config.num_layers and {n.op_type for n in nodes} == {"tree_attention"}
    assert not any(n.op_type == "Softmax" for n in graph.graph.node)  # attention lives in the plugin only
    tree = random_tree(64, budget=15, seed=3)
    out, feed, new_keys = verify_case(model, prompt, tree, words=1)
    logits, keys, _ = ReferenceEvaluator(graph, new_ops=[tree_attention]).run(None, feed)
    np.testing.assert_allclose(logits, out.logits.numpy(), atol=ATOL, rtol=0)
    np.testing.assert_allclose(keys, new_keys, atol=ATOL, rtol=0)


@pytest.mark.parametrize("draft_vocab", [None, torch.tensor([1, 2, 9, 30, 31, 63])], ids=["full-vocab", "reduced-vocab"])
def test_draft_and_context_graphs_match_drafter_executor(tmp_path, draft_vocab):
    target = random_target(seed=3, vocab_size=64)
    drafter = random_drafter(target.config, num_layers=2, block_size=5, target_layer_ids=(0, 1), seed=4, init_std=0.3,
                             draft_vocab_ids=draft_vocab)
    prompt = torch.randint(0, 64, (13,), generator=torch.Generator().manual_seed(2))
    taps = prefilled(target, prompt, drafter.config.target_layer_ids, 32)[3]
    draft = DrafterExecutor(drafter, target)
    cache = draft.new_state(32)
    draft.append_context(cache, taps)
    want = draft.draft([cache], [9])[0]  # [L, V]

    export_context(drafter, tmp_path / "context.onnx")
    export_draft(drafter, target, tmp_path / "draft.onnx")
    keys, values = run_ort(tmp_path / "context.onnx", {"taps": taps.numpy(), "position_ids": np.arange(13)})
    committed = draft.pool.committed(cache)[0]  # [13, layers, Hkv, d]
    np.testing.assert_allclose(keys, committed.transpose(1, 0, 2, 3), atol=ATOL, rtol=0)
    block = np.array([9] + [drafter.config.mask_token_id] * 4)
    (logits,) = run_ort(tmp_path / "draft.onnx", {
        "block_ids": block, "position_ids": np.arange(13, 18), "context_keys": keys, "context_values": values})
    np.testing.assert_allclose(logits, want.numpy(), atol=ATOL, rtol=0)  # -inf outside a reduced vocabulary too


@pytest.fixture(scope="module")
def embedded_case(embedded):
    """(model, prompt ids) over the session's embedded target (tests/conftest.py)."""
    from runtime.loader import encode_prompt

    prompt = encode_prompt(embedded.tokenizer, "Explain in two sentences why the sky is blue.", chat=True)
    return embedded.model, torch.tensor(prompt)


def _check_embedded(model, prompt, path):
    export_verify(model, path, "onnx", mask_words=2)  # 2 words: padding past the 16-token pack
    tree = random_tree(model.config.vocab_size, budget=15, seed=7)
    out, feed, new_keys = verify_case(model, prompt, tree, words=2)
    logits, keys, _ = run_ort(path, feed)
    np.testing.assert_allclose(logits, out.logits.numpy(), atol=ATOL, rtol=0)
    np.testing.assert_allclose(keys, new_keys, atol=ATOL, rtol=0)


def test_standard_ops_verify_graph_matches_executor_on_embedded_target_first_layers(embedded_case, tmp_path):
    """Export cost: the embedded target is cut to its first 6 layers (shared weights, same
    norm and tied lm_head) and compared with the executor over the SAME 6-layer model;
    the full 30-layer export is the slow test below."""
    model, prompt = embedded_case
    _check_embedded(truncate_target(model, 6), prompt, tmp_path / "verify.onnx")


@pytest.mark.slow
def test_standard_ops_verify_graph_matches_executor_on_full_embedded_target(embedded_case, tmp_path):
    model, prompt = embedded_case
    _check_embedded(model, prompt, tmp_path / "verify.onnx")
