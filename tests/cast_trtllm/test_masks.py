"""Mask formats agree with each other and with the tree."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cast_trtllm.masks import (
    additive_mask,
    ancestor_matrix,
    batched_bitmask,
    bitmask,
    cu_seqlens,
    position_ids,
)
from cast_trtllm.tree import build_chain, build_tree, topk_per_position


def unpack_bitmask(words: np.ndarray, n: int) -> np.ndarray:
    """Inverse of `bitmask`: [n, W] int32 -> [n, n] bool."""
    bits = np.unpackbits(np.ascontiguousarray(words[:n]).view(np.uint8).reshape(n, -1, 4), axis=-1, bitorder="little")
    return bits.reshape(n, -1)[:, :n].astype(bool)


def _tree(seed: int, budget: int, L: int = 6, K: int = 3):
    ids, lp = topk_per_position(torch.randn(L, 20, generator=torch.Generator().manual_seed(seed)), K)
    return build_tree(ids.numpy(), lp.double().numpy(), budget)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), budget=st.integers(0, 200), prefix=st.integers(0, 7))
def test_all_mask_formats_agree(seed, budget, prefix):
    tree = _tree(seed, budget)
    n = tree.num_packed
    anc = ancestor_matrix(tree)
    # the ancestor matrix marks exactly the root-to-node path
    for t in range(n):
        expected = {0, t} | set(tree.path_to(t).tolist()) if t else {0}
        assert set(np.flatnonzero(anc[t]).tolist()) == expected
    add = additive_mask(tree, prefix)
    assert add.shape == (1, 1, n, prefix + n)
    visible = add[0, 0] == 0
    assert visible[:, :prefix].all()
    assert np.array_equal(visible[:, prefix:].numpy(), anc)
    words = bitmask(tree)
    assert words.shape == (n, -(-n // 32)) and words.dtype == np.int32
    assert np.array_equal(unpack_bitmask(words, n), anc)
    padded = bitmask(tree, num_words=words.shape[1] + 2)
    assert np.array_equal(padded[:, : words.shape[1]], words) and not padded[:, words.shape[1]:].any()
    assert np.array_equal(position_ids(tree, prefix), prefix + tree.pack_depth)


def test_chain_packs_to_trtllm_rows_1_3_7_15():
    ids = np.arange(40).reshape(40, 1)
    chain = build_chain(ids, np.zeros((40, 1)))
    words = bitmask(chain).view(np.uint32)  # TensorRT-LLM's spec_decoding_packed_mask
    assert words[:5, 0].tolist() == [1, 3, 7, 15, 31]
    # row 33 sees tokens 0..33: word 0 full, bits 0..1 of word 1
    assert words[33].tolist() == [0xFFFFFFFF, 0b11]


def test_batched_formats_stack_request_local_masks():
    trees = [_tree(1, 5), _tree(2, 40), _tree(3, 0)]
    cu = cu_seqlens(trees)
    assert cu.tolist() == [0, 6, 47, 48]
    words = batched_bitmask(trees)
    assert words.shape == (48, 2)
    for b, tree in enumerate(trees):
        assert np.array_equal(unpack_bitmask(words[cu[b]:cu[b + 1]], tree.num_packed), ancestor_matrix(tree))
