"""The `TargetBackend` contract over one batched forward and one slot pool, whatever runs it.

Every backend runs the same forward, `runtime.model.batch_graph.BatchVerifyGraph`: torch
eagerly (`runtime.engine.backend.TorchTarget`, CPU or CUDA, fp32 or bf16) or onnxruntime
over its exported graph (`runtime.backends.ort_target.OrtTarget`). This base owns what
they share: the `SlotPool` (a request is a `Slot`), building one pass's inputs from the
requests' trees, leaving the new K/V pending, and `commit` gathering the kept rows.
A subclass implements `_forward` only.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from cast_trtllm.masks import ancestor_matrix, position_ids
from cast_trtllm.tree import Tree
from runtime.backends.slot_pool import Slot, SlotPool, pack_inputs
from runtime.model.llama import TargetConfig
from runtime.model.tree_attention_backend import causal_chain


class PooledTarget:
    name: str
    config: TargetConfig
    tap_layer_ids: tuple[int, ...]
    device: torch.device
    dtype: torch.dtype

    def _init_pool(self) -> None:
        cfg = self.config
        self.pool = SlotPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, self.dtype, self.device)
        self.tap_width = len(self.tap_layer_ids) * cfg.hidden_size  # F

    def _forward(self, inputs: dict[str, np.ndarray], lo: int, hi: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """ONE pass: `BatchVerifyGraph`'s named inputs (the pool's slots [lo, hi) bound by the
        subclass) -> logits [m, V], new_keys, new_values [T, layers, Hkv, d], taps [T, F] | None."""
        raise NotImplementedError

    def new_sequence(self, capacity: int) -> Slot:
        return self.pool.acquire(capacity)

    def release(self, seq: Slot) -> None:
        seq.release()

    def prefix_len(self, seq: Slot) -> int:
        return seq.length

    def _run(self, slots: Sequence[Slot], tokens: np.ndarray, positions: np.ndarray, masks: Sequence[np.ndarray],
             logit_rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ONE pass over the flattened tokens [T] of `slots` (request b: len(masks[b]) rows, in
        order). Leaves each slot's new K/V pending; -> logits [m, V], taps [T, F] | None."""
        for slot, mask in zip(slots, masks):
            slot.check_room(len(mask))
        self.pool.reserve(max(slot.length + len(mask) for slot, mask in zip(slots, masks)))
        lo, hi = self.pool.slot_range(list(slots))
        gather, scatter, pack = pack_inputs(slots, masks, lo, hi)
        inputs = {"input_ids": tokens, "position_ids": positions, "gather_rows": gather, "scatter_rows": scatter,
                  "past_mask": self.pool.past_mask(list(slots), lo, hi), "pack_mask": pack, "logit_rows": logit_rows}
        logits, keys, values, taps = self._forward(inputs, lo, hi)
        row = 0
        for slot, mask in zip(slots, masks):
            slot.pending = (keys, values, row)
            row += len(mask)
        return logits, taps

    def prefill(self, seq: Slot, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the prompt [P] as a chain and commit it -> (last-row logits [1, V], taps [P, F])."""
        if token_ids.dim() != 1 or token_ids.numel() == 0:
            raise ValueError("prefill needs a non-empty 1-D tensor of token ids")
        tokens = token_ids.cpu().numpy().astype(np.int64)
        n = len(tokens)
        positions = np.arange(seq.length, seq.length + n, dtype=np.int64)
        out = self._run([seq], tokens, positions, [ancestor_matrix(causal_chain(n))], np.array([n - 1]))
        self.pool.commit(seq, np.arange(n))
        return out

    def verify(self, seqs: Sequence[Slot], packs: Sequence[np.ndarray], trees: Sequence[Tree]
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ONE pass over every pack. packs: B × [n_b] int64 [b, z_1..z_N].
        Returns logits [Σn, V], taps [Σn, F] | None; leaves n_b pending rows per sequence."""
        sizes = [t.num_packed for t in trees]
        if [len(p) for p in packs] != sizes or len(seqs) != len(sizes):
            raise ValueError(f"{len(seqs)} sequences, pack lengths {[len(p) for p in packs]}, tree sizes {sizes}")
        tokens = np.concatenate([np.asarray(p, dtype=np.int64) for p in packs])
        positions = np.concatenate([position_ids(t, s.length) for s, t in zip(seqs, trees)])
        return self._run(seqs, tokens, positions, [ancestor_matrix(t) for t in trees],
                         np.arange(len(tokens), dtype=np.int64))

    def commit(self, seq: Slot, kept_rows: np.ndarray) -> None:
        """Keep pack rows [0] + accepted path: K/V -> x∘b∘y_1:A."""
        self.pool.commit(seq, kept_rows)
