"""Triton forward kernel of the tree-attention op (contract in `reference.py`).

Grid: (num_query_tiles, Hq). Query tiles never cross requests: request r owns
ceil(n_r / BLOCK_M) consecutive tiles, and each program finds its (request, tile) by a
scan over cu_seqlens, so the grid needs only the host-known bound
cdiv(T, BLOCK_M) + B (no host sync, and expressible from shapes inside TensorRT).
Each program streams the request's prefix K/V (no mask) and then its pack K/V (mask
bits read straight from the bitmask words, no dense n x (P+n) tensor), with an online
softmax in fp32.

Argument order is the TensorRT AOT calling convention: input pointers (in plugin input
order), then runtime int scalars, then the output pointer; everything after OUT is
folded into the binary by `aot.py` (softmax scale and the strides of contiguous inputs).

`import triton` is optional: without it this module still imports and
`tree_attention_triton` raises a RuntimeError saying what is missing.
"""
from __future__ import annotations

import torch

from plugins.tree_attention.kernel_spec import KernelSpec
from plugins.tree_attention.reference import check_inputs

try:
    import triton
    import triton.language as tl
except ImportError as exc:  # triton is optional on CPU-only machines
    triton = None
    _TRITON_IMPORT_ERROR: ImportError | None = exc
else:
    _TRITON_IMPORT_ERROR = None

def triton_available() -> bool:
    return _TRITON_IMPORT_ERROR is None


def require_triton() -> None:
    if _TRITON_IMPORT_ERROR is not None:
        raise RuntimeError(
            "the Triton tree-attention backend needs the `triton` package "
            f"(pip install 'triton>=3.2'); import failed with: {_TRITON_IMPORT_ERROR}"
        )


if triton is not None:

    @triton.jit
    def attend_block(q, k, v, visible, qk_scale, m_i, l_i, acc, DOT_PRECISION: tl.constexpr):
        """One key block of the online softmax (exp2-based): scores of the visible keys, then
        the running max m_i, normalizer l_i and output acc, all rescaled to the new max."""
        s = tl.where(visible, tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        return m_new, l_i, acc

    @triton.jit
    def tree_attention_fwd_kernel(
        Q, K_PREFIX, V_PREFIX, K_PACK, V_PACK, BITMASK, CU_SEQLENS, CU_PREFIX,
        num_requests,
        OUT,
        sm_scale,
        stride_qt, stride_qh, stride_kpt, stride_kph, stride_vpt, stride_vph,
        stride_kt, stride_kh, stride_vt, stride_vh, stride_mt, stride_ot, stride_oh,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ):
        tile = tl.program_id(0)
        head = tl.program_id(1)
        kv_head = head // GROUP

        # Find the request owning this tile: request r holds tiles [first_r, first_r + ceil(n_r/BLOCK_M)).
        req = 0
        local_tile = 0
        tiles_before = 0
        for r in range(0, num_requests):
            n_r = tl.load(CU_SEQLENS + r + 1) - tl.load(CU_SEQLENS + r)
            tiles_r = (n_r + BLOCK_M - 1) // BLOCK_M
            hit = (tile >= tiles_before) & (tile < tiles_before + tiles_r)
            req = tl.where(hit, r, req)
            local_tile = tl.where(hit, tile - tiles_before, local_tile)
            tiles_before += tiles_r
        if tile >= tiles_before:  # spare program of the shape-derived grid bound
            return

        q_start = tl.load(CU_SEQLENS + req)
        n_pack = tl.load(CU_SEQLENS + req + 1) - q_start
        p_start = tl.load(CU_PREFIX + req)
        n_prefix = tl.load(CU_PREFIX + req + 1) - p_start

        offs_m = local_tile * BLOCK_M + tl.arange(0, BLOCK_M)  # request-local query rows
        offs_d = tl.arange(0, BLOCK_D)
        row_ok = offs_m < n_pack
        d_ok = offs_d < HEAD_DIM
        rows = (q_start + offs_m).to(tl.int64)
        q = tl.load(Q + rows[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_M, BLOCK_D]
        qk_scale = sm_scale * 1.4426950408889634  # exp2-based softmax

        m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)  # finite: a fully masked tile keeps alpha = 1
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        # Prefix: every query of the request sees all of it.
        for start in range(0, n_prefix, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            col_ok = offs_n < n_prefix
            cols = (p_start + offs_n).to(tl.int64)
            k = tl.load(K_PREFIX + cols[None, :] * stride_kpt + kv_head * stride_kph + offs_d[:, None],
                        mask=col_ok[None, :] & d_ok[:, None], other=0.0)  # [BLOCK_D, BLOCK_N]
            v = tl.load(V_PREFIX + cols[:, None] * stride_vpt + kv_head * stride_vph + offs_d[None, :],
                        mask=col_ok[:, None] & d_ok[None, :], other=0.0)  # [BLOCK_N, BLOCK_D]
            m_i, l_i, acc = attend_block(q, k, v, col_ok[None, :], qk_scale, m_i, l_i, acc, DOT_PRECISION)

        # Pack: key k visible to row i iff bit k % 32 of word k // 32 of row i is set.
        for start in range(0, n_pack, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            col_ok = offs_n < n_pack
            cols = (q_start + offs_n).to(tl.int64)
            k = tl.load(K_PACK + cols[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None],
                        mask=col_ok[None, :] & d_ok[:, None], other=0.0)
            v = tl.load(V_PACK + cols[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                        mask=col_ok[:, None] & d_ok[None, :], other=0.0)
            words = tl.load(BITMASK + rows[:, None] * stride_mt + (offs_n // 32)[None, :],
                            mask=row_ok[:, None] & col_ok[None, :], other=0)  # [BLOCK_M, BLOCK_N] int32
            visible = ((words >> (offs_n % 32)[None, :]) & 1) != 0
            m_i, l_i, acc = attend_block(q, k, v, visible, qk_scale, m_i, l_i, acc, DOT_PRECISION)

        l_safe = tl.where(l_i > 0.0, l_i, 1.0)  # a row that saw nothing outputs zeros
        out = acc / l_safe[:, None]
        tl.store(OUT + rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
                 out.to(OUT.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def query_block(total_tokens: int, num_requests: int) -> int:
    """BLOCK_M from the mean pack length (shapes only, no host sync)."""
    mean_pack = -(-total_tokens // max(num_requests, 1))
    return 16 if mean_pack <= 16 else 32 if mean_pack <= 32 else 64


def tree_attention_triton(q: torch.Tensor, k_prefix: torch.Tensor, v_prefix: torch.Tensor, k_pack: torch.Tensor,
                          v_pack: torch.Tensor, bitmask: torch.Tensor, cu_seqlens: torch.Tensor,
                          cu_prefix: torch.Tensor, scale: float | None = None, check_values: bool = False
                          ) -> torch.Tensor:
    """Launch the Triton kernel (CUDA tensors, or CPU tensors under TRITON_INTERPRET=1): the op of
    `tree_attention_reference`, same arguments, shapes and [T, Hq, D] output in q's dtype;
    `check_values` also reads cu_seqlens / cu_prefix on the host (`check_inputs`)."""
    require_triton()
    compiled = isinstance(tree_attention_fwd_kernel, triton.runtime.jit.JITFunction)  # vs interpreter
    if not q.is_cuda and compiled:
        raise ValueError("the Triton backend needs CUDA tensors (or TRITON_INTERPRET=1 set before importing triton)")
    check_inputs((q, k_prefix, v_prefix, k_pack, v_pack, bitmask, cu_seqlens, cu_prefix), check_values)
    total, num_q_heads, head_dim = q.shape
    num_requests = cu_seqlens.shape[0] - 1
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if total == 0:
        return out
    spec = KernelSpec(str(q.dtype).removeprefix("torch."), num_q_heads, k_pack.shape[1], head_dim, bitmask.shape[1],
                      scale, block_m=query_block(total, num_requests))
    inputs = [t.contiguous() for t in (q, k_prefix, v_prefix, k_pack, v_pack, bitmask, cu_seqlens, cu_prefix)]
    grid = (triton.cdiv(total, spec.block_m) + num_requests, num_q_heads)
    tree_attention_fwd_kernel[grid](*inputs, num_requests, out, **spec.constexprs())  # the strides of contiguous inputs
    return out
