"""Ragged batched forwards: one target verify pass (and one drafter pass) for B requests.

Layout (the varlen layout of `cast_trtllm.masks.cu_seqlens`): the packs of B requests
are concatenated into one [T = Σ n_b] token stream; request b owns rows
cu[b]:cu[b+1]. Every matmul (projections, MLP, lm_head) runs once over all T rows;
only attention is per request, over that request's own KV cache (prefix P_b) and its
own pack under its ancestor mask, so no request pays another's width (no pad-to-max).

Both passes reuse the single-sequence forwards unchanged (`LlamaTarget.forward`,
`DFlashDrafter.forward`): `RaggedCaches` stands in for the single `KVCache` (its `write`
splits the new rows per request and returns one K/V view per request) and
`RaggedTreeAttention` is the matching attention backend.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch.nn import functional as F

from cast_trtllm.masks import additive_mask, batched_position_ids, cu_seqlens
from cast_trtllm.tree import Tree
from runtime.kv_cache import KVCache
from runtime.model.llama import LlamaTarget

KVViews = list[torch.Tensor]  # one [Hkv, P_b + n_b, d] view per request


class RaggedCaches:
    """B per-request KV caches behind the one-cache interface `LlamaTarget.forward` uses."""

    def __init__(self, caches: Sequence[KVCache], sizes: Sequence[int]) -> None:
        if len(caches) != len(sizes):
            raise ValueError(f"{len(caches)} caches but {len(sizes)} pack sizes")
        for cache, n in zip(caches, sizes):
            cache.check_room(n)
        self.caches = list(caches)
        self.bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()  # [B + 1]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[KVViews, KVViews]:
        """k, v: [Hkv, T, d] new rows of all requests → per-request visible K/V views."""
        keys, values = [], []
        for b, cache in enumerate(self.caches):
            lo, hi = self.bounds[b], self.bounds[b + 1]
            kb, vb = cache.write(layer, k[:, lo:hi], v[:, lo:hi])
            keys.append(kb)
            values.append(vb)
        return keys, values


class RaggedTreeAttention:
    """Per-request SDPA over a ragged batch (CPU/GPU reference backend): ancestor-masked
    for target verify packs, unmasked for drafter blocks (non-causal inside a block)."""

    def prepare(self, trees: Sequence[Tree], prefix_lens: Sequence[int], dtype: torch.dtype, device: torch.device):
        """Per request: (row bounds, additive mask [1, 1, n_b, P_b + n_b])."""
        cu = cu_seqlens(list(trees)).tolist()
        masks = [additive_mask(t, p, dtype=dtype, device=device) for t, p in zip(trees, prefix_lens)]
        return cu, masks

    @staticmethod
    def prepare_unmasked(sizes: Sequence[int]):
        """Every row sees its request's whole context and block: (row bounds, no masks)."""
        return np.concatenate([[0], np.cumsum(sizes)]).tolist(), [None] * len(sizes)

    def __call__(self, q: torch.Tensor, keys: KVViews, values: KVViews, prepared) -> torch.Tensor:
        """q: [Hq, T, d]; keys/values: per-request [Hkv, P_b + n_b, d]. Returns [Hq, T, d]."""
        cu, masks = prepared
        out = torch.empty_like(q)
        for b, mask in enumerate(masks):
            lo, hi = cu[b], cu[b + 1]
            out[:, lo:hi] = F.scaled_dot_product_attention(
                q[None, :, lo:hi], keys[b][None], values[b][None], attn_mask=mask, enable_gqa=True
            )[0]
        return out


def ragged_verify(
    model: LlamaTarget,
    caches: Sequence[KVCache],
    packs: Sequence[np.ndarray],  # B × [n_b] int64: [b, z_1..z_N] of each request
    trees: Sequence[Tree],
    tap_layer_ids: Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """ONE target pass over every request's pack; leaves n_b pending rows per cache.

    Returns logits [T, V] and taps [T, F] (None without taps), rows in pack order.
    """
    sizes = [t.num_packed for t in trees]
    if [len(p) for p in packs] != sizes:
        raise ValueError(f"pack lengths {[len(p) for p in packs]} differ from tree sizes {sizes}")
    device, dtype = model.lm_head.weight.device, model.lm_head.weight.dtype
    prefix_lens = [c.length for c in caches]
    ragged = RaggedCaches(caches, sizes)
    backend = RaggedTreeAttention()
    prepared = backend.prepare(trees, prefix_lens, dtype, device)
    tokens = torch.from_numpy(np.concatenate(packs).astype(np.int64)).to(device)  # [T]
    positions = torch.from_numpy(batched_position_ids(list(trees), prefix_lens)).to(device)  # [T]
    return model(tokens, positions, ragged, backend, prepared, tap_layer_ids, None)
