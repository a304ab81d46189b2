"""Timing of the pool-layout tree-attention kernel against the fast torch path over the same pool
(gathered prefix + additive mask through SDPA's memory-efficient backend): one helper for
perf/gpu_check. On CUDA it times with CUDA events (eager, and the kernel replayed from a CUDA
graph, which also proves the launch capturable); on the CPU it runs whatever shapes it is
given with a wall clock, so keep them tiny there."""
from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Callable

import torch
import torch.nn.functional as F

from plugins.tree_attention.pool_kernel import device_sm_count, interpreted, plan_pool_launch, pool_tree_attention
from plugins.tree_attention.reference import unpack_bitmask


def chain_bitmask(batch: int, n: int, device: torch.device | str) -> torch.Tensor:  # [B, n, ceil(n/32)] int32
    """Every pack a chain (query i sees pack keys 0..i), LSB-first words."""
    words = max(1, -(-n // 32))
    bits = torch.ones(n, words * 32, dtype=torch.int64).tril()  # [n, 32W]
    packed = (bits.view(n, words, 32) << torch.arange(32)).sum(-1)  # [n, W] in [0, 2^32)
    signed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return signed.expand(batch, n, words).contiguous().to(device)


def pool_inputs(batch: int, n: int, prefix: int, num_q_heads: int, num_kv_heads: int, head_dim: int,
                dtype: torch.dtype, device: torch.device | str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Arguments of `pool_tree_attention`: a pool of B + 2 slots (slots 0 and B + 1 idle; request
    b in slot B - b), C = prefix + n rounded up to 64, every committed prefix `prefix` long."""
    gen = torch.Generator().manual_seed(seed)
    capacity = -(-(prefix + n) // 64) * 64
    randn = lambda *shape: torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)  # noqa: E731
    return dict(
        q=randn(batch, n, num_q_heads, head_dim), k_new=randn(batch, n, num_kv_heads, head_dim),
        v_new=randn(batch, n, num_kv_heads, head_dim),
        k_pool=randn(batch + 2, num_kv_heads, capacity, head_dim),
        v_pool=randn(batch + 2, num_kv_heads, capacity, head_dim),
        slot_ids=torch.arange(batch, 0, -1, dtype=torch.int32, device=device),
        prefix_lens=torch.full((batch,), prefix, dtype=torch.int32, device=device),
        bitmask=chain_bitmask(batch, n, device),
    )


def sdpa_pool_attention(q, k_new, v_new, k_pool, v_pool, slot_ids, prefix_lens, bitmask) -> torch.Tensor:
    """The op as torch would run it: gather the slots, append the pack, repeat kv heads, build an
    additive mask from prefix_lens and the bitmask, SDPA (memory-efficient backend on CUDA)."""
    batch, n, num_q_heads, _ = q.shape
    group, capacity = num_q_heads // k_new.shape[2], k_pool.shape[2]
    slots = slot_ids.long()
    k = torch.cat([k_pool[slots], k_new.transpose(1, 2)], dim=2).repeat_interleave(group, dim=1)  # [B, Hq, C+n, d]
    v = torch.cat([v_pool[slots], v_new.transpose(1, 2)], dim=2).repeat_interleave(group, dim=1)
    prefix_visible = (torch.arange(capacity, device=q.device) < prefix_lens[:, None]).unsqueeze(1)
    visible = torch.cat([prefix_visible.expand(batch, n, capacity), unpack_bitmask(bitmask, n)], dim=2)
    mask = torch.zeros(visible.shape, dtype=q.dtype, device=q.device).masked_fill(~visible, float("-inf"))
    backend = torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION
    with torch.nn.attention.sdpa_kernel(backend) if q.is_cuda else nullcontext():
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask[:, None])
    return out.transpose(1, 2)  # [B, n, Hq, d]


def _time_ms(fn: Callable[[], object], warmup: int, iters: int, cuda: bool) -> float:
    for _ in range(warmup):
        fn()
    if not cuda:
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - start) * 1e3 / iters
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    begin.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / iters


def time_pool_attention(B: int, n: int, prefix: int, Hq: int, Hkv: int, d: int, dtype: torch.dtype = torch.bfloat16,
                        device: torch.device | str = "cuda", warmup: int = 10, iters: int = 50) -> dict:
    """ms per call of `pool_tree_attention` (eager; on CUDA also replayed from a CUDA graph) and of
    `sdpa_pool_attention`, the largest |difference| of their outputs, and the launch plan."""
    inputs = pool_inputs(B, n, prefix, Hq, Hkv, d, dtype, device)
    cuda = inputs["q"].is_cuda
    kernel = lambda: pool_tree_attention(**inputs)  # noqa: E731
    torch_path = lambda: sdpa_pool_attention(**inputs)  # noqa: E731
    capacity = inputs["k_pool"].shape[2]
    plan = plan_pool_launch(B, n, Hq, Hkv, d, capacity, dtype, sm_count=device_sm_count(inputs["q"].device))
    result = dict(B=B, n=n, prefix=prefix, Hq=Hq, Hkv=Hkv, d=d, C=capacity, dtype=str(dtype).removeprefix("torch."),
                  device=str(inputs["q"].device), backend="triton" if cuda or interpreted() else "reference",
                  num_splits=plan.num_splits, block_m=plan.block_m, block_n=plan.block_n,
                  max_abs_diff=float((kernel().float() - torch_path().float()).abs().max()),
                  kernel_ms=_time_ms(kernel, warmup, iters, cuda), sdpa_ms=_time_ms(torch_path, warmup, iters, cuda))
    if cuda:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            kernel()
        result["kernel_graph_ms"] = _time_ms(graph.replay, warmup, iters, cuda)
    result["speedup"] = result["sdpa_ms"] / result["kernel_ms"]
    return result
