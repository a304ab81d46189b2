"""The tree-attention backend leaves the executor's logits unchanged (vs the SDPA backend)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():  # the Triton test runs through the interpreter on CPU
    os.environ.setdefault("TRITON_INTERPRET", "1")

from cast_trtllm.masks import ancestor_matrix, bitmask  # noqa: E402
from cast_trtllm.tree import build_tree, topk_per_position  # noqa: E402
from plugins.tree_attention import triton_available  # noqa: E402
from runtime.model.attention import SdpaAttention  # noqa: E402
from runtime.model.tree_attention_backend import TreeAttention, causal_chain  # noqa: E402
from tests.runtime.doubles import random_target  # noqa: E402
from runtime.target import TargetExecutor  # noqa: E402


def random_tree(vocab: int, depth: int, budget: int, seed: int):
    """A real best-first tree from random drafter logits (top-8 per position)."""
    logits = torch.randn(depth, vocab, generator=torch.Generator().manual_seed(seed)) * 3
    ids, logprobs = topk_per_position(logits, 8)
    return build_tree(ids.numpy(), logprobs.numpy(), budget)


def verify_logits(model, backend, prompt: torch.Tensor, rounds: list) -> list[torch.Tensor]:
    """Prefill, then verify each (pack, tree, accepted path) round and commit the path."""
    executor = TargetExecutor(model, attention_backend=backend)
    executor.reset(256)
    out = [executor.prefill(prompt).logits]
    for pack, tree, path in rounds:
        out.append(executor.verify(pack, tree).logits)
        executor.commit(path)
    return out


def make_rounds(vocab: int, seed: int) -> list:
    rounds = []
    for r in range(2):
        tree = random_tree(vocab, depth=5, budget=15, seed=seed + r)
        pack = torch.from_numpy(np.concatenate([[7 + r], tree.tokens])).long()
        path = tree.path_to(tree.num_packed - 1)  # commit the deepest-last node's path
        rounds.append((pack, tree, path))
    return rounds


def test_causal_chain_bitmask_is_lower_triangular():
    for n in (1, 2, 33, 70):
        assert np.array_equal(ancestor_matrix(causal_chain(n)), np.tril(np.ones((n, n), dtype=bool)))


def test_prepare_rejects_a_tree_of_another_size():
    tree = random_tree(64, depth=3, budget=5, seed=0)
    with pytest.raises(ValueError, match="packs 6 tokens but 4"):
        TreeAttention().prepare(10, 4, tree, torch.float32, torch.device("cpu"))
    prepared = TreeAttention().prepare(10, 6, tree, torch.float32, torch.device("cpu"))
    assert np.array_equal(prepared.bitmask.numpy(), bitmask(tree))
    assert prepared.cu_prefix.tolist() == [0, 10] and prepared.cu_seqlens.tolist() == [0, 6]


def test_reference_backend_verify_logits_equal_sdpa_on_random_target():
    model = random_target(seed=1, vocab_size=64)
    prompt = torch.randint(0, 64, (21,), generator=torch.Generator().manual_seed(0))
    rounds = make_rounds(64, seed=3)
    expected = verify_logits(model, SdpaAttention(), prompt, rounds)
    for got, want in zip(verify_logits(model, TreeAttention("reference"), prompt, rounds), expected):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


def _triton_runnable() -> str | None:
    if not triton_available():
        return "triton is not installed"
    import triton

    from plugins.tree_attention.triton_kernel import tree_attention_fwd_kernel

    if not torch.cuda.is_available() and isinstance(tree_attention_fwd_kernel, triton.runtime.jit.JITFunction):
        return "triton was imported before TRITON_INTERPRET=1 was set (run this file on its own)"
    return None


@pytest.mark.skipif(_triton_runnable() is not None, reason=str(_triton_runnable()))
def test_triton_backend_verify_logits_equal_sdpa_on_random_target():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = random_target(seed=2, vocab_size=64).to(device)
    prompt = torch.randint(0, 64, (9,), generator=torch.Generator().manual_seed(1))
    rounds = make_rounds(64, seed=5)[:1]
    expected = verify_logits(model, SdpaAttention(), prompt, rounds)
    for got, want in zip(verify_logits(model, TreeAttention("triton"), prompt, rounds), expected):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


@pytest.fixture(scope="module")
def embedded_case(embedded):
    """(model, prompt ids) over the session's embedded target (tests/conftest.py)."""
    from runtime.loader import encode_prompt

    prompt = encode_prompt(embedded.tokenizer, "Write a Python function that reverses a list.", chat=True)
    return embedded.model, torch.tensor(prompt)


def test_tree_attention_verify_logits_equal_sdpa_on_embedded_target(embedded_case):
    model, prompt = embedded_case
    rounds = make_rounds(model.config.vocab_size, seed=11)
    expected = verify_logits(model, SdpaAttention(), prompt, rounds)
    got = verify_logits(model, TreeAttention(), prompt, rounds)  # "auto": the reference on CPU
    for g, w in zip(got, expected):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-5)
