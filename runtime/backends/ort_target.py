"""The target on onnxruntime (CPU, fp32): the `TargetBackend` contract over the exported
batched verify graph (`runtime.model.batch_graph`), K/V kept in place in one slot pool.

    OrtTarget(models.target, drafter.tap_layer_ids, threads=2)   # exported on first use

Cache: one `SlotPool` for every request ([slots, Hkv, C, d] per layer); a request is a
`Slot`. `verify` runs ONE graph pass over every request's pack, binding the pool's
per-layer arrays over the batch's slot range as inputs (no copy of any prefix); the
pack's new K/V rows come back as outputs and `commit` gathers the kept ones into the
slot at [P, P+m). Prefill is the same graph over the prompt as a causal chain, scoring
its last row only (`logit_rows`).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from cast_trtllm.masks import ancestor_matrix, position_ids
from cast_trtllm.tree import Tree
from runtime.backends.onnx_cache import session_options, verify_graph_path
from runtime.backends.slot_pool import MASKED, Slot, SlotPool
from runtime.model.batch_graph import pool_input_names
from runtime.model.llama import LlamaTarget
from runtime.model.tree_attention_backend import causal_chain


def pack_inputs(slots: Sequence[Slot], masks: Sequence[np.ndarray], lo: int, hi: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """gather_rows [S, n], scatter_rows [T], pack_mask [S, n, n] of a flattened batch whose
    request b (slot `slots[b]`) has the [n_b, n_b] visibility matrix `masks[b]`."""
    sizes = [len(m) for m in masks]
    n, offsets = max(sizes), np.cumsum([0] + sizes)
    gather = np.zeros((hi - lo, n), dtype=np.int64)
    scatter = np.empty(offsets[-1], dtype=np.int64)
    pack = np.full((hi - lo, n, n), MASKED, dtype=np.float32)
    for slot, mask, size, row in zip(slots, masks, sizes, offsets):
        s = slot.index - lo
        gather[s, :size] = np.arange(row, row + size)
        gather[s, size:] = row
        scatter[row:row + size] = s * n + np.arange(size)
        pack[s, :size, :size] = np.where(mask, 0.0, MASKED)
    return gather, scatter, pack


class OrtTarget:
    """The target's batched verify graph on onnxruntime's CPU execution provider, fp32.

    model: the fp32 torch target (kept: the drafter reads its embeddings and lm_head);
    tap_layer_ids: the drafter's tapped layers (they are graph outputs, so part of the export);
    threads: onnxruntime intra-op threads (default: torch's thread count);
    cache_dir: where exported graphs live (default $CAST_CACHE_DIR/onnx);
    spinning: let idle intra-op workers spin-wait for the next pass. Off by default: in the
      engine the torch drafter runs between two verify passes, and spinning workers take its
      cores (embedded target, 2 cores, CAST N = 15: draft 2.1 s vs 0.9 s, 21 vs 31 tokens/s).
    """

    name = "onnxruntime"

    def __init__(self, model: LlamaTarget, tap_layer_ids: Sequence[int] = (), threads: int | None = None,
                 cache_dir: str | Path | None = None, spinning: bool = False) -> None:
        import onnxruntime as ort

        weight = model.lm_head.weight
        if weight.dtype != torch.float32 or weight.device.type != "cpu":
            raise ValueError(f"OrtTarget runs an fp32 CPU target; this one is {weight.dtype} on {weight.device} "
                             "(load it with --dtype float32 --device cpu)")
        cfg = model.config
        bad = [i for i in tap_layer_ids if not 0 <= i < cfg.num_layers]
        if bad:
            raise ValueError(f"tap layer ids {bad} are outside the target's {cfg.num_layers} layers")
        threads = torch.get_num_threads() if threads is None else threads
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.model, self.config = model, cfg
        self.tap_layer_ids = tuple(int(i) for i in tap_layer_ids)
        self.device, self.dtype, self.threads = torch.device("cpu"), torch.float32, threads
        path = verify_graph_path(model, self.tap_layer_ids, cache_dir)
        options = session_options(threads, spinning)
        start = time.perf_counter()
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        print(f"[ort] verify graph loaded in {time.perf_counter() - start:.1f} s ({threads} thread(s))",
              file=sys.stderr, flush=True)
        self.tap_width = len(self.tap_layer_ids) * cfg.hidden_size  # F
        self.pool = SlotPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim)
        self.pool_names = pool_input_names("past", cfg.num_layers)

    def new_sequence(self, capacity: int) -> Slot:
        return self.pool.acquire(capacity)

    def release(self, seq: Slot) -> None:
        seq.release()

    def prefix_len(self, seq: Slot) -> int:
        return seq.length

    def _run(self, slots: Sequence[Slot], tokens: np.ndarray, positions: np.ndarray, masks: Sequence[np.ndarray],
             logit_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """ONE graph pass over the flattened tokens [T] of `slots` (request b: rows of size
        len(masks[b]), in order). Leaves each slot's new K/V pending; -> logits [m, V], taps [T, F]."""
        for slot, mask in zip(slots, masks):
            slot.check_room(len(mask))
        lo, hi = self.pool.slot_range(list(slots))
        gather, scatter, pack = pack_inputs(slots, masks, lo, hi)
        total, (layers, hkv, d) = len(tokens), self.pool.shape
        logits = np.empty((len(logit_rows), self.config.vocab_size), dtype=np.float32)  # fresh: the engine keeps it
        keys, values = (np.empty((total, layers, hkv, d), dtype=np.float32) for _ in range(2))
        taps = np.empty((total, self.tap_width), dtype=np.float32) if self.tap_layer_ids else None
        binding = self.session.io_binding()
        for name, array in (("input_ids", tokens), ("position_ids", positions), ("gather_rows", gather),
                            ("scatter_rows", scatter), ("past_mask", self.pool.past_mask(list(slots), lo, hi)),
                            ("pack_mask", pack), ("logit_rows", logit_rows)):
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name, array in zip(self.pool_names, [*self.pool.keys, *self.pool.values]):
            view = array[lo:hi]  # [S, Hkv, C, d], contiguous: bound in place
            binding.bind_input(name, "cpu", 0, np.float32, list(view.shape), view.ctypes.data)
        outputs = (("logits", logits), ("new_keys", keys), ("new_values", values)) + (
            (("taps", taps),) if taps is not None else ())
        for name, array in outputs:
            binding.bind_output(name, "cpu", 0, np.float32, list(array.shape), array.ctypes.data)
        self.session.run_with_iobinding(binding)
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
        logits, taps = self._run([seq], tokens, positions, [ancestor_matrix(causal_chain(n))], np.array([n - 1]))
        self.pool.commit(seq, np.arange(n))
        return torch.from_numpy(logits), None if taps is None else torch.from_numpy(taps)

    def verify(self, seqs: Sequence[Slot], packs: Sequence[np.ndarray], trees: Sequence[Tree]
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ONE graph pass over every pack. packs: B × [n_b] int64 [b, z_1..z_N].
        Returns logits [Σn, V], taps [Σn, F] | None; leaves n_b pending rows per sequence."""
        sizes = [t.num_packed for t in trees]
        if [len(p) for p in packs] != sizes or len(seqs) != len(sizes):
            raise ValueError(f"{len(seqs)} sequences, pack lengths {[len(p) for p in packs]}, tree sizes {sizes}")
        tokens = np.concatenate([np.asarray(p, dtype=np.int64) for p in packs])
        positions = np.concatenate([position_ids(t, s.length) for s, t in zip(seqs, trees)])
        logits, taps = self._run(seqs, tokens, positions, [ancestor_matrix(t) for t in trees],
                                 np.arange(len(tokens), dtype=np.int64))
        return torch.from_numpy(logits), None if taps is None else torch.from_numpy(taps)

    def commit(self, seq: Slot, kept_rows: np.ndarray) -> None:
        """Keep pack rows [0] + accepted path: K/V -> x∘b∘y_1:A."""
        self.pool.commit(seq, kept_rows)
