"""`RunnerTarget`: the target backend for GPUs, a `TargetBackend` over a preallocated pool and
the model runner (`runtime.engine.model_runner`), captured per bucket on CUDA.

The engine drives it through `runtime.engine.runner_round` (ONE metadata upload, the captured
verify + greedy walk + in-place commit, ONE read); the rest of the backend
contract (`verify`, `verify_trees`, `commit_many`, `prefill`) runs the same device
function, so the latency probe, the GPU check and requests that walk on the host
(sampled, logprobs, logit processing) use it too. A prompt's prefill runs eagerly in its
own pass (its chunk is as long as the round's token budget allows, not a bucket).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from cast_trtllm.tree import Tree
from runtime.backends.pooled_target import PooledTarget
from runtime.backends.static_pool import StaticPool, StaticSlot
from runtime.device import upload
from runtime.device_trees import TreeBatch
from runtime.engine.model_runner import ModelRunner, idle
from runtime.model.llama import LlamaTarget
from runtime.model.pool_forward import META_HEAD, forward

DEFAULT_MAX_DEPTH = 16  # the deepest tree a round may carry (a DFlash block of 16 drafts 15 positions)


class RunnerTarget:
    name = "runner"

    def __init__(self, model: LlamaTarget, tap_layer_ids: Sequence[int] = (), graphs: bool | None = None,
                 max_slots: int = 32, max_context: int | None = None, attention: str | None = None,
                 max_depth: int = DEFAULT_MAX_DEPTH) -> None:
        self.model, self.config = model, model.config
        self.tap_layer_ids = model.config.tap_layers(tap_layer_ids)
        self.device, self.dtype = model.lm_head.weight.device, model.lm_head.weight.dtype
        cuda = self.device.type == "cuda"
        cfg = self.config
        max_context = min(cfg.context_window, 4096) if max_context is None else max_context
        self.pool = StaticPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, max_slots, max_context, self.dtype,
                               self.device)
        self.runner = ModelRunner(model, self.tap_layer_ids, self.pool, max_depth, cuda if graphs is None else graphs,
                                  attention or ("triton" if cuda else "torch"))
        self.max_depth = max_depth

    def check_depth(self, depth: int) -> None:
        if depth > self.max_depth:
            raise ValueError(f"the drafter drafts {depth} positions; this target runner walks trees of depth <= "
                             f"{self.max_depth}: build it with max_depth >= {depth}, or set max_draft_len")

    # ------------------------------------------------------------------ the contract
    def new_sequence(self, capacity: int) -> StaticSlot:
        return self.pool.acquire(capacity)

    def release(self, seq: StaticSlot) -> None:
        seq.release()

    def prefix_len(self, seq: StaticSlot) -> int:
        return seq.length

    @torch.inference_mode()
    def prefill(self, seq: StaticSlot, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The prompt [P] as one causal pack, committed in place -> (last-row logits [1, V], taps [P, F])."""
        if token_ids.dim() != 1 or token_ids.numel() == 0:
            raise ValueError("prefill needs a non-empty 1-D tensor of token ids")
        n = token_ids.numel()
        seq.check_room(n)
        dev = self.device
        tokens = token_ids.to(dev, torch.int64)[None]
        columns = torch.arange(seq.length, seq.length + n, device=dev)
        slots, lengths = torch.full((1,), seq.index, device=dev), torch.full((1,), seq.length, device=dev)
        causal = torch.ones(1, n, n, dtype=torch.bool, device=dev).tril()
        logits, keys, values, taps = forward(self.model, self.tap_layer_ids, self.pool, tokens, columns[None], slots,
                                             lengths, causal, self.runner.attend)
        self.pool.scatter(slots.expand(n), columns, keys, values)
        seq.length += n
        return logits[-1:], taps

    verify = PooledTarget.verify  # the same checks, roots and TreeBatch, then `verify_trees` below

    @torch.inference_mode()
    def verify_trees(self, seqs, roots: torch.Tensor, trees: TreeBatch, sizes: Sequence[int]):
        """ONE pass, nothing committed: logits [Σn, V], taps [Σn, F] | None in `flat_rows` order."""
        bucket, patch = self.fill(seqs, None, [False] * len(seqs), sizes, device_trees=trees, device_roots=roots)
        logits, _, _, taps, _, _ = self.runner.run(bucket, patch)
        flat = self.pending_rows(bucket, sizes)
        return logits.flatten(0, 1).index_select(0, flat), None if taps is None else taps.index_select(0, flat)

    def commit(self, seq: StaticSlot, kept_rows: np.ndarray) -> None:
        self.commit_many([seq], [kept_rows])

    @torch.inference_mode()
    def commit_many(self, seqs: Sequence[StaticSlot], kept_rows: Sequence[np.ndarray]) -> None:
        """Rows committed on the device (greedy walks) only move P; the others are scattered from
        their pass's K/V in one in-place scatter."""
        rows, slots, columns, keys = [], [], [], None
        for seq, kept in zip(seqs, kept_rows):
            if seq.pending is None:
                raise ValueError("commit without a pass: run prefill or verify first")
            bucket, b, done = seq.pending
            seq.check_room(len(kept))
            if not done:
                keys, values = bucket.outputs[1], bucket.outputs[2]
                rows.append(b * bucket.width + np.asarray(kept, np.int64))
                slots.append(np.full(len(kept), seq.index))
                columns.append(seq.length + np.arange(len(kept)))
            seq.length += len(kept)
            seq.pending = None
        if rows:
            flat, slot, column = (upload(np.concatenate(a), self.device) for a in (rows, slots, columns))
            self.pool.scatter(slot, column, keys.index_select(0, flat), values.index_select(0, flat))

    # ------------------------------------------------------------------ the runner's round
    def fill(self, seqs, host_trees: list[Tree] | None, commit: Sequence[bool], sizes: Sequence[int],
             roots: Sequence[int] | None = None, device_trees: TreeBatch | None = None,
             device_roots: torch.Tensor | None = None):
        """Write the round's metadata into its bucket's pinned buffer (host trees), or leave the
        tree columns for the device copies made after the upload (`device_trees`)."""
        B, width = len(seqs), 1 + max(sizes, default=0)
        bucket = self.runner.bucket(B, width)
        n = bucket.width
        meta = bucket.host_buffer()
        idle(meta, n)
        tree_cols = meta[:, META_HEAD:].reshape(meta.shape[0], 4, n)
        for b, seq in enumerate(seqs):
            seq.check_room(1 + sizes[b])
            meta[b, :META_HEAD] = (seq.index, seq.length, bool(commit[b]))
            seq.pending = (bucket, b, bool(commit[b]))
            if roots is not None:
                tree_cols[b, 0, 0] = roots[b]
            if host_trees is None:  # device trees: the first sizes[b] nodes are packed (patched after the upload)
                tree_cols[b, 3, 1:1 + sizes[b]] = 1
            else:
                t = host_trees[b]
                if t.size and t.max_depth > self.max_depth:
                    raise ValueError(f"a tree of depth {t.max_depth} exceeds this runner's max_depth "
                                     f"{self.max_depth}; build it with max_depth >= the drafter's L")
                tree_cols[b, 0, 1:1 + t.size] = t.tokens
                tree_cols[b, 1, 1:1 + t.size] = np.asarray(t.parent) + 1
                tree_cols[b, 2, 1:1 + t.size] = t.depth
                tree_cols[b, 3, 1:1 + t.size] = 1
        patch = None if device_trees is None else self._device_tree_columns(bucket, B, device_trees, device_roots)
        return bucket, patch

    def _device_tree_columns(self, bucket, B: int, trees: TreeBatch, roots: torch.Tensor | None):
        """-> after_upload(meta): copies the device trees into the metadata's tree columns (same stream,
        after the upload, before the pass)."""
        if trees.max_depth > self.max_depth and trees.width:
            raise ValueError(f"trees of depth {trees.max_depth} exceed this runner's max_depth {self.max_depth}")
        n, w = bucket.width, min(trees.width, bucket.width - 1)

        def write(meta: torch.Tensor) -> None:
            cols = meta[:B, META_HEAD:].view(B, 4, n)
            if roots is not None:
                cols[:, 0, 0] = roots
            cols[:, 0, 1:1 + w] = trees.tokens[:, :w]
            cols[:, 1, 1:1 + w] = torch.where(trees.parent[:, :w] >= 0, trees.parent[:, :w] + 1, 0)
            cols[:, 2, 1:1 + w] = trees.depth[:, :w]
            cols[:, 3, 1:1 + w] *= (trees.score[:, :w] > -torch.inf).to(torch.int64)  # packed and present
        return write

    def pending_rows(self, bucket, sizes: Sequence[int], requests: Sequence[int] | None = None) -> torch.Tensor:
        """Flat rows (b * width + row) of the packs of `requests` (default: all), in `flat_rows` order."""
        which = range(len(sizes)) if requests is None else requests
        rows = np.concatenate([b * bucket.width + np.arange(1 + sizes[b]) for b in which])
        return upload(rows, self.device)
