"""Verify-pass inputs compiled from a `Tree`: masks, position ids, KV keep indices.

Pack layout: pack index 0 is the pending root at absolute position P (= cached prefix
length), pack index i + 1 is tree node i at position P + depth. Under the ancestor-only
mask, packed token t attends to the whole prefix, its ancestors and itself (Lemma 1).

Formats (all derived from `ancestor_matrix`, all tested against each other):
1. boolean ancestor matrix [n, n];
2. additive float mask [1, 1, n, P + n] (0 visible, dtype-min hidden; HF 4D mask);
3. TensorRT-LLM spec-decoding inputs: packed_mask int32 [n, ceil(n/32)] LSB-first
   (bit k of word k // 32 in row t: t may attend pack token k), position_offsets
   (depths), generation_lengths;
4. kernel bitmask: the same LSB-first words, padded to any word count, ragged batch.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def _pack_bits(matrix: np.ndarray, num_words: int) -> np.ndarray:
    """[n, m] bool -> [n, num_words] int32, LSB-first within each 32-bit word."""
    n, m = matrix.shape
    padded = np.zeros((n, num_words * 32), dtype=bool)
    padded[:, :m] = matrix
    words = np.packbits(padded.reshape(n, num_words, 4, 8), axis=-1, bitorder="little")
    return words.reshape(n, num_words, 4).view("<u4")[..., 0].astype(np.uint32).view(np.int32)


def bitmask(tree: Tree, num_words: int | None = None) -> np.ndarray:
    """[n, W] int32 ancestor bitmask; W = ceil(n/32) unless `num_words` pads it."""
    n = tree.num_packed
    need = -(-n // 32)
    words = need if num_words is None else num_words
    if words < need:
        raise ValueError(f"num_words={num_words} cannot hold a pack of {n} tokens (needs {need})")
    return _pack_bits(ancestor_matrix(tree), words)


def unpack_bitmask(words: np.ndarray, n: int) -> np.ndarray:
    """Inverse of `bitmask`: [n, W] int32 -> [n, n] bool."""
    bits = np.unpackbits(
        np.ascontiguousarray(words[:n]).view(np.uint8).reshape(n, -1, 4), axis=-1, bitorder="little"
    )
    return bits.reshape(n, -1)[:, :n].astype(bool)


@dataclass(frozen=True, slots=True)
class SpecDecodingInputs:
    """TensorRT-LLM `spec_decoding_*` tensors for one request."""

    packed_mask: np.ndarray  # [n, ceil(n/32)] int32
    position_offsets: np.ndarray  # [n] int32 depth of each packed token
    generation_lengths: np.ndarray  # [1] int32 = n


def trtllm_spec_decoding_inputs(tree: Tree) -> SpecDecodingInputs:
    """The packed tree in TensorRT-LLM's spec-decoding layout (a chain packs to 1, 3, 7, 15, …)."""
    return SpecDecodingInputs(
        packed_mask=bitmask(tree),
        position_offsets=tree.pack_depth.astype(np.int32),
        generation_lengths=np.array([tree.num_packed], dtype=np.int32),
    )


def kv_keep_indices(prefix_len: int, accepted: np.ndarray) -> np.ndarray:
    """[P + 1 + A] int64 cache rows kept after the walk: prefix, root, accepted path.

    accepted: pack indices of the accepted nodes (root excluded), root-to-leaf order.
    """
    accepted = np.asarray(accepted, dtype=np.int64)
    if np.any(accepted < 1):
        raise ValueError("accepted pack indices must be >= 1 (pack index 0 is the root)")
    return np.concatenate([np.arange(prefix_len + 1), prefix_len + accepted])


def cu_seqlens(trees: list[Tree]) -> np.ndarray:
    """[B + 1] int32 cumulative packed counts of a ragged batch."""
    return np.concatenate([[0], np.cumsum([t.num_packed for t in trees])]).astype(np.int32)


def batched_bitmask(trees: list[Tree], num_words: int | None = None) -> np.ndarray:
    """[Σ n_b, W] int32 request-local ancestor bitmasks stacked in pack order."""
    need = max(-(-t.num_packed // 32) for t in trees)
    words = need if num_words is None else num_words
    return np.concatenate([bitmask(t, words) for t in trees])


def batched_position_ids(trees: list[Tree], prefix_lens: list[int]) -> np.ndarray:
    """[Σ n_b] int64 absolute positions of a ragged batch."""
    if len(trees) != len(prefix_lens):
        raise ValueError(f"{len(trees)} trees but {len(prefix_lens)} prefix lengths")
    return np.concatenate([position_ids(t, p) for t, p in zip(trees, prefix_lens)])
