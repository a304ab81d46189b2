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

import numpy as np
import torch

from runtime.backends.onnx_cache import export_once, hash_weights, model_identity, onnx_root, session_options
from runtime.backends.pooled_drafter import PooledDrafter
from runtime.drafter.executor import bind_to_target
from runtime.drafter.model import DFlashDrafter
from runtime.model import batch_draft_graph, draft_graphs
from runtime.model.graphs import pool_input_names
from runtime.model.llama import LlamaTarget

DRAFT_FILE, CONTEXT_FILE = "draft.onnx", "context.onnx"


def drafter_identity(drafter: DFlashDrafter, target: LlamaTarget) -> str:
    """16 hex digits naming (target, drafter config, drafter weights, graph code)."""
    digest = hashlib.sha256(model_identity(target, ()).encode())
    digest.update(repr(drafter.config).encode() + inspect.getsource(draft_graphs).encode()
                  + inspect.getsource(batch_draft_graph).encode())
    hash_weights(digest, drafter)
    return digest.hexdigest()[:16]


def drafter_graph_paths(drafter: DFlashDrafter, target: LlamaTarget, cache_dir: str | Path | None = None,
                        export: bool = True) -> tuple[Path, Path]:
    """(draft, context) graphs of this drafter over `target`, exporting them on first use
    (`export=False`: a built engine's folder, read only)."""
    folder = onnx_root(cache_dir) / f"drafter-{drafter_identity(drafter, target)}"

    def write(scratch: Path) -> None:
        batch_draft_graph.export_batch_draft_graph(batch_draft_graph.BatchDraftGraph(drafter, target),
                                                   scratch / DRAFT_FILE)
        draft_graphs.export_context_graph(draft_graphs.ContextGraph(drafter, kv_layout="token"), scratch / CONTEXT_FILE)

    return export_once(folder, (DRAFT_FILE, CONTEXT_FILE), "the drafter's graphs", write, export)


class OrtDrafter(PooledDrafter):
    """The drafter's batched graphs on onnxruntime's CPU execution provider, fp32.

    drafter, target: the torch modules (the target fp32 on CPU; its embeddings and lm_head
      are the drafter's); threads: onnxruntime intra-op threads (default: torch's);
    cache_dir: where exported graphs live (default $CAST_CACHE_DIR/onnx; a built engine's
      `onnxruntime/` folder with export=False, which only reads it);
    spinning: let idle intra-op workers spin-wait (off: the target runs between passes).
    """

    name = "onnxruntime"

    def __init__(self, drafter: DFlashDrafter, target: LlamaTarget, threads: int | None = None,
                 cache_dir: str | Path | None = None, spinning: bool = False, export: bool = True) -> None:
        import onnxruntime as ort

        weight = target.lm_head.weight
        if weight.dtype != torch.float32 or weight.device.type != "cpu":
            raise ValueError(f"OrtDrafter runs with an fp32 CPU target; this one is {weight.dtype} on "
                             f"{weight.device} (load it with --dtype float32 --device cpu)")
        threads = torch.get_num_threads() if threads is None else threads
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        drafter, _ = bind_to_target(drafter, target)
        self._init_pool(drafter, target)
        self.threads = threads
        options = session_options(threads, spinning)
        start = time.perf_counter()
        draft_path, context_path = drafter_graph_paths(drafter, target, cache_dir, export)
        providers = ["CPUExecutionProvider"]
        self.draft_session = ort.InferenceSession(str(draft_path), options, providers=providers)
        self.context_session = ort.InferenceSession(str(context_path), options, providers=providers)
        self.pool_names = pool_input_names("context", drafter.config.num_hidden_layers)
        print(f"[ort] drafter graphs loaded in {time.perf_counter() - start:.1f} s ({threads} thread(s))",
              file=sys.stderr, flush=True)

    def _context(self, taps: torch.Tensor, positions: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        layers, hkv, d = self.pool.shape
        keys, values = (np.empty((len(taps), layers, hkv, d), dtype=np.float32) for _ in range(2))
        binding = self.context_session.io_binding()
        binding.bind_cpu_input("taps", np.ascontiguousarray(taps.cpu(), dtype=np.float32))
        binding.bind_cpu_input("position_ids", positions)
        for name, array in (("context_keys", keys), ("context_values", values)):
            binding.bind_output(name, "cpu", 0, np.float32, list(array.shape), array.ctypes.data)
        self.context_session.run_with_iobinding(binding)
        return torch.from_numpy(keys), torch.from_numpy(values)

    def _draft(self, inputs: dict[str, np.ndarray], lo: int, hi: int) -> torch.Tensor:
        batch = len(inputs["block_ids"])
        sub = np.empty((batch, self.num_draft_positions, self.draft_vocab), dtype=np.float32)  # [B, L, Vd]
        binding = self.draft_session.io_binding()
        for name, array in inputs.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name, view in zip(self.pool_names, self.pool.layer_views(lo, hi)):  # bound in place
            binding.bind_input(name, "cpu", 0, np.float32, list(view.shape), view.data_ptr())
        binding.bind_output("logits", "cpu", 0, np.float32, list(sub.shape), sub.ctypes.data)
        self.draft_session.run_with_iobinding(binding)
        return torch.from_numpy(sub)
