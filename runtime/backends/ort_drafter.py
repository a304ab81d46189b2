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
from pathlib import Path

import numpy as np
import torch

from runtime.backends.onnx_cache import (cpu_sessions, cpu_threads, export_once, hash_weights, model_identity,
                                         onnx_root, run_bound)
from runtime.backends.pooled_drafter import PooledDrafter
from runtime.drafter.executor import bind_to_target
from runtime.drafter.model import DFlashDrafter
from runtime.model import batch_draft_graph, draft_graphs
from runtime.model.draft_graphs import CONTEXT_OUTPUTS
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
        threads = cpu_threads("OrtDrafter", target.lm_head.weight, threads)
        drafter, _ = bind_to_target(drafter, target)
        self._init_pool(drafter, target)
        paths = drafter_graph_paths(drafter, target, cache_dir, export)
        self.draft_session, self.context_session = cpu_sessions(paths, threads, spinning, "drafter graphs")
        self.pool_names = pool_input_names("context", drafter.config.num_hidden_layers)

    def _context(self, taps: torch.Tensor, positions: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        outputs = {name: np.empty((len(taps), *self.pool.shape), dtype=np.float32) for name in CONTEXT_OUTPUTS}
        inputs = {"taps": np.ascontiguousarray(taps.cpu(), dtype=np.float32), "position_ids": positions}
        run_bound(self.context_session, inputs, {}, outputs)
        return tuple(torch.from_numpy(a) for a in outputs.values())

    def _draft(self, inputs: dict[str, np.ndarray], lo: int, hi: int) -> torch.Tensor:
        logits = np.empty((len(inputs["block_ids"]), self.num_draft_positions, self.draft_vocab), dtype=np.float32)
        run_bound(self.draft_session, inputs, dict(zip(self.pool_names, self.pool.layer_views(lo, hi))),
                  {"logits": logits})  # [B, L, Vd]
        return torch.from_numpy(logits)
