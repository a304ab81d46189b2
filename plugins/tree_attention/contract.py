"""The tree-attention op contract: tensor layout and input checks.

One call verifies the packs of a ragged batch of B requests in one pass.

Layout (T = total packed tokens, S = total cached prefix tokens, D = head dim):

    q          [T, Hq, D]   packed queries, request r owns rows cu_seqlens[r]:cu_seqlens[r+1]
    k_prefix   [S, Hkv, D]  cached prefix keys, request r owns rows cu_prefix[r]:cu_prefix[r+1]
    v_prefix   [S, Hkv, D]  cached prefix values, same rows as k_prefix
    k_pack     [T, Hkv, D]  keys of the packed tokens themselves (same rows as q)
    v_pack     [T, Hkv, D]  values of the packed tokens
    bitmask    [T, W] int32 ancestor bitmask, one row per packed token
    cu_seqlens [B+1] int32  cumulative pack lengths, cu_seqlens[0] = 0, cu_seqlens[B] = T
    cu_prefix  [B+1] int32  cumulative prefix lengths, cu_prefix[0] = 0, cu_prefix[B] = S
    out        [T, Hq, D]   same layout and dtype as q

Visibility: the query of packed token t of request r (request-local index i) attends
  * every prefix token of request r, and
  * request-local pack token k of request r iff bit (k % 32) of word bitmask[t, k // 32]
    is set (LSB-first; the `cast_trtllm.masks.bitmask` format, rows stacked per request).
Tokens of other requests are never visible. W may exceed ceil(n_max / 32) (padding
words are ignored), so packs of 256+ tokens are fine. A query that sees no key at all
(empty prefix and empty mask row) outputs zeros.

Grouped-query attention: query head h reads kv head h // (Hq // Hkv), as in HF
`repeat_kv`. Scores are `scale * q.k` (default scale 1/sqrt(D)), softmax in fp32,
output cast back to q's dtype. Supported dtypes: float32, bfloat16, float16 (q, k, v
all the same dtype).
"""
from __future__ import annotations

import math

import torch

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def resolve_scale(scale: float | None, head_dim: int) -> float:
    """Softmax scale; None means 1/sqrt(head_dim)."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite float, got {scale!r}")
    return float(scale)


def check_inputs(
    q: torch.Tensor,  # [T, Hq, D]
    k_prefix: torch.Tensor,  # [S, Hkv, D]
    v_prefix: torch.Tensor,  # [S, Hkv, D]
    k_pack: torch.Tensor,  # [T, Hkv, D]
    v_pack: torch.Tensor,  # [T, Hkv, D]
    bitmask: torch.Tensor,  # [T, W] int32
    cu_seqlens: torch.Tensor,  # [B+1] int32
    cu_prefix: torch.Tensor,  # [B+1] int32
    check_values: bool = True,
) -> None:
    """Raise ValueError with an actionable message if the inputs break the contract.

    Shape/dtype/device checks are free; `check_values=True` also reads cu_seqlens,
    cu_prefix (one host sync on GPU) to check their contents against T, S and W.
    """
    for name, t in (("q", q), ("k_prefix", k_prefix), ("v_prefix", v_prefix),
                    ("k_pack", k_pack), ("v_pack", v_pack)):
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D [tokens, heads, head_dim], got shape {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise ValueError(f"{name} has dtype {t.dtype} but q has {q.dtype}; cast all of q/k/v to one dtype")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; move all inputs to one device")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q dtype {q.dtype} is not supported; use one of {SUPPORTED_DTYPES}")
    total, num_q_heads, head_dim = q.shape
    if k_pack.shape != v_pack.shape or k_prefix.shape != v_prefix.shape:
        raise ValueError(
            f"keys and values must have equal shapes: k_pack {tuple(k_pack.shape)} vs v_pack "
            f"{tuple(v_pack.shape)}, k_prefix {tuple(k_prefix.shape)} vs v_prefix {tuple(v_prefix.shape)}"
        )
    if k_pack.shape[0] != total:
        raise ValueError(f"k_pack has {k_pack.shape[0]} rows but q has {total}; pack K/V rows must match q rows")
    num_kv_heads = k_pack.shape[1]
    if k_prefix.shape[1] != num_kv_heads or k_prefix.shape[2] != head_dim or k_pack.shape[2] != head_dim:
        raise ValueError(
            f"k_prefix {tuple(k_prefix.shape)} and k_pack {tuple(k_pack.shape)} must share "
            f"[*, Hkv, D] with D = q.shape[2] = {head_dim}"
        )
    if num_kv_heads == 0 or num_q_heads % num_kv_heads != 0:
        raise ValueError(f"q heads ({num_q_heads}) must be a multiple of kv heads ({num_kv_heads})")
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or bitmask.shape[0] != total or bitmask.shape[1] < 1:
        raise ValueError(
            f"bitmask must be int32 [T={total}, W>=1], got {bitmask.dtype} {tuple(bitmask.shape)}; "
            "build it with cast_trtllm.masks.batched_bitmask"
        )
    for name, cu in (("cu_seqlens", cu_seqlens), ("cu_prefix", cu_prefix)):
        if cu.dtype != torch.int32 or cu.dim() != 1 or cu.shape[0] < 2:
            raise ValueError(f"{name} must be int32 [B+1] with B >= 1, got {cu.dtype} {tuple(cu.shape)}")
    if cu_seqlens.shape != cu_prefix.shape:
        raise ValueError(
            f"cu_seqlens {tuple(cu_seqlens.shape)} and cu_prefix {tuple(cu_prefix.shape)} must both be [B+1]"
        )
    for name, t in (("bitmask", bitmask), ("cu_seqlens", cu_seqlens), ("cu_prefix", cu_prefix)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; move all inputs to one device")
    if check_values:
        _check_offsets("cu_seqlens", cu_seqlens, total)
        _check_offsets("cu_prefix", cu_prefix, k_prefix.shape[0])
        longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        if 32 * bitmask.shape[1] < longest:
            raise ValueError(
                f"bitmask has {bitmask.shape[1]} words per row but the longest pack has {longest} tokens; "
                f"need W >= ceil({longest}/32) = {-(-longest // 32)}"
            )


def _check_offsets(name: str, cu: torch.Tensor, total: int) -> None:
    values = cu.tolist()
    if values[0] != 0 or values[-1] != total or any(b < a for a, b in zip(values, values[1:])):
        raise ValueError(f"{name} must start at 0, never decrease and end at {total}; got {values}")
