"""GPU check sections 1-2: the Triton tree-attention kernel against the torch reference
(correctness over dtypes, ragged batches, GQA ratios, head dims) and against SDPA over a
dense additive mask (speed, one layer's attention at Qwen3-8B shapes)."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import numpy as np
import torch
from torch.nn import functional as F

from cast_trtllm.masks import additive_mask, batched_bitmask, bitmask, cu_seqlens
from plugins.tree_attention import tree_attention_reference, tree_attention_triton, triton_available
from runtime.engine.latency_probe import probe_tree
from runtime.model.llama import TargetConfig

TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}  # max |kernel - reference|


def median_ms(fn: Callable[[], Any], device: torch.device, warmup: int, iters: int) -> float:
    """Median ms of one kernel call: CUDA events on a GPU (sub-ms calls), perf_counter on the CPU."""
    def once() -> float:
        if device.type != "cuda":
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    for _ in range(warmup):
        fn()
    return round(statistics.median(once() for _ in range(iters)), 4)


def kernel_or_reference(device: torch.device) -> tuple[Callable, str]:
    """The Triton kernel where it can run (CUDA, or the CPU interpreter), else the reference."""
    if triton_available():
        import triton

        from plugins.tree_attention.triton_kernel import tree_attention_fwd_kernel

        if device.type == "cuda" or not isinstance(tree_attention_fwd_kernel, triton.runtime.jit.JITFunction):
            return tree_attention_triton, "triton"
    return tree_attention_reference, "reference"


def check_correctness(device: torch.device, dry_run: bool, seed: int) -> dict[str, Any]:
    kernel, name = kernel_or_reference(device)
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    dtypes = (torch.float32,) if dry_run else (torch.float32, torch.bfloat16, torch.float16)
    cases = [((5, 3), (9, 0), 4, 1, 16)] if dry_run else [  # (packs, prefixes, Hq, Hkv, d)
        ((1,), (40,), 8, 8, 128), ((16, 65, 130), (100, 0, 37), 32, 8, 128),
        ((256,), (1024,), 32, 8, 128), ((7, 48, 33), (5, 300, 64), 24, 3, 64)]
    rows = []
    for dtype in dtypes:
        for packs, prefixes, hq, hkv, d in cases:
            trees = [probe_tree(n, "tree", rng, 1000) for n in packs]
            total, prefix_total = sum(packs), sum(prefixes)
            randn = lambda *s: torch.randn(*s, generator=gen).to(device=device, dtype=dtype)  # noqa: E731
            args = (randn(total, hq, d), randn(prefix_total, hkv, d), randn(prefix_total, hkv, d),
                    randn(total, hkv, d), randn(total, hkv, d),
                    torch.from_numpy(batched_bitmask(trees, num_words=max(packs) // 32 + 1)).to(device),
                    torch.from_numpy(cu_seqlens(trees)).to(device),
                    torch.tensor(np.cumsum([0, *prefixes]), dtype=torch.int32, device=device))
            err = (kernel(*args).float() - tree_attention_reference(*args).float()).abs().max().item()
            rows.append({"dtype": str(dtype).removeprefix("torch."), "packs": list(packs), "prefixes": list(prefixes),
                         "q_heads": hq, "kv_heads": hkv, "head_dim": d, "max_abs_err": err,
                         "tolerance": TOLERANCE[dtype], "ok": err <= TOLERANCE[dtype]})
    return {"kernel": name, "ok": all(r["ok"] for r in rows), "cases": rows}


def time_kernel(device: torch.device, cfg: TargetConfig, dtype: torch.dtype, ns, prefixes, warmup, iters, seed):
    """One request, one layer's attention: Triton kernel vs SDPA over a dense additive mask."""
    kernel, name = kernel_or_reference(device)
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    rows = []
    for p in prefixes:
        for n in ns:
            tree = probe_tree(n, "tree", rng, 1000)
            randn = lambda *s: torch.randn(*s, generator=gen).to(device=device, dtype=dtype)  # noqa: E731
            q, k, v = randn(n, hq, d), randn(p + n, hkv, d), randn(p + n, hkv, d)
            words = torch.from_numpy(bitmask(tree)).to(device)
            cu, cu_p = (torch.tensor([0, x], dtype=torch.int32, device=device) for x in (n, p))
            mask = additive_mask(tree, p, dtype=dtype, device=device)  # [1, 1, n, P+n], built untimed
            qh, kh, vh = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
            run_kernel = lambda: kernel(q, k[:p], v[:p], k[p:], v[p:], words, cu, cu_p)  # noqa: E731
            run_sdpa = lambda: F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=True)  # noqa: E731
            tk, ts = median_ms(run_kernel, device, warmup, iters), median_ms(run_sdpa, device, warmup, iters)
            rows.append({"n": n, "prefix": p, "kernel_ms": tk, "sdpa_ms": ts, "sdpa_over_kernel": round(ts / tk, 3)})
    return {"kernel": name, "dtype": str(dtype).removeprefix("torch."),
            "shape": {"q_heads": hq, "kv_heads": hkv, "head_dim": d}, "rows": rows}
