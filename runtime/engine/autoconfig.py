"""Fast by default: measure, once per machine and model, which execution configuration
(backend × dtype × CPU threads) runs the target fastest, and cache the answer.

What is fastest depends on the machine that runs it (CPU vendor and ISA — bf16 is fast
with AVX512-BF16/AMX and slow without —, cores, threads), so nothing here is assumed: a
first-use probe times the target's verify pass at packed counts 1 (an AR step) and 16
(a CAST@15 round) for every candidate — torch fp32 / bf16 and onnxruntime fp32 (the
exported verify graph, `runtime.backends.ort_target`) where it is installed, each at 1
thread and at every core — and keeps the one with the smallest sum. The
answer is cached under `cache_dir()` keyed by device name, torch version and target, so
later runs start at once. fp32 stays available (`--dtype float32`) as the exactness
reference: greedy bf16 output may differ from fp32 at near-ties.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from runtime.engine.latency_probe import verify_medians

PROBE_WIDTHS = (1, 16)  # packed counts: an AR step, a CAST@15 round
PROBE_PREFIX = 128
PROBE_REPEATS = 5


@dataclass(frozen=True, slots=True)
class ExecChoice:
    backend: str  # "torch" | "onnxruntime"
    dtype: str  # "float32" | "bfloat16"
    threads: int
    measured_ms: dict[str, dict[str, float]]  # "dtype/threads" -> {"n=1": ms, "n=16": ms}
    device: str  # device name it was measured on
    key: str

    def describe(self) -> str:
        cells = ", ".join(f"{k}: " + " / ".join(f"{v:.1f}" for v in ms.values()) for k, ms in self.measured_ms.items())
        return (f"{self.backend} {self.dtype}, {self.threads} thread(s) — fastest measured on {self.device} "
                f"(verify ms at n={'/'.join(map(str, PROBE_WIDTHS))}: {cells})")


def cache_dir() -> Path:
    from cast_trtllm.cost_cache import cache_root

    return cache_root()


def cache_key(device_name: str, target_name: str) -> str:
    raw = json.dumps([2, device_name, torch.__version__, target_name, os.cpu_count(), _ort_version()])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def cached_choice(key: str) -> ExecChoice | None:
    path = cache_dir() / "exec" / f"{key}.json"
    try:
        raw = json.loads(path.read_text())
        return ExecChoice(**raw) if raw.get("key") == key else None
    except (OSError, ValueError, TypeError):
        return None  # no cache, or one from another version: measure again


def save_choice(choice: ExecChoice) -> Path:
    path = cache_dir() / "exec" / f"{choice.key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(choice), indent=2) + "\n")
    return path


def _ort_version() -> str | None:
    try:
        import onnxruntime
    except ImportError:
        return None
    return onnxruntime.__version__


def candidates(device: torch.device) -> list[tuple[str, str, int]]:
    """(backend, dtype, threads) worth timing on this device."""
    if device.type != "cpu":
        return [("torch", "bfloat16", torch.get_num_threads())]
    cores = os.cpu_count() or 1
    threads = sorted({1, cores})
    out = [("torch", d, t) for d in ("float32", "bfloat16") for t in threads]
    return out + ([("onnxruntime", "float32", t) for t in threads] if _ort_version() else [])


def make_backend(name: str, model: Any, tap_layer_ids: tuple[int, ...], threads: int,
                 graphs: Path | None = None) -> Any:
    """The target backend `name` over `model` (runtime.engine.backend contract); `graphs`:
    a built engine's onnxruntime folder to run from (read only) instead of the export cache."""
    from runtime.engine.backend import TorchTarget

    if name == "runner" or (name == "torch" and model.lm_head.weight.is_cuda):  # a GPU runs the model runner
        from runtime.engine.runner_target import RunnerTarget

        return RunnerTarget(model, tap_layer_ids)
    if name == "onnxruntime":
        from runtime.backends.ort_target import OrtTarget

        return OrtTarget(model, tap_layer_ids, threads=threads, cache_dir=graphs, export=graphs is None)
    return TorchTarget(model, tap_layer_ids)


def make_drafter(name: str, drafter: Any, model: Any, threads: int, graphs: Path | None = None) -> Any:
    """The drafter executor that goes with target backend `name` (same interface)."""
    if name == "runner" or (name == "torch" and model.lm_head.weight.is_cuda):  # a GPU runs the draft runner
        from runtime.engine.draft_runner import DraftRunner

        return DraftRunner(drafter, model)
    if name == "onnxruntime":
        from runtime.backends.ort_drafter import OrtDrafter

        return OrtDrafter(drafter, model, threads=threads, cache_dir=graphs, export=graphs is None)
    from runtime.drafter.executor import DrafterExecutor

    return DrafterExecutor(drafter, model)


def measure(model: Any, device: torch.device, device_name: str, key: str, tap_layer_ids: tuple[int, ...] = (),
            progress: Callable[[str], None] = lambda _: None) -> ExecChoice:
    """Time every candidate on `model` and pick the fastest. Another dtype is timed on a
    converted COPY: the model itself is never rounded (a bf16 round trip would change it)."""
    before_threads, original = torch.get_num_threads(), model.lm_head.weight.dtype
    results: dict[str, dict[str, float]] = {}
    copies: dict[torch.dtype, Any] = {original: model}
    try:
        for backend, dtype, threads in candidates(device):
            progress(f"timing {backend} {dtype} with {threads} thread(s)")
            torch.set_num_threads(threads)
            wanted = getattr(torch, dtype)
            if wanted not in copies:
                copies[wanted] = copy.deepcopy(model).to(wanted)
            try:
                timed = make_backend(backend, copies[wanted], tap_layer_ids, threads)  # B = 1, chain packs
                medians = verify_medians(timed, PROBE_WIDTHS, PROBE_PREFIX, iters=PROBE_REPEATS, shape="chain")
                results[f"{backend}/{dtype}/{threads}"] = {f"n={n}": ms for n, ms in medians.items()}
            except (ImportError, RuntimeError, ValueError, OSError) as err:  # a backend that cannot run here
                progress(f"{backend} {dtype} skipped: {err}")
    finally:
        torch.set_num_threads(before_threads)
    best = min(results, key=lambda k: sum(results[k].values()))
    backend, dtype, threads = best.split("/")
    return ExecChoice(backend, dtype, int(threads), results, device_name, key)
