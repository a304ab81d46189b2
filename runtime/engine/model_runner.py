"""The model runner: a round's device part over static buffers, captured per bucket on CUDA.

Shaped like nano-vllm's `ModelRunner`. A bucket is (batch, packed width): the batch rounded
up to `BATCH_BUCKETS`, the widest pack to the cost model's width buckets
(`cast_trtllm.cost_model.DEFAULT_BUCKETS`), so the buckets a round runs in are the ones the
cost model prices. Each bucket owns:
  host    pinned int64 [B, 3 + 4n]: the round's ONE metadata upload (slots, prefix lengths,
          commit flags, pack tokens, parents, depths, presence; `runtime.model.pool_forward`)
  meta    its device copy, the only input of the captured function
  outputs logits, new K/V, kept taps and the [B, 1 + 2(1 + D)] int64 `read`, static
  readout pinned int64: the round's ONE device -> host read lands here
On CUDA (`graphs=True`) the function is warmed up on a side stream (Triton compiles) and
captured into a `torch.cuda.CUDAGraph` the first time a bucket is used; every later round
of that bucket is one `replay()`. All graphs share one memory pool (only one runs at a
time; outputs are consumed or cloned before the next round). Eager (`graphs=False`) runs
the same function, for comparison and on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from cast_trtllm.cost_model import DEFAULT_BUCKETS
from runtime.model.pool_forward import device_round, eager_pool_attention, meta_width, visible_bitmask

BATCH_BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def bucket_of(value: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket >= value; beyond the last, the value rounded up to a multiple of 32."""
    for b in buckets:
        if b >= value:
            return b
    return -(-value // 32) * 32


def pool_attention(kind: str, scale: float):
    """The attention a round runs: the project's Triton pool kernel or the torch path."""
    if kind == "triton":
        from plugins.tree_attention import pool_tree_attention_triton

        def attend(q, k, v, k_pool, v_pool, slots, lengths, visible):
            return pool_tree_attention_triton(q, k, v, k_pool, v_pool, slots, lengths, visible_bitmask(visible),
                                              scale=scale)
        return attend
    if kind != "torch":
        raise ValueError(f"attention must be 'triton' or 'torch', got {kind!r}")
    return lambda *args: eager_pool_attention(*args, scale=scale)


@dataclass
class Bucket:
    batch: int
    width: int
    host: torch.Tensor
    meta: torch.Tensor
    readout: torch.Tensor
    outputs: tuple | None = None
    graph: Any = None
    replays: int = field(default=0)
    uploaded: Any = None  # CUDA event after the last upload: the host buffer is free to refill once it is done

    def host_buffer(self) -> np.ndarray:
        """The pinned metadata to fill for the next round (waits, rarely, for the last upload to leave it)."""
        if self.uploaded is not None:
            self.uploaded.synchronize()
        return self.host.numpy()


class ModelRunner:
    def __init__(self, target, taps: tuple[int, ...], pool, max_depth: int, graphs: bool, attention: str,
                 width_buckets: tuple[int, ...] = DEFAULT_BUCKETS, batch_buckets: tuple[int, ...] = BATCH_BUCKETS):
        self.target, self.taps, self.pool, self.max_depth = target, tuple(taps), pool, max_depth
        self.device = pool.device
        self.graphs = graphs and self.device.type == "cuda"
        self.attention = attention
        self.attend = pool_attention(attention, target.config.head_dim ** -0.5)
        self.width_buckets, self.batch_buckets = tuple(width_buckets), tuple(batch_buckets)
        self.buckets: dict[tuple[int, int], Bucket] = {}
        self.mempool = torch.cuda.graph_pool_handle() if self.graphs else None
        self.uploads = self.reads = 0  # counted per call: one each per round

    def bucket(self, batch: int, width: int) -> Bucket:
        key = (bucket_of(batch, self.batch_buckets), bucket_of(width, self.width_buckets))
        if key not in self.buckets:
            self.buckets[key] = self._new_bucket(*key)
        return self.buckets[key]

    def _new_bucket(self, batch: int, width: int) -> Bucket:
        pin = self.device.type == "cuda"
        host = torch.zeros((batch, meta_width(width)), dtype=torch.int64, pin_memory=pin)
        readout = torch.zeros((batch, 1 + 2 * (1 + min(self.max_depth, width - 1))), dtype=torch.int64,
                              pin_memory=pin)
        bucket = Bucket(batch, width, host, torch.zeros_like(host, device=self.device), readout)
        idle(bucket.host.numpy(), width)
        bucket.meta.copy_(bucket.host)
        if self.graphs:
            self._capture(bucket)
        return bucket

    def _call(self, bucket: Bucket):
        return device_round(self.target, self.taps, self.pool, bucket.meta, self.max_depth, self.attend)

    def _capture(self, bucket: Bucket) -> None:
        """The idle metadata commits nothing, so warm-up and capture leave the pool untouched."""
        bucket.graph, bucket.outputs = capture(lambda: self._call(bucket), self.mempool)

    def run(self, bucket: Bucket, after_upload=None):
        """One upload of `bucket.host` (filled by the caller), `after_upload(meta)` (device-side
        writes into the metadata, e.g. trees built on the device), then the device part: replayed
        (captured bucket) or called eagerly. Returns (logits, keys, values, taps, kept taps, read)."""
        bucket.meta.copy_(bucket.host, non_blocking=True)
        if self.device.type == "cuda":
            bucket.uploaded = torch.cuda.Event()
            bucket.uploaded.record()
        if after_upload is not None:
            after_upload(bucket.meta)
        self.uploads += 1
        bucket.replays += 1
        if bucket.graph is not None:
            bucket.graph.replay()
        else:
            bucket.outputs = self._call(bucket)
        return bucket.outputs

    def read(self, bucket: Bucket, rows: int, extra: list[torch.Tensor] = ()) -> tuple[np.ndarray, list[np.ndarray]]:
        """THE round's device -> host read: `read[:rows]` (and any small `extra` int64 tensors, packed
        into the same copy) into pinned memory, then one wait on this stream."""
        read = bucket.outputs[5][:rows]
        self.reads += 1
        if not extra:
            out = bucket.readout[:rows]
            out.copy_(read, non_blocking=True)
            if self.device.type == "cuda":
                torch.cuda.current_stream().synchronize()
            return out.numpy().copy(), []
        flat = torch.cat([read.reshape(-1)] + [e.reshape(-1) for e in extra]).cpu().numpy()
        parts = np.split(flat, np.cumsum([read.numel()] + [e.numel() for e in extra])[:-1])
        return parts[0].reshape(read.shape), [p.reshape(e.shape) for p, e in zip(parts[1:], extra)]


def capture(call, mempool):
    """-> (graph, outputs): `call` warmed up twice on a side stream (Triton compiles, the
    allocator settles), then captured into a `torch.cuda.CUDAGraph` in the shared `mempool`."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=mempool):
        outputs = call()
    return graph, outputs


def idle(meta: np.ndarray, width: int) -> None:
    """Metadata of rows that carry no request: slot 0, P 0, nothing committed, one root alone."""
    meta[:] = 0
    view = meta[:, 3:].reshape(meta.shape[0], 4, width)
    view[:, 1, 0] = -1  # the root's parent
    view[:, 1, 1:] = 0  # absent nodes hang off the root
    view[:, 2, 1:] = 1
    view[:, 3, 0] = 1  # only the root is present
