"""The drafter executor contract over one slot pool and two batched passes, whatever runs them.

Every drafter backend runs the same forwards: the context pass (target taps of committed
positions -> the drafter's feature-cache K/V, `runtime.model.draft_graphs.ContextGraph`)
and the block pass (`runtime.model.batch_draft_graph.BatchDraftGraph`): torch eagerly
(`runtime.drafter.executor.DrafterExecutor`) or onnxruntime exported
(`runtime.backends.ort_drafter.OrtDrafter`). This base owns what they share: the feature
cache pool (a request is a `Slot`), ONE context pass over every request's new taps, ONE
block pass over every drafting request, and the scores in the drafter's own vocabulary.
A subclass implements `_context` and `_draft` only.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from runtime.backends.slot_pool import Slot, SlotPool
from runtime.drafter.model import DFlashDrafter
from runtime.drafter.vocab import DraftHead, DraftScores
from runtime.model.llama import LlamaTarget


class PooledDrafter:
    def _init_pool(self, drafter: DFlashDrafter, target: LlamaTarget) -> None:
        """Common attributes of a drafter bound to `target` (see `bind_to_target`), and its pool."""
        cfg = drafter.config
        weight = target.lm_head.weight
        self.config = cfg
        self.device, self.dtype = weight.device, weight.dtype
        self.tap_layer_ids = tuple(cfg.target_layer_ids)
        self.num_draft_positions = cfg.num_draft_positions  # L
        self.vocab_size = target.config.vocab_size  # V
        self.draft_ids = DraftHead(weight, drafter.d2t).target_ids  # [Vd] target ids (None: the full vocabulary)
        self.draft_vocab = self.vocab_size if self.draft_ids is None else len(self.draft_ids)  # Vd
        self.pool = SlotPool(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, self.dtype, self.device)

    def _context(self, taps: torch.Tensor, positions: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """taps [T, F], positions [T] -> the rows' K, V [T, layers, Hkv, d]."""
        raise NotImplementedError

    def _draft(self, inputs: dict[str, np.ndarray], lo: int, hi: int) -> torch.Tensor:
        """`BatchDraftGraph`'s named inputs (the pool's slots [lo, hi) bound by the subclass)
        -> logits [B, L, Vd]."""
        raise NotImplementedError

    @property
    def mass_exponent(self) -> float:
        return self.config.mass_exponent

    def new_state(self, capacity: int) -> Slot:
        """An empty feature cache of `capacity` context rows."""
        return self.pool.acquire(capacity)

    def release(self, state: Slot) -> None:
        state.release()

    def append_context(self, state: Slot, taps: torch.Tensor) -> None:
        """taps: [m, F] target taps of the m newly committed positions, in order."""
        self.append_contexts([state], [taps])

    def append_contexts(self, states: Sequence[Slot], taps: Sequence[torch.Tensor]) -> None:
        """ONE context pass: taps[b] [m_b, F] of request b's newly committed positions, in order."""
        if len(states) != len(taps) or any(t.dim() != 2 for t in taps):
            raise ValueError(f"{len(states)} feature caches need as many [m, F] tap arrays, got "
                             f"{[tuple(t.shape) for t in taps]}")
        sizes = [t.shape[0] for t in taps]
        for state, m in zip(states, sizes):
            state.check_room(m)
        if sum(sizes) == 0:
            return
        rows = torch.cat([t.detach().float() for t in taps])  # [T, F] where the target left them
        positions = np.concatenate([np.arange(s.length, s.length + m) for s, m in zip(states, sizes)]).astype(np.int64)
        keys, values = self._context(rows, positions)
        row = 0
        for state, m in zip(states, sizes):
            state.pending = (keys, values, row)
            row += m
        self.pool.commit_many(states, [np.arange(m) for m in sizes])

    def draft(self, states: Sequence[Slot], roots: Sequence[int]) -> torch.Tensor:
        """Logits [B, L, V] of the marginals q_1..q_L of every request's block."""
        return self.draft_scores(states, roots).full()

    def draft_scores(self, states: Sequence[Slot], roots: Sequence[int]) -> DraftScores:
        """ONE block pass: the marginals q_1..q_L of every request's block, over the draft vocabulary [B, L, Vd]."""
        if len(states) != len(roots):
            raise ValueError(f"{len(states)} feature caches but {len(roots)} roots")
        cfg, S = self.config, self.config.block_size
        block = np.full((len(roots), S), cfg.mask_token_id, dtype=np.int64)  # [b, mask, ...]
        block[:, 0] = roots
        lo, hi = self.pool.slot_range(list(states))
        lengths = np.array([s.length for s in states])
        inputs = {"block_ids": block,
                  "position_ids": (lengths[:, None] + np.arange(S)).astype(np.int64),  # [B, S]
                  "slot_rows": np.array([s.index - lo for s in states], dtype=np.int64),
                  "context_mask": self.pool.length_mask(lengths)}  # [B, C]
        return DraftScores(self._draft(inputs, lo, hi), self.draft_ids, self.vocab_size)
