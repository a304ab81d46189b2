"""What every GPU check section shares: per-call timing (CUDA events) and random real trees."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import numpy as np
import torch

from cast_trtllm.tree import Tree, build_tree

DEPTH, RANK_CAP = 16, 8  # random trees: DFlash-b16 block, top-8 per position


def random_tree(rng: np.random.Generator, vocab: int, nodes: int) -> Tree:
    """Exact top-`nodes` tree of random peaked marginals (the shape a real round verifies)."""
    if nodes == 0:
        return Tree.empty()
    logits = rng.standard_normal((DEPTH, RANK_CAP + 1)) * 3.0
    logp = np.sort(logits - np.logaddexp.reduce(logits, axis=1, keepdims=True), axis=1)[:, ::-1][:, :RANK_CAP]
    ids = rng.integers(0, vocab, (DEPTH, RANK_CAP))  # sibling duplicates are harmless for timing
    return build_tree(ids, np.ascontiguousarray(logp), nodes)


def cuda_ms(fn: Callable[[], Any], device: torch.device) -> float:
    """Milliseconds of one call: CUDA events on a GPU, perf_counter on the CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def median_ms(fn: Callable[[], Any], device: torch.device, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    return round(statistics.median(cuda_ms(fn, device) for _ in range(iters)), 4)
