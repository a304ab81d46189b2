"""Export-once cache of a target's verify graph for the onnxruntime backend, and the
session plumbing both onnxruntime backends share (`cpu_threads`, `cpu_sessions`, `run_bound`).

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

import numpy as np
import torch

from runtime.model import batch_graph, graphs
from runtime.model.llama import LlamaTarget

GRAPH_FILE = "verify.onnx"
WEIGHT_SAMPLES = 4096  # values hashed per weight tensor


def cpu_threads(who: str, weight: torch.Tensor, threads: int | None) -> int:
    """The intra-op thread count (default: torch's) of an onnxruntime backend over `weight`'s
    model, which must be fp32 on the CPU (and onnxruntime installed: checked before any export)."""
    import onnxruntime  # noqa: F401

    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        raise ValueError(f"{who} runs an fp32 CPU target; this one is {weight.dtype} on {weight.device} "
                         "(load it with --dtype float32 --device cpu)")
    threads = torch.get_num_threads() if threads is None else threads
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    return threads


def cpu_sessions(paths: Sequence[Path], threads: int, spinning: bool, what: str) -> list:
    """One CPU InferenceSession per graph: `threads` intra-op, sequential, idle workers
    spin-waiting as asked (env SPIN overrides)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    spin = os.environ.get("SPIN", "1" if spinning else "0")
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    start = time.perf_counter()
    sessions = [ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"]) for p in paths]
    print(f"[ort] {what} loaded in {time.perf_counter() - start:.1f} s ({threads} thread(s))", file=sys.stderr,
          flush=True)
    return sessions


def run_bound(session, inputs: dict[str, np.ndarray], pool: dict[str, torch.Tensor],
              outputs: dict[str, np.ndarray]) -> None:
    """One run of `session`: host `inputs` copied in, the `pool` views (fp32 CPU) bound in place
    by address, fp32 `outputs` written into the given arrays."""
    binding = session.io_binding()
    for name, array in inputs.items():
        binding.bind_cpu_input(name, np.ascontiguousarray(array))
    for name, view in pool.items():
        binding.bind_input(name, "cpu", 0, np.float32, list(view.shape), view.data_ptr())
    for name, array in outputs.items():
        binding.bind_output(name, "cpu", 0, np.float32, list(array.shape), array.ctypes.data)
    session.run_with_iobinding(binding)


def hash_weights(digest, module: torch.nn.Module) -> None:
    """Feed a strided sample of every weight tensor (name, shape, dtype, values) to `digest`."""
    for name, tensor in module.state_dict().items():
        flat = tensor.detach().reshape(-1)
        digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
        digest.update(flat[:: max(1, flat.numel() // WEIGHT_SAMPLES)].float().cpu().numpy().tobytes())


def onnx_root(cache_dir: str | Path | None) -> Path:
    """The folder of exported graphs (default `cast_trtllm.cost_cache.cache_root()/onnx`)."""
    if cache_dir is None:
        from cast_trtllm.cost_cache import cache_root

        return cache_root() / "onnx"
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
