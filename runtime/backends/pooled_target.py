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

from cast_trtllm.tree import Tree
from runtime.backends.slot_pool import Slot, SlotPool, flat_rows, pack_inputs
from runtime.device_trees import TreeBatch
from runtime.model.llama import TargetConfig


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

    def _run(self, slots: Sequence[Slot], tokens: np.ndarray | torch.Tensor, positions: np.ndarray | torch.Tensor,
             visible: torch.Tensor, sizes: Sequence[int], logit_rows: np.ndarray
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ONE pass over the flattened tokens [T] of `slots` (request b: its first sizes[b] pack
        rows, seeing `visible[b]` of [B, n, n]). Leaves each slot's new K/V pending;
        -> logits [m, V], taps [T, F] | None."""
        for slot, size in zip(slots, sizes):
            slot.check_room(size)
        lo, hi = self.pool.slot_range(list(slots))
        gather, scatter, pack = pack_inputs(slots, sizes, visible, lo, hi)
        inputs = {"input_ids": tokens, "position_ids": positions, "gather_rows": gather, "scatter_rows": scatter,
                  "past_mask": self.pool.past_mask(list(slots), lo, hi), "pack_mask": pack, "logit_rows": logit_rows}
        logits, keys, values, taps = self._forward(inputs, lo, hi)
        row = 0
        for slot, size in zip(slots, sizes):
            slot.pending = (keys, values, row)
            row += size
        return logits, taps

    def prefill(self, seq: Slot, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the prompt [P] as a chain and commit it -> (last-row logits [1, V], taps [P, F])."""
        if token_ids.dim() != 1 or token_ids.numel() == 0:
            raise ValueError("prefill needs a non-empty 1-D tensor of token ids")
        tokens = token_ids.cpu().numpy().astype(np.int64)
        n = len(tokens)
        positions = np.arange(seq.length, seq.length + n, dtype=np.int64)
        causal = torch.ones(1, n, n, dtype=torch.bool, device=self.device).tril()
        out = self._run([seq], tokens, positions, causal, [n], np.array([n - 1]))
        self.pool.commit_many([seq], [np.arange(n)])
        return out

    def verify(self, seqs: Sequence[Slot], packs: Sequence[np.ndarray], trees: Sequence[Tree]
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ONE pass over every pack. packs: B × [n_b] int64 [b, z_1..z_N].
        Returns logits [Σn, V], taps [Σn, F] | None; leaves n_b pending rows per sequence."""
        sizes = [t.num_packed for t in trees]
        if [len(p) for p in packs] != sizes or len(seqs) != len(sizes):
            raise ValueError(f"{len(seqs)} sequences, pack lengths {[len(p) for p in packs]}, tree sizes {sizes}")
        roots = torch.as_tensor([int(p[0]) for p in packs], dtype=torch.int64, device=self.device)
        return self.verify_trees(seqs, roots, TreeBatch.from_host(trees, self.device), [n - 1 for n in sizes])

    def verify_trees(self, seqs: Sequence[Slot], roots: torch.Tensor, trees: TreeBatch, sizes: Sequence[int]
                     ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ONE pass over every request's pack [root, first sizes[b] nodes of its tree], built
        on the device from the trees' tensors (no host read). roots: [B] on this device.
        Returns logits [Σn, V], taps [Σn, F] | None, rows in `flat_rows` order."""
        packed = [1 + s for s in sizes]
        n = max(packed)
        tokens, _, depth = trees.pack(roots)  # [B, 1 + W]
        request, row = (torch.from_numpy(a).to(self.device) for a in flat_rows(packed))
        lengths = torch.as_tensor([s.length for s in seqs], dtype=torch.int64, device=self.device)
        visible = trees.ancestors()[:, :n, :n]  # nodes past every size are not packed
        return self._run(seqs, tokens[request, row], lengths[request] + depth[request, row], visible, packed,
                         np.arange(len(request), dtype=np.int64))

    def commit(self, seq: Slot, kept_rows: np.ndarray) -> None:
        """Keep pack rows [0] + accepted path: K/V -> x∘b∘y_1:A."""
        self.pool.commit_many([seq], [kept_rows])

    def commit_many(self, seqs: Sequence[Slot], kept_rows: Sequence[np.ndarray]) -> None:
        """`commit` for every request of one pass: one gather-scatter on the device."""
        self.pool.commit_many(seqs, kept_rows)
