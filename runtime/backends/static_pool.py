"""A KV pool allocated once, at engine start: `max_slots` requests x `max_context` rows.

Layout: keys, values [layers, max_slots, Hkv, max_context + 1, d] in the model's dtype and
device (layer i's view keys[i] is [slots, Hkv, C + 1, d], the layout the pool kernel and
the eager pool attention read by slot id). Column `max_context` is the TRASH column: a
static-shape commit writes every row it does not keep there, so a round's commit is one
in-place scatter of a fixed size whatever was accepted. No request ever sees it (a
request's visible columns are [0, P) with P <= max_context).

Nothing is reallocated after construction: admission is by capacity. `acquire` refuses a
request that needs more rows than `max_context`, or arrives when every slot is taken,
with a `PoolFullError` that says what to change; nothing already admitted is touched.
"""

from __future__ import annotations

import weakref

import torch

from runtime.backends.slot_pool import CacheFullError


class PoolFullError(RuntimeError):
    """The preallocated pool cannot admit this request now (`retry`: all slots are taken; a server
    queues it until one is free) or ever (it needs more rows than a slot holds)."""

    def __init__(self, message: str, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


class StaticSlot:
    """One request's slot: index, P (committed rows), capacity (rows it may reach)."""

    def __init__(self, pool: "StaticPool", index: int, capacity: int) -> None:
        self.pool, self.index, self.capacity = pool, index, capacity
        self.length = 0  # P
        self.pending: tuple | None = None  # a target slot: (bucket, row b, committed on the device) of the last pass
        self.staged: list = []  # a drafter slot: taps appended but not yet through its context pass
        self._free = weakref.finalize(self, pool._free_index, index)

    def check_room(self, num_new: int) -> None:
        if self.length + num_new > self.capacity:
            raise CacheFullError(f"sequence of {self.length + num_new} tokens exceeds its cache capacity of "
                                 f"{self.capacity}; shorten the prompt or max_new_tokens")

    def release(self) -> None:
        self.pending = None
        self._free()


class StaticPool:
    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_slots: int, max_context: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        if max_slots < 1 or max_context < 1:
            raise ValueError(f"a static pool needs max_slots >= 1 and max_context >= 1, got {max_slots}, "
                             f"{max_context}")
        self.shape, self.dtype, self.device = (num_layers, num_kv_heads, head_dim), dtype, torch.device(device)
        self.max_slots, self.max_context, self.trash = max_slots, max_context, max_context
        size = (num_layers, max_slots, num_kv_heads, max_context + 1, head_dim)
        with torch.inference_mode(False):
            self.keys = torch.zeros(size, dtype=dtype, device=self.device)
            self.values = torch.zeros(size, dtype=dtype, device=self.device)
        self.in_use = [False] * max_slots

    @property
    def num_slots(self) -> int:
        return self.max_slots

    @property
    def free_slots(self) -> int:
        return self.in_use.count(False)

    @property
    def nbytes(self) -> int:
        return 2 * self.keys.numel() * self.keys.element_size()

    def acquire(self, capacity: int) -> StaticSlot:
        if capacity < 1:
            raise ValueError(f"cache capacity must be >= 1, got {capacity}")
        if capacity > self.max_context:
            raise PoolFullError(
                f"the request needs up to {capacity} cache rows (prompt + max_new_tokens + one tree) but the KV "
                f"pool was allocated with max_context {self.max_context}; shorten it or raise max_seq_len", retry=False)
        if all(self.in_use):
            raise PoolFullError(f"all {self.max_slots} KV pool slots are taken; retry when a request finishes "
                                f"or raise max_batch_size (the pool is allocated once, at engine start)", retry=True)
        index = self.in_use.index(False)
        self.in_use[index] = True
        return StaticSlot(self, index, capacity)

    def _free_index(self, index: int) -> None:
        self.in_use[index] = False

    def scatter(self, slots: torch.Tensor, columns: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """In place, on the device: row m of keys/values ([M, layers, Hkv, d]) -> column columns[m]
        of slot slots[m] (the trash column for a row not kept). Static shapes, no host read."""
        self.keys[:, slots, :, columns] = keys
        self.values[:, slots, :, columns] = values
