"""Tiny engine-shaped batches for the pool-layout tree-attention tests: real CAST trees padded to
a static pack width n, committed prefixes in a slot pool with slots outside the batch."""
from __future__ import annotations

import numpy as np
import torch

from cast_trtllm.masks import bitmask as tree_bitmask
from runtime.engine.latency_probe import probe_tree


def pack_bitmask(sizes: list[int], shapes: list[str], n: int, num_words: int, seed: int = 0) -> torch.Tensor:
    """[B, n, W] int32: request b's pack is a `probe_tree` of sizes[b] tokens ("tree" or "chain"),
    rows sizes[b]..n-1 are padding (all-zero rows)."""
    rng = np.random.default_rng(seed)
    out = np.zeros((len(sizes), n, num_words), dtype=np.int32)
    for b, (size, shape) in enumerate(zip(sizes, shapes)):
        if size:
            out[b, :size] = tree_bitmask(probe_tree(size, shape, rng, vocab=1000), num_words)
    return torch.from_numpy(out)


def make_pool_batch(sizes: list[int], prefix_lens: list[int], slot_ids: list[int], num_slots: int, capacity: int,
                    n: int, num_q_heads: int, num_kv_heads: int, head_dim: int = 16,
                    dtype: torch.dtype = torch.float32, shapes: list[str] | None = None, seed: int = 0,
                    index_dtype: torch.dtype = torch.int32) -> dict[str, torch.Tensor]:
    """Arguments of `pool_tree_attention` (keyword names). Pool slots outside the batch hold NaN
    and columns >= P_b of a batch slot hold 1e4: a kernel that reads either one fails."""
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    batch = len(sizes)
    k_pool = torch.full((num_slots, num_kv_heads, capacity, head_dim), float("nan"))
    v_pool = torch.full_like(k_pool, float("nan"))
    for slot, length in zip(slot_ids, prefix_lens):
        for pool in (k_pool, v_pool):
            pool[slot] = 1e4
            pool[slot, :, :length] = randn(num_kv_heads, length, head_dim)
    shapes = shapes or ["tree"] * batch
    return dict(
        q=randn(batch, n, num_q_heads, head_dim).to(dtype),
        k_new=randn(batch, n, num_kv_heads, head_dim).to(dtype),
        v_new=randn(batch, n, num_kv_heads, head_dim).to(dtype),
        k_pool=k_pool.to(dtype), v_pool=v_pool.to(dtype),
        slot_ids=torch.tensor(slot_ids, dtype=index_dtype),
        prefix_lens=torch.tensor(prefix_lens, dtype=index_dtype),
        bitmask=pack_bitmask(sizes, shapes, n, max(1, -(-n // 32)), seed),
    )
