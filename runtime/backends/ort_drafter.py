"""The DFlash drafter on onnxruntime (CPU, fp32): `DrafterExecutor`'s interface and math
over the exported batched draft graph (`runtime.model.batch_draft_graph`) and the context
graph (`runtime.model.draft_graphs.ContextGraph`), the feature cache in one slot pool.

    OrtDrafter(models.drafter, models.target, threads=2)   # exported on first use

Feature cache: one `SlotPool` ([slots, Hkv, C, d] per drafter layer); a request is a
`Slot`. `append_contexts` runs the context graph ONCE over every request's new taps and
gathers each request's rows into its slot; `draft_scores` runs the draft graph ONCE over
every drafting request's block, the pool's slot range bound in place as its context.

With a reduced draft vocabulary the graph scores only its Vd rows of the lm_head and the
engine takes each position's top K over those Vd columns (`DraftScores`); `draft` spreads
them to [B, L, V], -inf elsewhere (`runtime.drafter.vocab.DraftHead`'s contract).
Graphs land in $CAST_CACHE_DIR/onnx/<identity>/{draft,context}.onnx, the identity hashing
the target (`onnx_cache.model_identity`), the drafter's config, a strided sample of its
weights and the graph code.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from runtime.backends.onnx_cache import export_once, hash_weights, model_identity, onnx_root, session_options
from runtime.backends.slot_pool import MASKED, Slot, SlotPool
from runtime.drafter.executor import bind_to_target
from runtime.drafter.model import DFlashDrafter
from runtime.drafter.vocab import DraftHead, DraftScores
from runtime.model import batch_draft_graph, draft_graphs
from runtime.model.batch_graph import pool_input_names
from runtime.model.llama import LlamaTarget

DRAFT_FILE, CONTEXT_FILE = "draft.onnx", "context.onnx"


def drafter_identity(drafter: DFlashDrafter, target: LlamaTarget) -> str:
    """16 hex digits naming (target, drafter config, drafter weights, graph code)."""
    digest = hashlib.sha256(model_identity(target, ()).encode())
    digest.update(repr(drafter.config).encode() + inspect.getsource(draft_graphs).encode()
                  + inspect.getsource(batch_draft_graph).encode())
    hash_weights(digest, drafter)
    return digest.hexdigest()[:16]


def drafter_graph_paths(drafter: DFlashDrafter, target: LlamaTarget, cache_dir: str | Path | None = None
                        ) -> tuple[Path, Path]:
    """(draft, context) graphs of this drafter over `target`, exporting them on first use."""
    folder = onnx_root(cache_dir) / f"drafter-{drafter_identity(drafter, target)}"

    def write(scratch: Path) -> None:
        batch_draft_graph.export_batch_draft_graph(batch_draft_graph.BatchDraftGraph(drafter, target),
                                                   scratch / DRAFT_FILE)
        draft_graphs.export_context_graph(draft_graphs.ContextGraph(drafter, kv_layout="token"), scratch / CONTEXT_FILE)

    return export_once(folder, (DRAFT_FILE, CONTEXT_FILE), "the drafter's graphs", write)


class OrtDrafter:
    """`DrafterExecutor` on onnxruntime's CPU execution provider, fp32.

    drafter, target: the torch modules (the target fp32 on CPU; its embeddings and lm_head
      are the drafter's); threads: onnxruntime intra-op threads (default: torch's);
    cache_dir: where exported graphs live (default $CAST_CACHE_DIR/onnx);
    spinning: let idle intra-op workers spin-wait (off: the target runs between passes).
    """

    name = "onnxruntime"

    def __init__(self, drafter: DFlashDrafter, target: LlamaTarget, threads: int | None = None,
                 cache_dir: str | Path | None = None, spinning: bool = False) -> None:
        import onnxruntime as ort

        weight = target.lm_head.weight
        if weight.dtype != torch.float32 or weight.device.type != "cpu":
            raise ValueError(f"OrtDrafter runs with an fp32 CPU target; this one is {weight.dtype} on "
                             f"{weight.device} (load it with --dtype float32 --device cpu)")
        threads = torch.get_num_threads() if threads is None else threads
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        drafter, _ = bind_to_target(drafter, target)
        cfg = drafter.config
        self.config, self.threads = cfg, threads
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.tap_layer_ids = tuple(cfg.target_layer_ids)
        self.num_draft_positions = cfg.num_draft_positions  # L
        self.vocab_size = target.config.vocab_size  # V
        head = DraftHead(weight, drafter.d2t)
        self.draft_ids = head.target_ids  # [Vd] target ids (None: the full vocabulary)
        self.draft_vocab = self.vocab_size if self.draft_ids is None else len(self.draft_ids)  # Vd
        options = session_options(threads, spinning)
        start = time.perf_counter()
        draft_path, context_path = drafter_graph_paths(drafter, target, cache_dir)
        providers = ["CPUExecutionProvider"]
        self.draft_session = ort.InferenceSession(str(draft_path), options, providers=providers)
        self.context_session = ort.InferenceSession(str(context_path), options, providers=providers)
        self.pool = SlotPool(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim)
        self.pool_names = pool_input_names("context", cfg.num_hidden_layers)
        print(f"[ort] drafter graphs loaded in {time.perf_counter() - start:.1f} s ({threads} thread(s))",
              file=sys.stderr, flush=True)

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
        total = sum(sizes)
        if total == 0:
            return
        self.pool.reserve(max(s.length + m for s, m in zip(states, sizes)))
        rows = np.concatenate([t.detach().cpu().numpy() for t in taps]).astype(np.float32, copy=False)
        positions = np.concatenate([np.arange(s.length, s.length + m) for s, m in zip(states, sizes)])
        layers, hkv, d = self.pool.shape
        keys, values = (np.empty((total, layers, hkv, d), dtype=np.float32) for _ in range(2))
        binding = self.context_session.io_binding()
        binding.bind_cpu_input("taps", np.ascontiguousarray(rows))
        binding.bind_cpu_input("position_ids", positions.astype(np.int64))
        for name, array in (("context_keys", keys), ("context_values", values)):
            binding.bind_output(name, "cpu", 0, np.float32, list(array.shape), array.ctypes.data)
        self.context_session.run_with_iobinding(binding)
        row, pending = 0, (torch.from_numpy(keys), torch.from_numpy(values))
        for state, m in zip(states, sizes):
            state.pending = (*pending, row)
            self.pool.commit(state, np.arange(m))
            row += m

    def draft(self, states: Sequence[Slot], roots: Sequence[int]) -> torch.Tensor:
        """Logits [B, L, V] of the marginals q_1..q_L of every request's block."""
        return self.draft_scores(states, roots).full()

    def draft_scores(self, states: Sequence[Slot], roots: Sequence[int]) -> DraftScores:
        """ONE block pass: the marginals q_1..q_L of every request's block, over the draft vocabulary [B, L, Vd]."""
        if len(states) != len(roots):
            raise ValueError(f"{len(states)} feature caches but {len(roots)} roots")
        cfg, S, L = self.config, self.config.block_size, self.num_draft_positions
        B = len(roots)
        block = np.full((B, S), cfg.mask_token_id, dtype=np.int64)  # [b, mask, ...]
        block[:, 0] = roots
        positions = np.stack([np.arange(s.length, s.length + S) for s in states]).astype(np.int64)  # [B, S]
        lo, hi = self.pool.slot_range(list(states))
        columns = np.arange(self.pool.capacity)
        lengths = np.array([s.length for s in states])
        mask = np.where(columns[None, :] < lengths[:, None], 0.0, MASKED).astype(np.float32)  # [B, C]
        sub = np.empty((B, L, self.draft_vocab), dtype=np.float32)  # [B, L, Vd]
        binding = self.draft_session.io_binding()
        for name, array in (("block_ids", block), ("position_ids", positions), ("context_mask", mask),
                            ("slot_rows", np.array([s.index - lo for s in states], dtype=np.int64))):
            binding.bind_cpu_input(name, array)
        for name, array in zip(self.pool_names, [*self.pool.keys, *self.pool.values]):
            view = array[lo:hi]  # [S, Hkv, C, d], bound in place
            binding.bind_input(name, "cpu", 0, np.float32, list(view.shape), view.data_ptr())
        binding.bind_output("logits", "cpu", 0, np.float32, list(sub.shape), sub.ctypes.data)
        self.draft_session.run_with_iobinding(binding)
        return DraftScores(torch.from_numpy(sub), self.draft_ids, self.vocab_size)
