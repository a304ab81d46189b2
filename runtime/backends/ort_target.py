"""The target on onnxruntime (CPU, fp32): the `TargetBackend` contract over the exported
batched verify graph (`runtime.model.batch_graph`), K/V kept in place in one slot pool.

    OrtTarget(models.target, drafter.tap_layer_ids, threads=2)   # exported on first use

The round and the cache are `runtime.backends.pooled_target.PooledTarget`'s (one slot pool,
one pass per round over every request); here one pass is one graph run that binds the
pool's per-layer arrays over the batch's slot range as inputs, in place (no copy of any
prefix), and its outputs into fresh arrays.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from runtime.backends.onnx_cache import session_options, verify_graph_path
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
        import onnxruntime as ort

        weight = model.lm_head.weight
        if weight.dtype != torch.float32 or weight.device.type != "cpu":
            raise ValueError(f"OrtTarget runs an fp32 CPU target; this one is {weight.dtype} on {weight.device} "
                             "(load it with --dtype float32 --device cpu)")
        cfg = model.config
        tap_layer_ids = cfg.tap_layers(tap_layer_ids)
        threads = torch.get_num_threads() if threads is None else threads
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.model, self.config = model, cfg
        self.tap_layer_ids = tap_layer_ids
        self.device, self.dtype, self.threads = torch.device("cpu"), torch.float32, threads
        path = verify_graph_path(model, self.tap_layer_ids, cache_dir, export)
        options = session_options(threads, spinning)
        start = time.perf_counter()
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        print(f"[ort] verify graph loaded in {time.perf_counter() - start:.1f} s ({threads} thread(s))",
              file=sys.stderr, flush=True)
        self._init_pool()
        self.pool_names = pool_input_names("past", cfg.num_layers)

    def _forward(self, inputs: dict[str, np.ndarray], lo: int, hi: int):
        """One graph run; the pool's slots [lo, hi) bound in place, outputs into fresh arrays
        (the engine may keep a round's logits)."""
        total, m, (layers, hkv, d) = len(inputs["input_ids"]), len(inputs["logit_rows"]), self.pool.shape
        logits = np.empty((m, self.config.vocab_size), dtype=np.float32)  # [m, V]
        keys, values = (np.empty((total, layers, hkv, d), dtype=np.float32) for _ in range(2))
        taps = np.empty((total, self.tap_width), dtype=np.float32) if self.tap_layer_ids else None  # [T, F]
        binding = self.session.io_binding()
        for name, array in inputs.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name, view in zip(self.pool_names, self.pool.layer_views(lo, hi)):  # bound in place
            binding.bind_input(name, "cpu", 0, np.float32, list(view.shape), view.data_ptr())
        outputs = (("logits", logits), ("new_keys", keys), ("new_values", values)) + (
            (("taps", taps),) if taps is not None else ())
        for name, array in outputs:
            binding.bind_output(name, "cpu", 0, np.float32, list(array.shape), array.ctypes.data)
        self.session.run_with_iobinding(binding)
        return tuple(None if a is None else torch.from_numpy(a) for a in (logits, keys, values, taps))
