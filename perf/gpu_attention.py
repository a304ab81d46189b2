"""The GPU check's attention sections: kernel correctness, and an A/B at engine shapes.

  correctness  the Triton tree-attention kernel vs the torch reference: every dtype (bf16
               first), ragged batches of real trees, GQA ratios 1/4/8, head dims 64/128;
               each dtype in its own `try`, so one dtype's failure keeps the others' rows.
  attention    one layer's attention of a verify pass at engine shapes (B requests of n
               packed tokens over a P-token prefix, Qwen3-8B heads, bf16): the Triton kernel,
               the engine's eager `slot_attention` and SDPA (efficient backend on CUDA, a
               dense additive mask built untimed); CUDA events, warm-ups, medians.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import numpy as np
import torch
from torch.nn import functional as F

from cast_trtllm.masks import additive_mask, batched_bitmask, cu_seqlens
from plugins.tree_attention import tree_attention_reference, tree_attention_triton, triton_available
from runtime.engine.latency_probe import probe_tree
from runtime.model.graphs import slot_attention

TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}  # max |kernel - reference|


def median_ms(fn: Callable[[], Any], device: torch.device, warmup: int, iters: int) -> float:
    """Median ms of one call: CUDA events on a GPU (sub-ms calls), perf_counter on the CPU."""
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
    dtypes = (torch.float32,) if dry_run else (torch.bfloat16,)  # fp16 / fp32: passed on the H200 baseline run
    cases = [((5, 3), (9, 0), 4, 1, 16)] if dry_run else [  # (packs, prefixes, Hq, Hkv, d)
        ((1,), (40,), 8, 8, 128), ((16, 65, 130), (100, 0, 37), 32, 8, 128),
        ((256,), (1024,), 32, 8, 128), ((7, 48, 33), (5, 300, 64), 24, 3, 64)]
    rows = []
    for dtype in dtypes:
        for packs, prefixes, hq, hkv, d in cases:
            row = {"dtype": str(dtype).removeprefix("torch."), "packs": list(packs), "prefixes": list(prefixes),
                   "q_heads": hq, "kv_heads": hkv, "head_dim": d, "tolerance": TOLERANCE[dtype]}
            try:
                trees = [probe_tree(n, "tree", rng, 1000) for n in packs]
                total, prefix_total = sum(packs), sum(prefixes)
                randn = lambda *s: torch.randn(*s, generator=gen).to(device=device, dtype=dtype)  # noqa: E731
                args = (randn(total, hq, d), randn(prefix_total, hkv, d), randn(prefix_total, hkv, d),
                        randn(total, hkv, d), randn(total, hkv, d),
                        torch.from_numpy(batched_bitmask(trees, num_words=max(packs) // 32 + 1)).to(device),
                        torch.from_numpy(cu_seqlens(trees)).to(device),
                        torch.tensor(np.cumsum([0, *prefixes]), dtype=torch.int32, device=device))
                err = (kernel(*args).float() - tree_attention_reference(*args).float()).abs().max().item()
                row.update(max_abs_err=err, ok=err <= TOLERANCE[dtype])
            except Exception as exc:  # this case's failure is a row, not the section's end
                row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:400])
            rows.append(row)
    rows += pool_correctness(device, (torch.float32,) if dry_run else (torch.bfloat16, torch.float32), dry_run, seed)
    return {"kernel": name, "ok": all(r["ok"] for r in rows), "cases": rows}


def pool_correctness(device: torch.device, dtypes, dry_run: bool, seed: int) -> list[dict[str, Any]]:
    """The engine's kernel (`pool_tree_attention`, pool layout, split prefixes) vs its reference."""
    from plugins.tree_attention import pool_tree_attention, pool_tree_attention_reference

    gen = torch.Generator().manual_seed(seed)
    cases = [(3, 4, 4, 2, 16, 40, 1)] if dry_run else [  # (B, n, Hq, Hkv, d, C, splits)
        (1, 1, 32, 8, 128, 8192, None), (4, 16, 32, 8, 128, 1100, None), (32, 64, 32, 8, 128, 1100, 4)]
    rows = []
    for dtype in dtypes:
        for B, n, hq, hkv, d, C, splits in cases:
            row = {"kernel": "pool", "dtype": str(dtype).removeprefix("torch."), "batch": B, "n": n, "capacity": C,
                   "q_heads": hq, "kv_heads": hkv, "head_dim": d, "tolerance": TOLERANCE[dtype]}
            try:
                randn = lambda *s: torch.randn(*s, generator=gen).to(device=device, dtype=dtype)  # noqa: E731
                slots = torch.randperm(B + 2, generator=gen)[:B].to(device)
                lengths = torch.randint(0, C, (B,), generator=gen).to(device)
                visible = torch.ones(B, n, n, dtype=torch.bool).tril()
                from runtime.model.pool_forward import visible_bitmask
                args = (randn(B, n, hq, d), randn(B, n, hkv, d), randn(B, n, hkv, d), randn(B + 2, hkv, C, d),
                        randn(B + 2, hkv, C, d), slots, lengths, visible_bitmask(visible).to(device))
                got = pool_tree_attention(*args, num_splits=splits).float()
                err = (got - pool_tree_attention_reference(*args).float()).abs().max().item()
                row.update(max_abs_err=err, ok=err <= TOLERANCE[dtype])
            except Exception as exc:
                row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[:400])
            rows.append(row)
    return rows


def attention_ab(device: torch.device, heads: tuple[int, int, int], dtype: torch.dtype, cells, warmup: int,
                 iters: int, seed: int) -> dict[str, Any]:
    """cells: (B, n, P). One layer's verify attention per implementation (module docstring)."""
    kernel, name = kernel_or_reference(device)
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    hq, hkv, d = heads
    group, scale = hq // hkv, d ** -0.5
    rows = []
    for B, n, p in cells:
        row: dict[str, Any] = {"batch": B, "n": n, "prefix": p}
        try:
            randn = lambda *s: torch.randn(*s, generator=gen).to(device=device, dtype=dtype)  # noqa: E731
            trees = [probe_tree(n, "tree", rng, 1000) for _ in range(B)]
            q, kn, vn = randn(B * n, hq, d), randn(B * n, hkv, d), randn(B * n, hkv, d)
            kp, vp = randn(B, hkv, p, d), randn(B, hkv, p, d)  # a pool of B slots at prefix P
            words = torch.from_numpy(batched_bitmask(trees, num_words=n // 32 + 1)).to(device)
            cu = torch.from_numpy(cu_seqlens(trees)).to(device)
            cu_p = torch.arange(0, B * p + 1, p, dtype=torch.int32, device=device)
            flat_k, flat_v = kp.transpose(1, 2).reshape(B * p, hkv, d), vp.transpose(1, 2).reshape(B * p, hkv, d)
            mask = torch.stack([additive_mask(t, p, dtype=dtype, device=device)[0] for t in trees])  # [B,1,n,P+n]
            pack_mask = mask[:, :, :, p:].repeat(1, 1, group, 1)
            qs = (q * scale).view(B, n, hq, d).transpose(1, 2)
            k_new, v_new = kn.view(B, n, hkv, d).transpose(1, 2), vn.view(B, n, hkv, d).transpose(1, 2)
            k_all, v_all = torch.cat([kp, k_new], 2), torch.cat([vp, v_new], 2)
            qh = q.view(B, n, hq, d).transpose(1, 2)
            from plugins.tree_attention import pool_tree_attention
            pool_args = (q.view(B, n, hq, d), kn.view(B, n, hkv, d), vn.view(B, n, hkv, d), kp, vp,
                         torch.arange(B, device=device), torch.full((B,), p, device=device),
                         words.view(B, n, -1))
            impls = {
                "pool_kernel": lambda: pool_tree_attention(*pool_args),
                name: lambda: kernel(q, flat_k, flat_v, kn, vn, words, cu, cu_p),
                "slot_attention": lambda: slot_attention(qs, k_new, v_new, kp, vp, None, pack_mask, hkv, group),
                "sdpa": lambda: F.scaled_dot_product_attention(qh, k_all, v_all, attn_mask=mask, enable_gqa=True),
            }
            for impl, fn in impls.items():
                row[f"{impl}_ms"] = median_ms(fn, device, warmup, iters)
        except Exception as exc:  # one cell's failure (e.g. out of shared memory) is a row
            row["error"] = f"{type(exc).__name__}: {exc}"[:400]
        rows.append(row)
    return {"kernel": name, "dtype": str(dtype).removeprefix("torch."),
            "shape": {"q_heads": hq, "kv_heads": hkv, "head_dim": d}, "rows": rows}
