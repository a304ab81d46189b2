"""Tiny ragged batches of trees for the tree-attention tests (no model, no cast_trtllm)."""
from __future__ import annotations

import numpy as np
import torch


def chain_parents(n: int) -> list[int]:
    """Pack-index parents of a chain: token i's parent is i - 1 (root: -1)."""
    return [-1] + list(range(n - 1))


def bushy_parents(n: int, seed: int = 0) -> list[int]:
    """Wide, shallow random tree: each token hangs off one of the first few earlier tokens."""
    rng = np.random.default_rng(seed)
    return [-1] + [int(rng.integers(0, min(i, 1 + i // 4))) for i in range(1, n)]


def ancestor_bitmask(parents: list[int], num_words: int) -> np.ndarray:
    """int32 [n, num_words], LSB-first: bit k of word k // 32 in row i iff k is i or an ancestor of i."""
    words = np.zeros((len(parents), num_words), dtype=np.uint32)
    for i in range(len(parents)):
        k = i
        while k != -1:
            words[i, k // 32] |= np.uint32(1 << (k % 32))
            k = parents[k]
    return words.view(np.int32)


def make_batch(
    packs: list[list[int]],
    prefix_lens: list[int],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int = 16,
    dtype: torch.dtype = torch.float32,
    extra_words: int = 0,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Random q/k/v plus bitmask and offsets for requests whose trees are given by parent lists."""
    gen = torch.Generator().manual_seed(seed)
    total, prefix_total = sum(map(len, packs)), sum(prefix_lens)
    num_words = max(1, -(-max(map(len, packs)) // 32)) + extra_words
    rows = [ancestor_bitmask(p, num_words) for p in packs if p]
    randn = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731
    return dict(
        q=randn(total, num_q_heads, head_dim),
        k_prefix=randn(prefix_total, num_kv_heads, head_dim),
        v_prefix=randn(prefix_total, num_kv_heads, head_dim),
        k_pack=randn(total, num_kv_heads, head_dim),
        v_pack=randn(total, num_kv_heads, head_dim),
        bitmask=torch.from_numpy(np.concatenate(rows) if rows else np.zeros((0, num_words), np.int32)),
        cu_seqlens=torch.tensor(np.cumsum([0] + [len(p) for p in packs]), dtype=torch.int32),
        cu_prefix=torch.tensor(np.cumsum([0] + list(prefix_lens)), dtype=torch.int32),
    )
