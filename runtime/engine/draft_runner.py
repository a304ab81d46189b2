"""`DraftRunner`: the drafter executor for GPUs, over a preallocated feature pool, its round part
(context pass over the staged taps, block pass, top-K) captured per batch bucket on CUDA.

The drafter contract of `runtime.drafter.DrafterExecutor` (`new_state`, `release`,
`append_context(s)`, `draft_scores`, `draft`). `append_contexts` stages each request's new
taps (at most R = L + 1 rows: what a round commits) into the device buffer of the next pass;
a longer run of rows (a first draft's prompt, or the taps a gated request queued over rounds
it did not draft) runs through the context graph at once, eagerly, like a prefill.
`draft_scores` is one non_blocking upload of [B, 4] metadata into its bucket, then the device
part (`runtime.model.draft_forward.draft_round`; a graph replay on CUDA), and scores whose
top K is already computed on the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from runtime.backends.static_pool import StaticPool, StaticSlot
from runtime.drafter.executor import bind_to_target
from runtime.drafter.vocab import DraftHead, DraftScores
from runtime.engine.model_runner import BATCH_BUCKETS, Bucket, bucket_of, capture
from runtime.model.batch_draft_graph import BatchDraftGraph
from runtime.model.draft_forward import draft_round
from runtime.model.draft_graphs import ContextGraph


class RankedScores(DraftScores):
    """Draft scores whose top K per position the device part already took."""

    def __init__(self, logits, target_ids, vocab_size, ids: torch.Tensor, lp: torch.Tensor) -> None:
        super().__init__(logits, target_ids, vocab_size)
        self.ranked = (ids, lp)

    def topk(self, k: int, positions: int | None = None, host: bool = True):
        ids, lp = self.ranked
        if k != ids.shape[2] or (positions or self.num_positions) > ids.shape[1]:
            return super().topk(k, positions, host)
        ids, lp = ids[:, :positions], lp[:, :positions]
        return (ids.cpu().numpy(), lp.cpu().numpy()) if host else (ids, lp)


@dataclass
class DraftBucket:
    host: torch.Tensor  # pinned int64 [B, 4]
    meta: torch.Tensor
    taps: torch.Tensor  # [B, R, F] staged taps
    outputs: tuple | None = None
    graph: Any = None
    uploaded: Any = None  # CUDA event after the last upload (see `model_runner.Bucket.host_buffer`)

    host_buffer = Bucket.host_buffer


class DraftRunner:
    name = "runner"

    def __init__(self, drafter, target, rank_cap: int = 8, max_slots: int = 32, max_context: int | None = None,
                 graphs: bool | None = None) -> None:
        self.drafter, _ = bind_to_target(drafter, target)
        self.target, cfg = target, self.drafter.config
        weight = target.lm_head.weight
        self.config, self.device, self.dtype = cfg, weight.device, weight.dtype
        self.tap_layer_ids, self.num_draft_positions = tuple(cfg.target_layer_ids), cfg.num_draft_positions
        self.vocab_size = target.config.vocab_size
        self.draft_ids = DraftHead(weight, self.drafter.d2t).target_ids
        max_context = min(target.config.context_window, 4096) if max_context is None else max_context
        self.pool = StaticPool(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, max_slots, max_context,
                               self.dtype, self.device)
        self.context, self.block = ContextGraph(self.drafter, kv_layout="token"), BatchDraftGraph(self.drafter, target)
        self.rows, self.rank_cap = cfg.num_draft_positions + 1, rank_cap
        self.graphs = (self.device.type == "cuda") if graphs is None else graphs and self.device.type == "cuda"
        self.taps_width = len(self.tap_layer_ids) * target.config.hidden_size
        self.buckets: dict[int, DraftBucket] = {}
        self.mempool = torch.cuda.graph_pool_handle() if self.graphs else None
        self.uploads = 0

    @property
    def mass_exponent(self) -> float:
        return self.config.mass_exponent

    def new_state(self, capacity: int) -> StaticSlot:
        return self.pool.acquire(capacity)

    def release(self, state: StaticSlot) -> None:
        state.release()

    def append_context(self, state: StaticSlot, taps: torch.Tensor) -> None:
        self.append_contexts([state], [taps])

    @torch.inference_mode()
    def append_contexts(self, states: Sequence[StaticSlot], taps: Sequence[torch.Tensor]) -> None:
        """Stage each request's new taps for its next block pass; a run longer than R rows goes
        through the context graph now (module docstring)."""
        if len(states) != len(taps) or any(t.dim() != 2 for t in taps):
            raise ValueError(f"{len(states)} feature caches need as many [m, F] tap arrays, got "
                             f"{[tuple(t.shape) for t in taps]}")
        for state, rows in zip(states, taps):
            staged = sum(t.shape[0] for t in state.staged) + rows.shape[0]
            state.check_room(staged)
            state.staged.append(rows)
            if staged > self.rows:
                self._context_now(state)

    def _context_now(self, state: StaticSlot) -> None:
        rows = torch.cat(state.staged).to(self.device, self.dtype)
        columns = torch.arange(state.length, state.length + rows.shape[0], device=self.device)
        keys, values = self.context(rows, columns)
        self.pool.scatter(torch.full_like(columns, state.index), columns, keys, values)
        state.length += rows.shape[0]
        state.staged = []

    def draft(self, states: Sequence[StaticSlot], roots: Sequence[int]) -> torch.Tensor:
        return self.draft_scores(states, roots).full()

    @torch.inference_mode()
    def draft_scores(self, states: Sequence[StaticSlot], roots: Sequence[int]) -> RankedScores:
        """ONE block pass over every drafting request (with the context pass over their staged taps)."""
        if len(states) != len(roots):
            raise ValueError(f"{len(states)} feature caches but {len(roots)} roots")
        B = len(states)
        bucket = self.bucket(B)
        meta = bucket.host_buffer()
        meta[:] = 0  # rows past B: slot 0, nothing staged (their writes go to the trash column)
        for b, (state, root) in enumerate(zip(states, roots)):
            new = sum(t.shape[0] for t in state.staged)
            state.check_room(new + self.rows)
            meta[b] = (state.index, state.length, new, root)
            row = 0
            for t in state.staged:  # device copies into the static buffer, no host read
                bucket.taps[b, row:row + t.shape[0]].copy_(t)
                row += t.shape[0]
            state.length += new
            state.staged = []
        bucket.meta.copy_(bucket.host, non_blocking=True)
        if self.device.type == "cuda":
            bucket.uploaded = torch.cuda.Event()
            bucket.uploaded.record()
        self.uploads += 1
        if bucket.graph is not None:
            bucket.graph.replay()
        else:
            bucket.outputs = self._call(bucket)
        ids, lp, logits = bucket.outputs
        return RankedScores(logits[:B], self.draft_ids, self.vocab_size, ids[:B], lp[:B])

    def bucket(self, batch: int) -> DraftBucket:
        size = bucket_of(batch, BATCH_BUCKETS)
        if size not in self.buckets:
            host = torch.zeros((size, 4), dtype=torch.int64, pin_memory=self.device.type == "cuda")
            taps = torch.zeros((size, self.rows, self.taps_width), dtype=self.dtype, device=self.device)
            bucket = DraftBucket(host, torch.zeros_like(host, device=self.device), taps)
            if self.graphs:
                self._capture(bucket)
            self.buckets[size] = bucket
        return self.buckets[size]

    def _call(self, bucket: DraftBucket):
        return draft_round(self.context, self.block, self.pool, bucket.meta, bucket.taps, self.config.mask_token_id,
                           self.num_draft_positions, self.rank_cap, self.draft_ids)

    def _capture(self, bucket: DraftBucket) -> None:
        """The idle metadata stages no row: warm-up and capture write the trash column only."""
        bucket.graph, bucket.outputs = capture(lambda: self._call(bucket), self.mempool)
