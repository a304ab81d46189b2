"""Verify-pass inputs compiled from a `Tree`: masks and position ids.

Pack layout: pack index 0 is the pending root at absolute position P (= cached prefix
length), pack index i + 1 is tree node i at position P + depth. Under the ancestor-only
mask, packed token t attends to the whole prefix, its ancestors and itself (Lemma 1).

Formats (all derived from `ancestor_matrix`, all tested against each other):
1. boolean ancestor matrix [n, n];
2. additive float mask [1, 1, n, P + n] (0 visible, dtype-min hidden; HF 4D mask);
3. kernel bitmask [n, W] int32, LSB-first (bit k of word k // 32 in row t: t may attend
   pack token k), padded to any word count W, stacked for a ragged batch;
4. TensorRT-LLM spec-decoding inputs: `bitmask(tree)` is its packed_mask [n, ceil(n/32)],
   `tree.pack_depth` its position_offsets, and `tree.num_packed` its generation length.
"""

from __future__ import annotations

import numpy as np
import torch

from cast_trtllm.tree import Tree


def ancestor_matrix(tree: Tree) -> np.ndarray:
    """[n, n] bool: row t marks packed token t and all of its ancestors (root included)."""
    n = tree.num_packed
    parent = np.maximum(tree.pack_parent, 0)  # the root is its own parent here
    mask = np.eye(n, dtype=bool)
    rows = np.arange(n)
    node = rows
    for _ in range(tree.max_depth):  # climb one level per step, all rows at once
        node = parent[node]
        mask[rows, node] = True
    return mask


def position_ids(tree: Tree, prefix_len: int) -> np.ndarray:
    """[n] int64 absolute positions P + depth (root at P)."""
    if prefix_len < 0:
        raise ValueError(f"prefix_len must be >= 0, got {prefix_len}")
    return prefix_len + tree.pack_depth.astype(np.int64)


def additive_mask(
    tree: Tree,
    prefix_len: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """[1, 1, n, P + n] additive mask: 0 where visible, dtype-min elsewhere."""
    if prefix_len < 0:
        raise ValueError(f"prefix_len must be >= 0, got {prefix_len}")
    n = tree.num_packed
    visible = torch.ones(n, prefix_len + n, dtype=torch.bool)
    visible[:, prefix_len:] = torch.from_numpy(ancestor_matrix(tree))
    mask = torch.zeros(n, prefix_len + n, dtype=dtype)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask.view(1, 1, n, prefix_len + n).to(device)


def bitmask(tree: Tree, num_words: int | None = None) -> np.ndarray:
    """[n, W] int32 ancestor bitmask, LSB-first in each word; W = ceil(n/32) unless `num_words` pads it."""
    n = tree.num_packed
    words = -(-n // 32) if num_words is None else num_words
    if words * 32 < n:
        raise ValueError(f"num_words={num_words} cannot hold a pack of {n} tokens (needs {-(-n // 32)})")
    bits = np.zeros((n, words * 32), dtype=bool)
    bits[:, :n] = ancestor_matrix(tree)
    packed = np.packbits(bits.reshape(n, words, 4, 8), axis=-1, bitorder="little")  # [n, W, 4] bytes
    return packed.reshape(n, words, 4).view("<u4")[..., 0].astype(np.uint32).view(np.int32)


def cu_seqlens(trees: list[Tree]) -> np.ndarray:
    """[B + 1] int32 cumulative packed counts of a ragged batch."""
    return np.concatenate([[0], np.cumsum([t.num_packed for t in trees])]).astype(np.int32)


def batched_bitmask(trees: list[Tree], num_words: int | None = None) -> np.ndarray:
    """[Σ n_b, W] int32 request-local ancestor bitmasks stacked in pack order."""
    words = max(-(-t.num_packed // 32) for t in trees) if num_words is None else num_words
    return np.concatenate([bitmask(t, words) for t in trees])

