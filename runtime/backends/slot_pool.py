"""One KV pool for every live request of a target or drafter backend (slots, not per-request buffers).

Layout: keys, values are [layers, slots, Hkv, C, d] torch tensors (the model's dtype and
device, zeros when made), so keys[i] is layer i's [slots, Hkv, C, d] and any slot range
of it is contiguous (onnxruntime binds it by address; torch passes the view). A request
owns one slot s; its committed rows are [0, P) of keys[i][s] on axis C.
A batched pass binds, per layer, the slot range [lo, hi) that covers its requests as one
contiguous [hi - lo, Hkv, C, d] input, in place (no per-round copy of any prefix): the
graph masks each slot's columns >= P, and a slot in the range that is not in the batch
is masked whole. Head-major [Hkv, C, d] rows make K^T a transpose of the last two axes,
which onnxruntime fuses into its MatMul (no copy of the prefix in the graph either).

Slots are taken lowest-first, so a batch's range stays dense. Slots double when none is
free. C follows the rows committed (rounded up to `CAPACITY_STEP`): it grows when a commit
needs more and shrinks, keeping one step of headroom, once the live requests' longest is two
steps or more below it (a long request has left). Both are rare copies, never per round.
`release` frees a slot; a `Slot` freed by the garbage collector frees itself.
"""

from __future__ import annotations

import weakref
from typing import Sequence

import numpy as np
import torch

CAPACITY_STEP = 128  # C grows in multiples of this (fewer regrowths, few wasted columns)
MASKED = float(np.finfo(np.float32).min)  # additive mask value of a hidden column


class CacheFullError(ValueError):
    """The sequence would outgrow its cache (the model's context window)."""


class Slot:
    """One request's place in a `SlotPool`: slot index, P (committed rows), its own capacity.

    `pending` holds the last pass's new K/V rows until `commit` gathers the kept ones in."""

    def __init__(self, pool: "SlotPool", index: int, capacity: int) -> None:
        self.pool, self.index, self.capacity = pool, index, capacity
        self.length = 0  # P
        self.pending: tuple[torch.Tensor, torch.Tensor, int] | None = None  # (keys [T, layers, Hkv, d], values, row)
        self._free = weakref.finalize(self, pool._free_index, index)

    def check_room(self, num_new: int) -> None:
        if self.length + num_new > self.capacity:
            raise CacheFullError(
                f"sequence of {self.length + num_new} tokens exceeds the cache capacity of "
                f"{self.capacity} (the context window); shorten the prompt or max_new_tokens"
            )

    def release(self) -> None:
        self.pending = None
        self._free()


class SlotPool:
    """K/V of `num_layers` layers, `num_kv_heads` x `head_dim`, for any number of requests."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> None:
        self.shape, self.dtype, self.device = (num_layers, num_kv_heads, head_dim), dtype, torch.device(device)
        self.keys = self.values = torch.zeros((num_layers, 0, num_kv_heads, 0, head_dim), dtype=dtype, device=device)
        self.in_use: list[bool] = []
        self.live: weakref.WeakValueDictionary[int, Slot] = weakref.WeakValueDictionary()  # index -> last Slot given it
        self._resize(4, CAPACITY_STEP)

    @property
    def num_slots(self) -> int:
        return len(self.in_use)

    @property
    def capacity(self) -> int:  # C
        return self.keys.shape[3]

    def _resize(self, slots: int, capacity: int) -> None:
        layers, hkv, d = self.shape
        old_slots, kept = self.keys.shape[1], min(self.keys.shape[3], capacity)
        grown = []
        with torch.inference_mode(False):  # plain tensors: a pass inside inference mode may grow the pool
            for old in (self.keys, self.values):
                new = torch.zeros((layers, slots, hkv, capacity, d), dtype=self.dtype, device=self.device)
                new[:, :old_slots, :, :kept] = old[:, :, :, :kept]
                grown.append(new)
        self.keys, self.values = grown
        self.in_use += [False] * (slots - old_slots)

    def acquire(self, capacity: int) -> Slot:
        """A free slot for a request of up to `capacity` rows (more slots if none is free;
        columns are reserved as rows are written, `reserve`)."""
        if capacity < 1:
            raise ValueError(f"cache capacity must be >= 1, got {capacity}")
        if all(self.in_use):
            self._resize(self.num_slots * 2, self.capacity)
        index = self.in_use.index(False)
        self.in_use[index] = True
        slot = self.live[index] = Slot(self, index, capacity)
        return slot

    def layer_views(self, lo: int, hi: int) -> list[torch.Tensor]:
        """Slots [lo, hi) of every layer, keys then values: 2 x layers contiguous [S, Hkv, C, d]
        views, in the order the batched graphs take them (`batch_graph.pool_input_names`)."""
        return [*self.keys[:, lo:hi].unbind(0), *self.values[:, lo:hi].unbind(0)]

    def torch_inputs(self, inputs: dict[str, np.ndarray | torch.Tensor], names: Sequence[str]) -> list[torch.Tensor]:
        """A pass's inputs `names` (host arrays or device tensors) as tensors on the pool's device;
        float masks in its dtype, their fp32 minimum clamped to stay finite in a narrower dtype."""
        floor, out = torch.finfo(self.dtype).min, []
        for name in names:
            value = inputs[name]
            if not isinstance(value, torch.Tensor):
                value = torch.from_numpy(np.ascontiguousarray(value))
            value = value.to(self.device)
            out.append(value.clamp_min(floor).to(self.dtype) if value.is_floating_point() else value)
        return out

    def fit(self, rows: int) -> None:
        """C for a commit reaching `rows`: grown to cover it, or shrunk to the live requests' longest
        plus one step once that is two steps or more below C. Every pass attends over all C columns,
        so C follows the rows committed: not what requests may reach, not a pass's pack (its K/V
        leave as outputs; one 127-node tree must not widen every later round), not a request that
        has left (B = 16 decode at prefix 150, embedded target: C = 384 cost 1.01-1.47x C = 256)."""
        live = [s.length for index, s in self.live.items() if self.in_use[index]]  # a released slot may linger
        steps = -(-max([rows, *live]) // CAPACITY_STEP)
        if steps * CAPACITY_STEP > self.capacity:
            self._resize(self.num_slots, steps * CAPACITY_STEP)
        elif self.capacity >= (steps + 2) * CAPACITY_STEP:
            self._resize(self.num_slots, (steps + 1) * CAPACITY_STEP)

    def _free_index(self, index: int) -> None:
        self.in_use[index] = False

    def slot_range(self, slots: list[Slot]) -> tuple[int, int]:
        """[lo, hi): the contiguous slot range a batched pass over `slots` binds."""
        indices = [s.index for s in slots]
        if len(set(indices)) != len(indices):
            raise ValueError("a batch holds the same request twice")
        return min(indices), max(indices) + 1

    def past_mask(self, slots: list[Slot], lo: int, hi: int) -> np.ndarray:
        """[hi - lo, C] float32 additive: 0 on each batch slot's committed columns, MASKED elsewhere."""
        lengths = np.zeros(hi - lo, dtype=np.int64)  # a slot outside the batch sees nothing
        lengths[[s.index - lo for s in slots]] = [s.length for s in slots]
        return self.length_mask(lengths)

    def length_mask(self, lengths: np.ndarray) -> np.ndarray:
        """[R, C] float32 additive: 0 on row r's first lengths[r] columns, MASKED elsewhere."""
        return np.where(np.arange(self.capacity)[None, :] < lengths[:, None], 0.0, MASKED).astype(np.float32)

    def committed(self, slot: Slot) -> tuple[np.ndarray, np.ndarray]:
        """Copies of a slot's committed K and V rows, token-major [P, layers, Hkv, d]."""
        p = slot.length
        return tuple(a[:, slot.index, :, :p].permute(2, 0, 1, 3).cpu().numpy() for a in (self.keys, self.values))

    def commit_many(self, slots: Sequence[Slot], kept_rows: Sequence[np.ndarray]) -> None:
        """Keep rows kept_rows[b] ([m] increasing, relative to the slot's last pass) of every slot
        of one pass -> its rows [P, P+m): one gather-scatter per pool tensor."""
        if any(slot.pending is None for slot in slots):
            raise ValueError("commit without a pass: run prefill or verify first")
        source, slot_index, column = [], [], []
        for slot, kept in zip(slots, kept_rows):
            keep = np.asarray(kept, dtype=np.int64)
            if len(keep) and (keep[0] < 0 or np.any(np.diff(keep) <= 0)):
                raise ValueError(f"kept rows must be increasing and >= 0, got {keep.tolist()}")
            slot.check_room(len(keep))
            source.append(slot.pending[2] + keep)
            slot_index.append(np.full(len(keep), slot.index))
            column.append(slot.length + np.arange(len(keep)))
        keys, values = slots[0].pending[:2]
        if any(slot.pending[0] is not keys for slot in slots):
            raise ValueError("commit_many takes the slots of one pass")
        self.fit(max(slot.length + len(kept) for slot, kept in zip(slots, kept_rows)))
        rows, index, cols = (torch.from_numpy(np.concatenate(a)).to(self.device) for a in (source, slot_index, column))
        for pool, new in ((self.keys, keys), (self.values, values)):  # pending [T, layers, Hkv, d]
            pool[:, index, :, cols] = new.index_select(0, rows)  # advanced dims first: [m, layers, Hkv, d]
        for slot, kept in zip(slots, kept_rows):
            slot.length += len(kept)
            slot.pending = None


def pack_inputs(slots: Sequence[Slot], sizes: Sequence[int], visible: torch.Tensor, lo: int, hi: int
                ) -> tuple[np.ndarray, np.ndarray, torch.Tensor]:
    """gather_rows [S, n], scatter_rows [T], pack_mask [S, n, n] (`runtime.model.batch_graph`'s
    inputs) of a flattened batch whose request b (slot `slots[b]`, rows [0, sizes[b]) of its
    pack) sees `visible[b]` ([B, n, n] bool, on the pool's device), over the bound slot range
    [lo, hi). The row maps depend on sizes only (host); the mask stays on its device."""
    n = visible.shape[1]
    offsets = np.cumsum([0] + list(sizes))
    gather = np.zeros((hi - lo, n), dtype=np.int64)
    scatter = np.empty(offsets[-1], dtype=np.int64)
    index = np.array([slot.index - lo for slot in slots], dtype=np.int64)
    for s, size, row in zip(index, sizes, offsets):
        gather[s, :size] = np.arange(row, row + size)
        gather[s, size:] = row
        scatter[row:row + size] = s * n + np.arange(size)
    device = visible.device
    real = torch.arange(n, device=device)[None, :] < torch.as_tensor(list(sizes), device=device)[:, None]  # [B, n]
    pack = torch.full((hi - lo, n, n), MASKED, dtype=torch.float32, device=device)
    pack[torch.from_numpy(index).to(device)] = torch.where(
        visible & real[:, None, :] & real[:, :, None], 0.0, MASKED)
    return gather, scatter, pack


def flat_rows(sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(request, row) of every flattened pack token [T]: request b's rows [0, sizes[b]) in order."""
    request = np.repeat(np.arange(len(sizes)), sizes)
    return request, np.arange(len(request)) - np.repeat(np.cumsum([0] + list(sizes))[:-1], sizes)
