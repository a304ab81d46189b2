"""Export-once cache of a target's verify graph for the onnxruntime backend.

The graph is `runtime.model.batch_graph.BatchVerifyGraph`: one pass over every live
request's pack or prompt, K/V read in place from the backend's slot pool, a tied lm_head
stored as its own transposed copy (faster on onnxruntime's CPU GEMM; see
`graphs.lm_head`). It lands in

    $CAST_CACHE_DIR/onnx/<model identity>/verify.onnx   (default ~/.cache/cast-trtllm)

where the identity hashes the target's config, the tapped layers, the graph code
(`runtime/model/graphs.py`, `runtime/model/batch_graph.py`) and a strided sample of every weight tensor: another model,
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
from typing import Callable, Sequence

import torch

from runtime.model import batch_graph, graphs
from runtime.model.llama import LlamaTarget

GRAPH_FILE = "verify.onnx"
WEIGHT_SAMPLES = 4096  # values hashed per weight tensor


def session_options(threads: int, spinning: bool):
    """CPU session options both backends use: `threads` intra-op, sequential, spinning as asked."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.intra_op.allow_spinning", os.environ.get("SPIN", "1" if spinning else "0"))
    return options


def hash_weights(digest, module: torch.nn.Module) -> None:
    """Feed a strided sample of every weight tensor (name, shape, dtype, values) to `digest`."""
    for name, tensor in module.state_dict().items():
        flat = tensor.detach().reshape(-1)
        digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
        digest.update(flat[:: max(1, flat.numel() // WEIGHT_SAMPLES)].float().cpu().numpy().tobytes())


def onnx_root(cache_dir: str | Path | None) -> Path:
    """The folder of exported graphs (default `runtime.engine.autoconfig.cache_dir()/onnx`)."""
    if cache_dir is None:
        from runtime.engine.autoconfig import cache_dir as runtime_cache  # lazy: the engine may import backends

        return runtime_cache() / "onnx"
    return Path(cache_dir)


class MissingGraphs(ValueError):
    """A built engine directory has no graphs for the loaded checkpoint."""


def export_once(folder: Path, files: Sequence[str], what: str, write: Callable[[Path], None],
                export: bool = True) -> tuple[Path, ...]:
    """`folder/files`, written by `write(scratch_folder)` on first use (`export=False`: an
    engine directory, which is only read: raise `MissingGraphs` instead).

    The export goes to a private folder that is then renamed, so a concurrent exporter
    never sees half a file (if another process finished first, its export is the same)."""
    paths = tuple(folder / f for f in files)
    if all(p.is_file() for p in paths):
        return paths
    if not export:
        have = sorted(p.name for p in folder.parent.iterdir() if p.is_dir()) if folder.parent.is_dir() else []
        raise MissingGraphs(
            f"{folder.parent} does not hold {what} for the loaded checkpoint (identity {folder.name}; it holds "
            f"{have or 'nothing'}): it was built from other weights, another drafter or another graph version. "
            f"Rebuild it with `cast-trtllm build --sku cpu --target ... --drafter ... --out {folder.parent.parent}`, "
            f"or run without --engine")
    scratch = folder.parent / f".{folder.name}.{os.getpid()}.tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"[ort] exporting {what} to {folder} (first use)", file=sys.stderr, flush=True)
    start = time.perf_counter()
    with torch.inference_mode(False):
        write(scratch)
    try:
        scratch.rename(folder)
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"[ort] exported in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return paths


def model_identity(model: LlamaTarget, tap_layer_ids: Sequence[int]) -> str:
    """16 hex digits naming (config, taps, graph code, weights) without reading every byte."""
    digest = hashlib.sha256()
    digest.update(repr((model.config, tuple(tap_layer_ids))).encode())
    digest.update(inspect.getsource(graphs).encode() + inspect.getsource(batch_graph).encode())
    digest.update(model.rotary.inv_freq.cpu().numpy().tobytes() + repr(model.rotary.attention_scaling).encode())
    hash_weights(digest, model)
    return digest.hexdigest()[:16]


def verify_graph_path(model: LlamaTarget, tap_layer_ids: Sequence[int], cache_dir: str | Path | None = None,
                      export: bool = True) -> Path:
    """The exported verify graph of `model`, exporting it first if this identity has none
    (`export=False`: a built engine's folder, read only)."""
    folder = onnx_root(cache_dir) / model_identity(model, tap_layer_ids)

    def write(scratch: Path) -> None:
        batch_graph.export_batch_verify_graph(batch_graph.BatchVerifyGraph(model, tap_layer_ids), scratch / GRAPH_FILE)

    return export_once(folder, (GRAPH_FILE,), f"the verify graph ({model.config.num_layers} layers)", write,
                       export)[0]
