"""The target on onnxruntime (CPU, fp32): the `TargetBackend` contract over the exported
batched verify graph (`runtime.model.batch_graph`), K/V kept in place in one slot pool.

    OrtTarget(models.target, drafter.tap_layer_ids, threads=2)   # exported on first use

The round and the cache are `runtime.backends.pooled_target.PooledTarget`'s (one slot pool,
one pass per round over every request); here one pass is one graph run that binds the
pool's per-layer arrays over the batch's slot range as inputs, in place (no copy of any
prefix), and its outputs into fresh arrays.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from runtime.backends.onnx_cache import cpu_sessions, cpu_threads, run_bound, verify_graph_path
from runtime.backends.pooled_target import PooledTarget
from runtime.model.graphs import pool_input_names
from runtime.model.llama import LlamaTarget


class OrtTarget(PooledTarget):
    """The target's batched verify graph on onnxruntime's CPU execution provider, fp32.

    model: the fp32 torch target (kept: the drafter reads its embeddings and lm_head);
    tap_layer_ids: the drafter's tapped layers (they are graph outputs, so part of the export);
    threads: onnxruntime intra-op threads (default: torch's thread count);
    cache_dir: where exported graphs live (default $CAST_CACHE_DIR/onnx; a built engine's
      `onnxruntime/` folder with export=False, which only reads it);
    spinning: let idle intra-op workers spin-wait for the next pass. Off by default: in the
      engine the torch drafter runs between two verify passes, and spinning workers take its
      cores (embedded target, 2 cores, CAST N = 15: draft 2.1 s vs 0.9 s, 21 vs 31 tokens/s).
    """

    name = "onnxruntime"

    def __init__(self, model: LlamaTarget, tap_layer_ids: Sequence[int] = (), threads: int | None = None,
                 cache_dir: str | Path | None = None, spinning: bool = False, export: bool = True) -> None:
        threads = cpu_threads("OrtTarget", model.lm_head.weight, threads)
        self.model, self.config = model, model.config
        self.tap_layer_ids = model.config.tap_layers(tap_layer_ids)
        self.device, self.dtype = torch.device("cpu"), torch.float32
        path = verify_graph_path(model, self.tap_layer_ids, cache_dir, export)
        (self.session,) = cpu_sessions([path], threads, spinning, "verify graph")
        self._init_pool()
        self.pool_names = pool_input_names("past", model.config.num_layers)

    def _forward(self, inputs: dict[str, np.ndarray], lo: int, hi: int):
        """One graph run; the pool's slots [lo, hi) bound in place, outputs into fresh arrays
        (the engine may keep a round's logits)."""
        total, m, (layers, hkv, d) = len(inputs["input_ids"]), len(inputs["logit_rows"]), self.pool.shape
        outputs = {"logits": np.empty((m, self.config.vocab_size), dtype=np.float32),  # [m, V]
                   **{name: np.empty((total, layers, hkv, d), dtype=np.float32) for name in ("new_keys", "new_values")}}
        if self.tap_layer_ids:
            outputs["taps"] = np.empty((total, self.tap_width), dtype=np.float32)  # [T, F]
        run_bound(self.session, inputs, dict(zip(self.pool_names, self.pool.layer_views(lo, hi))), outputs)
        logits, keys, values, *taps = (torch.from_numpy(a) for a in outputs.values())
        return logits, keys, values, taps[0] if taps else None
