"""The GPU check's round-cost sections: what one steady round launches and drains, and l(n).

  launches  one steady CAST@15 round of the engine (a warm batch of B requests with the
            calibrated oracle drafter) under `torch.profiler`: kernel launches (CUDA
            kernels, graph launches) and stream drains (synchronize calls, blocking copies)
            per round, plus the synchronizing ops `torch.cuda.set_sync_debug_mode` reports.
            On a CPU (the dry run) it counts the aten ops a round dispatches.
  latency   verify latency l(n) of B requests at prefix P through each target backend the
            engine can run (eager today; a captured one where it exists), paper Table 5
            protocol: warm-ups, timed iterations, random trees, medians.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

import numpy as np
import torch

from runtime.engine import Request
from runtime.engine.latency_probe import LatencyProbe, random_prompt
from perf.gpu_round_loop import OracleDrafter, continuations, engine_for

LAUNCH_NAMES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch")
DRAIN_NAMES = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def count_events(fn: Callable[[], Any], cuda: bool) -> dict[str, int]:
    """Kernel launches, stream drains and dispatched aten ops of one call of `fn`."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    return {"kernel_launches": sum(n in LAUNCH_NAMES for n in names),
            "graph_launches": sum(n == "cudaGraphLaunch" for n in names),
            "stream_drains": sum(n in DRAIN_NAMES or n.startswith("cudaStreamSynchronize") for n in names),
            "aten_ops": sum(n.startswith("aten::") for n in names)}


def count_sync_warnings(fn: Callable[[], Any]) -> int:
    """Synchronizing ops one call of `fn` makes, as `torch.cuda.set_sync_debug_mode('warn')` reports them."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message).lower() for w in caught)


def launches(target, cfg, device: torch.device, batches: Sequence[int], prompt_len: int, block_positions: int,
             backends: dict[str, Any], warm_rounds: int = 3) -> dict[str, Any]:
    """Per backend (name -> a target backend, reused by each engine), batch and method (AR, CAST@15)."""
    cuda = device.type == "cuda"
    rows = []
    for batch in batches:
        tokens = (warm_rounds + 3) * (block_positions + 1)  # enough for the warm rounds and the counted ones
        ids, ar = continuations(target, cfg, batch, prompt_len, tokens)
        conts = [p + r.token_ids for p, r in zip(ids, ar)]
        for name, backend in backends.items():
            for method, budget in (("ar", None), ("cast", 15)):
                row: dict[str, Any] = {"backend": name, "batch": batch,
                                       "method": f"{method}:{budget}" if budget else method}
                try:
                    drafter = OracleDrafter(conts, cfg.vocab_size, block_positions, 0.2, device)
                    engine = engine_for(backend, drafter, method, budget, block_positions)
                    for p in ids:
                        engine.add_request(Request(p, tokens, method=method, budget=budget, ignore_eos=True))
                    for _ in range(warm_rounds):  # prefill, first draft, warm caches, capture buckets
                        engine.step()
                    reads = engine.host_reads.count
                    row.update(count_events(engine.step, cuda))
                    row["host_reads"] = engine.host_reads.count - reads
                    if cuda:
                        row["sync_warnings"] = count_sync_warnings(engine.step)
                    for seq in list(engine.active):
                        engine.abort(seq)
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {exc}"[:400]
                rows.append(row)
    return {"rows": rows, "what": "per steady round (one engine.step over the whole batch)"}


def latency(backends: dict[str, Any], batches: Sequence[int], packed: Sequence[int], prefix: int, warmup: int,
            iters: int, seed: int) -> dict[str, Any]:
    """{backend: {B: {n: median ms}}} of one verify pass (module docstring)."""
    table: dict[str, Any] = {}
    for name, backend in backends.items():
        table[name] = {}
        for batch in batches:
            try:
                prompt = random_prompt(backend.config.vocab_size, prefix, seed)
                with LatencyProbe(backend, prompt, batch=batch, max_packed=max(packed), seed=seed) as probe:
                    samples = probe.verify_curve(packed, warmup=warmup, iters=iters, shape="tree")
                table[name][str(batch)] = {str(n): round(float(np.median(v)), 4) for n, v in samples.items()}
            except Exception as exc:
                table[name][str(batch)] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
    return {"prefix": prefix, "packed_counts": list(packed), "batches": list(batches), "latency_ms": table}
