"""Token-major K/V buffers of one request, as the onnxruntime graphs bind them.

Layout [capacity, layers, Hkv, d]: the committed prefix (rows [0, P)) is one contiguous
view, bound as a graph input without a copy; a pass writes its new rows at [P, P+n).
"""

from __future__ import annotations

import numpy as np

from runtime.kv_cache import CacheFullError


class TokenMajorKV:
    """One request's K/V rows (target cache or drafter feature cache) and P (committed rows)."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"cache capacity must be >= 1, got {capacity}")
        shape = (capacity, num_layers, num_kv_heads, head_dim)
        self.keys = np.zeros(shape, dtype=np.float32)  # [capacity, layers, Hkv, d]
        self.values = np.zeros(shape, dtype=np.float32)
        self.length = 0  # P = |x|

    @property
    def capacity(self) -> int:
        return self.keys.shape[0]

    def check_room(self, num_new: int) -> None:
        if self.length + num_new > self.capacity:
            raise CacheFullError(
                f"sequence of {self.length + num_new} tokens exceeds the cache capacity of "
                f"{self.capacity} (the context window); shorten the prompt or max_new_tokens"
            )

    def compact(self, keep_pack_indices: np.ndarray) -> None:
        """Commit pending rows `keep_pack_indices` ([m] increasing, relative to P) by
        gathering them in place to rows [P, P+m)."""
        keep = np.asarray(keep_pack_indices, dtype=np.int64)
        m = len(keep)
        if m and (keep[0] < 0 or np.any(np.diff(keep) <= 0)):
            raise ValueError(f"keep_pack_indices must be increasing and >= 0, got {keep.tolist()}")
        if not np.array_equal(keep, np.arange(m)):  # a contiguous head is already in place
            src, dst = keep + self.length, slice(self.length, self.length + m)
            self.keys[dst] = self.keys[src]  # fancy indexing copies the source first: overlap is safe
            self.values[dst] = self.values[src]
        self.length += m
