"""Preallocated per-layer K/V buffers with in-place commit (paper App. C, KV gather).

Layout: `k`, `v` are [layers, kv_heads, capacity, head_dim]. Rows [0, length) hold the
cache-backed prefix x. A forward over n new tokens writes rows [length, length+n)
without moving `length` ("pending" rows); the owner then either keeps them all
(`advance`, after a prefill) or keeps the accepted pack rows only (`compact`, after a
verify). Nothing is reallocated per round. The drafter's feature cache uses the same
class (one row per context position, per drafter layer).
"""

from __future__ import annotations

import numpy as np
import torch


class CacheFullError(ValueError):
    """The sequence would outgrow the cache (the model's context window)."""


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"cache capacity must be >= 1, got {capacity}")
        shape = (num_layers, num_kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0  # committed rows (= |x|)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def reset(self) -> None:
        self.length = 0

    def check_room(self, num_new: int) -> None:
        if self.length + num_new > self.capacity:
            raise CacheFullError(
                f"sequence of {self.length + num_new} tokens exceeds the cache capacity of "
                f"{self.capacity} (the context window); shorten the prompt or max_new_tokens"
            )

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store pending rows of one layer and return the layer's visible K/V.

        k, v: [kv_heads, n, head_dim]. Writes rows [length, length+n).
        Returns views [kv_heads, length+n, head_dim] (no copy).
        """
        end = self.length + k.shape[1]
        if end > self.capacity:
            self.check_room(k.shape[1])
        self.k[layer, :, self.length : end] = k
        self.v[layer, :, self.length : end] = v
        return self.k[layer, :, :end], self.v[layer, :, :end]

    def advance(self, num_new: int) -> None:
        """Commit all pending rows (prefill, or an append-only cache)."""
        self.check_room(num_new)
        self.length += num_new

    def compact(self, keep_pack_indices: np.ndarray) -> None:
        """Commit the pending rows at `keep_pack_indices` (relative to `length`, strictly
        increasing, e.g. [0] + accepted path) by gathering them in place to
        [length, length + m).

        keep_pack_indices: [m] int64 host array.
        """
        keep = np.asarray(keep_pack_indices, dtype=np.int64)
        m = len(keep)
        if m and (keep[0] < 0 or np.any(np.diff(keep) <= 0)):
            raise ValueError(f"keep_pack_indices must be increasing and >= 0, got {keep.tolist()}")
        if not np.array_equal(keep, np.arange(m)):  # a contiguous head is already in place
            src = torch.from_numpy(keep + self.length).to(self.k.device)
            dst = slice(self.length, self.length + m)
            # advanced indexing on the right-hand side copies first, so overlap is safe
            self.k[:, :, dst] = self.k[:, :, src]
            self.v[:, :, dst] = self.v[:, :, src]
        self.length += m
