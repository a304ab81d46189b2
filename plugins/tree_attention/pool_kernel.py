"""Triton kernels of the pool-layout tree-attention op (contract: `pool_reference.py`).

Reads K/V straight from one layer's `SlotPool` view [S, Hkv, C, d] by slot id and prefix
length; every launch parameter comes from tensor shapes, so a call is CUDA-graph capturable
(no host reads; the grid depends only on B, n, Hq, Hkv, d, C and the device's SM count).

Split kernel, grid (query tiles, splits, B * Hkv): one program per (request b, tile of query
rows, kv head, split of the prefix). The G = Hq / Hkv query heads of a kv head are packed into
the program's rows (row r = query r // G, head kv_head * G + r % G), so each K/V block is read
once for all G heads. Split s owns pool columns [s * chunk, (s + 1) * chunk) clipped to
[0, P_b) (chunk from the static C); a split with no columns exits at once. Split 0 also attends
the pack (ancestor bits read from the bitmask words), so every row has exactly one pack pass.
With one split the program normalises and writes the output; with more it writes its partial
(running max, sum, unnormalised output) to an fp32 workspace, and the combine kernel, grid
(B * n, head blocks), merges the splits that hold columns in split order (deterministic).

`import triton` is optional (as in `triton_kernel.py`): without it `pool_tree_attention` runs
the torch reference and `pool_tree_attention_triton` raises a RuntimeError.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from plugins.tree_attention.pool_reference import check_pool_inputs, pool_tree_attention_reference
from plugins.tree_attention.reference import resolve_scale
from plugins.tree_attention.triton_kernel import require_triton, triton, triton_available

MIN_SPLIT_COLUMNS = 256  # the default never gives a split fewer pool columns than this
MAX_SPLITS = 64
WAVES = 2  # the default aims for this many programs per SM

if triton is not None:
    import triton.language as tl

    from plugins.tree_attention.triton_kernel import attend_block

    @triton.jit
    def pool_split_kernel(
        Q, K_NEW, V_NEW, K_POOL, V_POOL, SLOT_IDS, PREFIX_LENS, BITMASK, OUT, M_WS, L_WS, ACC_WS,
        sm_scale, batch, num_queries, num_kv_heads, capacity, chunk,
        stride_qb, stride_qn, stride_qh, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
        stride_ps, stride_ph, stride_pc, stride_ws, stride_wh, stride_wc, stride_mb, stride_mn,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ):
        tile, split, req_head = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        b, kv_head = req_head // num_kv_heads, req_head % num_kv_heads
        prefix = tl.minimum(tl.maximum(tl.load(PREFIX_LENS + b).to(tl.int32), 0), capacity)
        lo = split * chunk
        if (split > 0) & (lo >= prefix):  # no committed columns here (split 0 still owns the pack)
            return
        hi = tl.minimum(lo + chunk, prefix)

        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # packed rows (query, head in group)
        query = offs_m // GROUP
        head = kv_head * GROUP + offs_m % GROUP
        offs_d = tl.arange(0, BLOCK_D)
        row_ok, d_ok = offs_m < num_queries * GROUP, offs_d < HEAD_DIM
        b64 = b.to(tl.int64)
        q = tl.load(Q + b64 * stride_qb + query[:, None] * stride_qn + head[:, None] * stride_qh + offs_d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
        qk_scale = sm_scale * 1.4426950408889634  # exp2-based softmax
        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # finite: a fully masked block keeps alpha = 1
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        # Committed prefix of the slot: columns [lo, hi), visible to every row.
        slot = tl.load(SLOT_IDS + b).to(tl.int64)
        k_slot = K_POOL + slot * stride_ps + kv_head * stride_ph
        v_slot = V_POOL + slot * stride_ws + kv_head * stride_wh
        for start in range(lo, hi, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            col_ok = offs_n < hi
            k = tl.load(k_slot + offs_n[None, :] * stride_pc + offs_d[:, None],
                        mask=col_ok[None, :] & d_ok[:, None], other=0.0)  # [BLOCK_D, BLOCK_N]
            v = tl.load(v_slot + offs_n[:, None] * stride_wc + offs_d[None, :],
                        mask=col_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
            m_i, l_i, acc = attend_block(q, k, v, col_ok[None, :], qk_scale, m_i, l_i, acc, DOT_PRECISION)

        # The pack (split 0 only): key j visible to query i iff bit j % 32 of word j // 32 of row i.
        pack_end = tl.where(split == 0, num_queries, 0)
        k_req = K_NEW + b64 * stride_kb + kv_head * stride_kh
        v_req = V_NEW + b64 * stride_vb + kv_head * stride_vh
        for start in range(0, pack_end, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            col_ok = offs_n < num_queries
            k = tl.load(k_req + offs_n[None, :] * stride_kn + offs_d[:, None],
                        mask=col_ok[None, :] & d_ok[:, None], other=0.0)
            v = tl.load(v_req + offs_n[:, None] * stride_vn + offs_d[None, :],
                        mask=col_ok[:, None] & d_ok[None, :], other=0.0)
            words = tl.load(BITMASK + b64 * stride_mb + query[:, None] * stride_mn + (offs_n // 32)[None, :],
                            mask=row_ok[:, None] & col_ok[None, :], other=0)  # [BLOCK_M, BLOCK_N] int32
            visible = ((words >> (offs_n % 32)[None, :]) & 1) != 0
            m_i, l_i, acc = attend_block(q, k, v, visible, qk_scale, m_i, l_i, acc, DOT_PRECISION)

        out_row = (b64 * num_queries + query) * (num_kv_heads * GROUP) + head  # row of [B, n, Hq]
        if SPLIT:
            ws_row = out_row + split * (batch * num_queries * num_kv_heads * GROUP)  # int64, as out_row
            tl.store(M_WS + ws_row, m_i, mask=row_ok)
            tl.store(L_WS + ws_row, l_i, mask=row_ok)
            tl.store(ACC_WS + ws_row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=row_ok[:, None] & d_ok[None, :])
        else:
            out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]  # a row that saw nothing outputs zeros
            tl.store(OUT + out_row[:, None] * HEAD_DIM + offs_d[None, :], out.to(OUT.dtype.element_ty),
                     mask=row_ok[:, None] & d_ok[None, :])

    @triton.jit
    def pool_combine_kernel(
        M_WS, L_WS, ACC_WS, PREFIX_LENS, OUT, batch, num_queries, num_q_heads, capacity, chunk, num_splits,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
    ):
        row = tl.program_id(0)  # b * n + i
        heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        h_ok, d_ok = heads < num_q_heads, offs_d < HEAD_DIM
        prefix = tl.minimum(tl.maximum(tl.load(PREFIX_LENS + row // num_queries).to(tl.int32), 0), capacity)
        used = tl.minimum(tl.maximum((prefix + chunk - 1) // chunk, 1), num_splits)  # splits that wrote
        m = tl.full([BLOCK_H], -1.0e30, dtype=tl.float32)
        l = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
        out_row = row.to(tl.int64) * num_q_heads + heads
        for s in range(0, used):
            ws_row = out_row + s * (batch * num_queries * num_q_heads)
            m_s = tl.load(M_WS + ws_row, mask=h_ok, other=-1.0e30)
            l_s = tl.load(L_WS + ws_row, mask=h_ok, other=0.0)
            acc_s = tl.load(ACC_WS + ws_row[:, None] * HEAD_DIM + offs_d[None, :],
                            mask=h_ok[:, None] & d_ok[None, :], other=0.0)
            m_new = tl.maximum(m, m_s)
            alpha, beta = tl.exp2(m - m_new), tl.exp2(m_s - m_new)
            l = l * alpha + l_s * beta
            acc = acc * alpha[:, None] + acc_s * beta[:, None]
            m = m_new
        out = acc / tl.where(l > 0.0, l, 1.0)[:, None]
        tl.store(OUT + out_row[:, None] * HEAD_DIM + offs_d[None, :], out.to(OUT.dtype.element_ty),
                 mask=h_ok[:, None] & d_ok[None, :])


@dataclass(frozen=True, slots=True)
class PoolLaunch:
    """Tile shapes and the prefix split of one launch: a pure function of shapes (`plan_pool_launch`)."""

    block_m: int  # packed (query, head-in-group) rows per program
    block_n: int  # key columns per step
    block_d: int  # head dim padded to a power of two >= 16
    num_warps: int
    num_stages: int
    num_tiles: int  # query tiles per (request, kv head)
    num_splits: int  # programs over the prefix per (request, tile, kv head)
    chunk: int  # pool columns per split, a multiple of block_n


def _pow2(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def device_sm_count(device: torch.device) -> int | None:
    """Streaming multiprocessors of a CUDA device (cached host property, no sync); None off CUDA."""
    if device.type != "cuda":
        return None
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def plan_pool_launch(batch: int, n: int, num_q_heads: int, num_kv_heads: int, head_dim: int, capacity: int,
                     dtype: torch.dtype, num_splits: int | None = None, sm_count: int | None = None) -> PoolLaunch:
    """Tiles: fp32 keeps BLOCK_M <= 64 and BLOCK_N = 32 (16 for d > 128) so two pipeline stages of
    K and V fit Hopper's shared memory; 16-bit takes BLOCK_M <= 128, BLOCK_N = 64. Default
    splits (sm_count given, i.e. CUDA): enough programs for WAVES per SM, at most C / 256 and
    MAX_SPLITS; without sm_count (CPU): 1. A split count above ceil(C / BLOCK_N) is cut to it."""
    rows = num_q_heads // num_kv_heads * n
    wide = dtype != torch.float32
    block_d = max(16, _pow2(head_dim))
    block_m = min(max(16, _pow2(rows)), 128 if wide else 64)
    block_n = 64 if wide else (32 if block_d <= 128 else 16)
    num_tiles = max(1, -(-rows // block_m))
    if num_splits is None:
        programs = batch * num_kv_heads * num_tiles
        want = 1 if sm_count is None else -(-WAVES * sm_count // max(programs, 1))
        num_splits = max(1, min(want, capacity // MIN_SPLIT_COLUMNS, MAX_SPLITS))
    columns = -(-capacity // num_splits)  # ceil(C / splits), then up to a multiple of block_n
    chunk = max(block_n, -(-columns // block_n) * block_n)
    return PoolLaunch(block_m, block_n, block_d, num_warps=8 if block_m * block_d >= 128 * 128 else 4,
                      num_stages=2, num_tiles=num_tiles, num_splits=max(1, -(-capacity // chunk)), chunk=chunk)


def interpreted() -> bool:
    """Whether triton was imported under TRITON_INTERPRET=1 (kernels then run on CPU tensors)."""
    return triton is not None and not isinstance(pool_split_kernel, triton.runtime.jit.JITFunction)


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


def pool_tree_attention_triton(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_pool: torch.Tensor,
                               v_pool: torch.Tensor, slot_ids: torch.Tensor, prefix_lens: torch.Tensor,
                               bitmask: torch.Tensor, scale: float | None = None, num_splits: int | None = None
                               ) -> torch.Tensor:  # [B, n, Hq, d], q's dtype
    """The op of `pool_tree_attention_reference` on the Triton kernels (CUDA tensors, or CPU ones
    under TRITON_INTERPRET=1). No host reads: slot_ids / prefix_lens are not value-checked
    (`check_pool_values` does that on the host); a prefix length is clipped to [0, C]."""
    require_triton()
    if not q.is_cuda and not interpreted():
        raise ValueError("the Triton backend needs CUDA tensors (or TRITON_INTERPRET=1 set before importing triton)")
    check_pool_inputs(q, k_new, v_new, k_pool, v_pool, slot_ids, prefix_lens, bitmask, num_splits)
    for name, pool in (("k_pool", k_pool), ("v_pool", v_pool)):
        if pool.stride(3) != 1 and pool.shape[3] > 1:
            raise ValueError(f"{name} needs a contiguous last (head) dim, got strides {pool.stride()}")
    batch, n, num_q_heads, head_dim = q.shape
    num_kv_heads, capacity = k_new.shape[2], k_pool.shape[2]
    if batch * num_kv_heads > 65535:
        raise ValueError(f"B * Hkv = {batch * num_kv_heads} exceeds the CUDA grid limit 65535 (grid axis 2)")
    out = torch.empty((batch, n, num_q_heads, head_dim), dtype=q.dtype, device=q.device)
    if batch == 0 or n == 0:
        return out
    plan = plan_pool_launch(batch, n, num_q_heads, num_kv_heads, head_dim, capacity, q.dtype, num_splits,
                            device_sm_count(q.device))
    q, k_new, v_new, bitmask = (_last_dim_contiguous(t) for t in (q, k_new, v_new, bitmask))
    slot_ids, prefix_lens = slot_ids.contiguous(), prefix_lens.contiguous()  # the kernel reads them at stride 1
    split = plan.num_splits > 1
    ws_shape = (plan.num_splits, batch, n, num_q_heads) if split else (1,)
    m_ws = torch.empty(ws_shape, dtype=torch.float32, device=q.device)
    l_ws = torch.empty(ws_shape, dtype=torch.float32, device=q.device)
    acc_ws = torch.empty((*ws_shape, head_dim) if split else (1,), dtype=torch.float32, device=q.device)
    grid = (plan.num_tiles, plan.num_splits, batch * num_kv_heads)
    pool_split_kernel[grid](
        q, k_new, v_new, k_pool, v_pool, slot_ids, prefix_lens, bitmask, out, m_ws, l_ws, acc_ws,
        resolve_scale(scale, head_dim), batch, n, num_kv_heads, capacity, plan.chunk,
        *q.stride()[:3], *k_new.stride()[:3], *v_new.stride()[:3], *k_pool.stride()[:3], *v_pool.stride()[:3],
        *bitmask.stride()[:2],
        GROUP=num_q_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_D=plan.block_d, BLOCK_M=plan.block_m,
        BLOCK_N=plan.block_n, SPLIT=split, DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=plan.num_warps, num_stages=plan.num_stages,
    )
    if split:
        block_h = min(_pow2(num_q_heads), max(1, 4096 // plan.block_d))
        pool_combine_kernel[(batch * n, -(-num_q_heads // block_h))](
            m_ws, l_ws, acc_ws, prefix_lens, out, batch, n, num_q_heads, capacity, plan.chunk, plan.num_splits,
            HEAD_DIM=head_dim, BLOCK_D=plan.block_d, BLOCK_H=block_h, num_warps=4,
        )
    return out


def pool_tree_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_pool: torch.Tensor,
                        v_pool: torch.Tensor, slot_ids: torch.Tensor, prefix_lens: torch.Tensor,
                        bitmask: torch.Tensor, scale: float | None = None, num_splits: int | None = None
                        ) -> torch.Tensor:  # [B, n, Hq, d], q's dtype
    """Pool-layout tree attention: the Triton kernels on CUDA (and on CPU when TRITON_INTERPRET=1
    was set before triton was imported), else the torch reference."""
    if triton_available() and (q.is_cuda or interpreted()):
        return pool_tree_attention_triton(q, k_new, v_new, k_pool, v_pool, slot_ids, prefix_lens, bitmask,
                                          scale, num_splits)
    return pool_tree_attention_reference(q, k_new, v_new, k_pool, v_pool, slot_ids, prefix_lens, bitmask,
                                         scale, num_splits)
