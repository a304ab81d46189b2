"""Torch reference of the tree-attention op: the spec every backend is tested against.

Layout and visibility rules are in `plugins.tree_attention.contract`. This version
loops over requests and builds each request's dense [n, P+n] visibility; it is meant
to be obviously right, not fast.
"""
from __future__ import annotations

import torch

from plugins.tree_attention.contract import check_inputs, resolve_scale


def unpack_bitmask(bitmask_rows: torch.Tensor, num_keys: int) -> torch.Tensor:  # [n, W] int32
    """Bool [n, num_keys]: entry (i, k) = bit k % 32 of word k // 32 of row i (LSB-first)."""
    keys = torch.arange(num_keys, device=bitmask_rows.device)
    words = bitmask_rows[:, keys // 32]  # [n, num_keys]
    return ((words >> (keys % 32).to(torch.int32)) & 1).bool()


def tree_attention_reference(
    q: torch.Tensor,  # [T, Hq, D]
    k_prefix: torch.Tensor,  # [S, Hkv, D]
    v_prefix: torch.Tensor,  # [S, Hkv, D]
    k_pack: torch.Tensor,  # [T, Hkv, D]
    v_pack: torch.Tensor,  # [T, Hkv, D]
    bitmask: torch.Tensor,  # [T, W] int32
    cu_seqlens: torch.Tensor,  # [B+1] int32
    cu_prefix: torch.Tensor,  # [B+1] int32
    scale: float | None = None,
) -> torch.Tensor:  # [T, Hq, D], dtype of q
    """Ancestor-masked attention of every packed query over its request's prefix + pack."""
    check_inputs(q, k_prefix, v_prefix, k_pack, v_pack, bitmask, cu_seqlens, cu_prefix)
    scale = resolve_scale(scale, q.shape[2])
    group = q.shape[1] // k_pack.shape[1]
    out = torch.zeros_like(q)
    seq_bounds, prefix_bounds = cu_seqlens.tolist(), cu_prefix.tolist()
    for r in range(len(seq_bounds) - 1):
        t0, t1 = seq_bounds[r], seq_bounds[r + 1]
        p0, p1 = prefix_bounds[r], prefix_bounds[r + 1]
        n = t1 - t0
        if n == 0:
            continue
        keys = torch.cat([k_prefix[p0:p1], k_pack[t0:t1]]).float()  # [P+n, Hkv, D]
        values = torch.cat([v_prefix[p0:p1], v_pack[t0:t1]]).float()  # [P+n, Hkv, D]
        keys = keys.repeat_interleave(group, dim=1)  # [P+n, Hq, D]: q head h -> kv head h // group
        values = values.repeat_interleave(group, dim=1)
        visible = torch.cat(  # [n, P+n]
            [torch.ones(n, p1 - p0, dtype=torch.bool, device=q.device), unpack_bitmask(bitmask[t0:t1], n)],
            dim=1,
        )
        scores = torch.einsum("thd,shd->hts", q[t0:t1].float(), keys) * scale  # [Hq, n, P+n]
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows that see nothing -> zeros
        out[t0:t1] = torch.einsum("hts,shd->thd", probs, values).to(q.dtype)
    return out
