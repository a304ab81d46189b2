"""The tree-attention op contract (tensor layout, input checks) and its torch reference, the
spec every backend is tested against.

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
all the same dtype). The reference loops over requests and builds each request's dense
[n, P+n] visibility: it is meant to be obviously right, not fast.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

INPUT_NAMES = ("q", "k_prefix", "v_prefix", "k_pack", "v_pack", "bitmask", "cu_seqlens", "cu_prefix")
FLOAT_DTYPES = ("float32", "float16", "bfloat16")
_RANKS = (3, 3, 3, 3, 3, 2, 1, 1)

Dim = int | None  # None: not known until run time (a dynamic TensorRT dim)


def resolve_scale(scale: float | None, head_dim: int) -> float:
    """Softmax scale; None means 1/sqrt(head_dim)."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive finite float, got {scale!r}")
    return float(scale)


def _same(a: Dim, b: Dim) -> bool:
    return a is None or b is None or a == b


def check_layout(shapes: Sequence[tuple[Dim, ...]], dtypes: Sequence[str]) -> None:
    """The contract's shape and dtype rules, one (shape, dtype name) per input in `INPUT_NAMES`
    order; dims may be None (unknown until run time). ValueError names the input that breaks it."""
    for name, shape, rank in zip(INPUT_NAMES, shapes, _RANKS):
        if len(shape) != rank:
            raise ValueError(f"{name} must have rank {rank}, got shape {tuple(shape)}")
    if dtypes[0] not in FLOAT_DTYPES:
        raise ValueError(f"q dtype {dtypes[0]!r} is not supported; use one of {FLOAT_DTYPES}")
    for name, dtype in zip(INPUT_NAMES[1:5], dtypes[1:5]):
        if dtype != dtypes[0]:
            raise ValueError(f"{name} has dtype {dtype!r} but q has {dtypes[0]!r}; q, k and v must share one dtype")
    for name, dtype in zip(INPUT_NAMES[5:], dtypes[5:]):
        if dtype != "int32":
            raise ValueError(f"{name} must be int32, got {dtype!r}")
    (total, num_q_heads, head_dim), num_kv_heads = shapes[0], shapes[3][1]
    if num_kv_heads == 0 or (None not in (num_q_heads, num_kv_heads) and num_q_heads % num_kv_heads):
        raise ValueError(f"q heads ({num_q_heads}) must be a multiple of kv heads ({num_kv_heads})")
    for name, shape in zip(INPUT_NAMES[1:5], shapes[1:5]):
        if not (_same(shape[1], num_kv_heads) and _same(shape[2], head_dim)):
            raise ValueError(f"{name} must be [*, Hkv={num_kv_heads}, D={head_dim}], got {tuple(shape)}")
    for name, shape in zip(INPUT_NAMES[3:6], shapes[3:6]):
        if not _same(shape[0], total):
            raise ValueError(f"{name} has {shape[0]} rows but q has {total}; both are the packed tokens T")
    if not _same(shapes[1][0], shapes[2][0]):
        raise ValueError(f"k_prefix ({shapes[1][0]}) and v_prefix ({shapes[2][0]}) must have equal rows")
    if shapes[5][1] == 0:
        raise ValueError("bitmask needs W >= 1 words per row")
    if not _same(shapes[6][0], shapes[7][0]) or shapes[6][0] in (0, 1):
        raise ValueError(f"cu_seqlens ({shapes[6][0]}) and cu_prefix ({shapes[7][0]}) must both be [B+1], B >= 1")


def check_inputs(tensors: Sequence[torch.Tensor], check_values: bool = True) -> None:
    """`check_layout` on the 8 input tensors (`INPUT_NAMES` order), plus one device for all;
    `check_values=True` also reads cu_seqlens and cu_prefix (one host sync on GPU) to check
    them against T, S and W."""
    q, k_prefix, _, _, _, bitmask, cu_seqlens, cu_prefix = tensors
    for name, t in zip(INPUT_NAMES, tensors):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; move all inputs to one device")
    check_layout([tuple(t.shape) for t in tensors], [str(t.dtype).removeprefix("torch.") for t in tensors])
    if check_values:
        for name, cu, total in (("cu_seqlens", cu_seqlens, q.shape[0]), ("cu_prefix", cu_prefix, k_prefix.shape[0])):
            values = cu.tolist()
            if values[0] != 0 or values[-1] != total or any(b < a for a, b in zip(values, values[1:])):
                raise ValueError(f"{name} must start at 0, never decrease and end at {total}; got {values}")
        longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        if 32 * bitmask.shape[1] < longest:
            raise ValueError(
                f"bitmask has {bitmask.shape[1]} words per row but the longest pack has {longest} tokens; "
                f"need W >= ceil({longest}/32) = {-(-longest // 32)}"
            )


def unpack_bitmask(bitmask_rows: torch.Tensor, num_keys: int) -> torch.Tensor:  # [..., n, W] int32
    """Bool [..., n, num_keys]: entry (i, k) = bit k % 32 of word k // 32 of row i (LSB-first)."""
    keys = torch.arange(num_keys, device=bitmask_rows.device)
    words = bitmask_rows[..., keys // 32]  # [..., n, num_keys]
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
    check_inputs((q, k_prefix, v_prefix, k_pack, v_pack, bitmask, cu_seqlens, cu_prefix))
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
