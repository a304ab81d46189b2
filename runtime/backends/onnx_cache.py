"""Export-once cache of a target's verify graph for the onnxruntime backend.

The graph is the runtime's `VerifyGraph` with token-major K/V (`kv_layout="token"`), a
dynamic bitmask word count (prefills are chains of any length) and a `logit_rows` input
(a prefill scores its last row only), and a tied lm_head stored as its own transposed
copy (faster on onnxruntime's CPU GEMM; see `graphs.lm_head`). It lands in

    $CAST_CACHE_DIR/onnx/<model identity>/verify.onnx   (default ~/.cache/cast-trtllm)

where the identity hashes the target's config, the tapped layers, the graph code
(`runtime/model/graphs.py`) and a strided sample of every weight tensor: another model,
another tap set or an edited graph exports anew; the same model is reused at once.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from runtime.model import graphs
from runtime.model.llama import LlamaTarget

GRAPH_FILE = "verify.onnx"
WEIGHT_SAMPLES = 4096  # values hashed per weight tensor


def model_identity(model: LlamaTarget, tap_layer_ids: Sequence[int]) -> str:
    """16 hex digits naming (config, taps, graph code, weights) without reading every byte."""
    digest = hashlib.sha256()
    digest.update(repr((model.config, tuple(tap_layer_ids))).encode())
    digest.update(inspect.getsource(graphs).encode())
    digest.update(model.rotary.inv_freq.cpu().numpy().tobytes() + repr(model.rotary.attention_scaling).encode())
    for name, tensor in model.state_dict().items():
        flat = tensor.detach().reshape(-1)
        step = max(1, flat.numel() // WEIGHT_SAMPLES)
        digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
        digest.update(flat[::step].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def verify_graph_path(model: LlamaTarget, tap_layer_ids: Sequence[int], cache_dir: str | Path | None = None) -> Path:
    """The exported verify graph of `model`, exporting it first if this identity has none.

    cache_dir: the folder holding one sub-folder per model identity
    (default `runtime.engine.autoconfig.cache_dir()/onnx`).
    """
    if cache_dir is None:
        from runtime.engine.autoconfig import cache_dir as runtime_cache  # lazy: the engine may import backends

        cache_dir = runtime_cache() / "onnx"
    root = Path(cache_dir)
    folder = root / model_identity(model, tap_layer_ids)
    path = folder / GRAPH_FILE
    if path.is_file():
        return path
    # export into a private folder, then rename: a concurrent exporter never sees half a file
    scratch = root / f".{folder.name}.{os.getpid()}.tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"[ort] exporting the verify graph ({model.config.num_layers} layers) to {folder} (first use)",
          file=sys.stderr, flush=True)
    start = time.perf_counter()
    graph = graphs.VerifyGraph(model, "onnx", tap_layer_ids, kv_layout="token", logit_rows=True,
                              shared_head=False)
    with torch.inference_mode(False):
        graphs.export_verify_graph(graph, scratch / GRAPH_FILE, mask_words=None)
    try:
        scratch.rename(folder)
    except OSError:  # another process finished first: its export is the same graph
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"[ort] exported in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return path
