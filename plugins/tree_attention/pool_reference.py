"""The pool-layout tree-attention op (the engine's KV layout): contract, shape checks and the
torch reference every backend of it is tested against.

One call verifies the packs of B requests whose committed K/V live in one layer of a
`SlotPool` (runtime/backends/slot_pool.py). Every shape is static (packs padded to n):

    q           [B, n, Hq, d]   queries of each request's pack (RoPE applied, not scaled)
    k_new       [B, n, Hkv, d]  the pack's own keys; v_new the same
    k_pool      [S, Hkv, C, d]  one layer's pool view (any strides, last dim contiguous); v_pool the same
    slot_ids    [B] int32/int64 pool slot of request b
    prefix_lens [B] int32/int64 committed prefix length P_b: columns [0, P_b) of slot_ids[b]
    bitmask     [B, n, W] int32 ancestor bitmask: query i of request b sees pack key j iff bit
                                j % 32 of word bitmask[b, i, j // 32] is set (LSB-first), W >= ceil(n/32)
    out         [B, n, Hq, d]   q's dtype

Visibility: query i of request b attends every committed column [0, P_b) of its slot and the
pack keys its bitmask row marks; nothing of another request. A padded query row (all-zero
bitmask row) still sees the prefix; a row that sees no key at all outputs zeros. Scores are
`scale * q.k` (default 1/sqrt(d)), softmax in fp32. GQA: query head h reads kv head
h // (Hq // Hkv). Columns >= P_b of the slot are never read into the result, whatever they hold.

The shape checks read no tensor values (no host sync, so they run under CUDA-graph capture);
`check_pool_values` reads slot_ids / prefix_lens on the host, for tests and debugging.
"""
from __future__ import annotations

import torch

from plugins.tree_attention.reference import FLOAT_DTYPES, resolve_scale, unpack_bitmask

POOL_INPUT_NAMES = ("q", "k_new", "v_new", "k_pool", "v_pool", "slot_ids", "prefix_lens", "bitmask")
INDEX_DTYPES = (torch.int32, torch.int64)


def check_pool_inputs(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, k_pool: torch.Tensor,
                      v_pool: torch.Tensor, slot_ids: torch.Tensor, prefix_lens: torch.Tensor,
                      bitmask: torch.Tensor, num_splits: int | None = None) -> None:
    """The contract's shape, dtype and device rules (shapes only: no tensor value is read).
    ValueError names the tensor that breaks them."""
    tensors = (q, k_new, v_new, k_pool, v_pool, slot_ids, prefix_lens, bitmask)
    for name, t, rank in zip(POOL_INPUT_NAMES, tensors, (4, 4, 4, 4, 4, 1, 1, 3)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank:
            raise ValueError(f"{name} must have rank {rank}, got shape {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; move all inputs to one device")
    dtype = str(q.dtype).removeprefix("torch.")
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"q dtype {dtype!r} is not supported; use one of {FLOAT_DTYPES}")
    for name, t in zip(POOL_INPUT_NAMES[1:5], tensors[1:5]):
        if t.dtype != q.dtype:
            raise ValueError(f"{name} has dtype {t.dtype} but q has {q.dtype}; q, k and v must share one dtype")
    for name, t in (("slot_ids", slot_ids), ("prefix_lens", prefix_lens)):
        if t.dtype not in INDEX_DTYPES:
            raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
    if bitmask.dtype != torch.int32:
        raise ValueError(f"bitmask must be int32, got {bitmask.dtype}")
    batch, n, num_q_heads, head_dim = q.shape
    num_kv_heads = k_new.shape[2]
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        if t.shape != (batch, n, num_kv_heads, head_dim):
            raise ValueError(f"{name} must be [B={batch}, n={n}, Hkv={num_kv_heads}, d={head_dim}], "
                             f"got {tuple(t.shape)}")
    if num_kv_heads == 0 or num_q_heads % num_kv_heads:
        raise ValueError(f"q heads ({num_q_heads}) must be a multiple of k_new's kv heads ({num_kv_heads})")
    if k_pool.shape[1] != num_kv_heads or k_pool.shape[3] != head_dim:
        raise ValueError(f"k_pool must be [S, Hkv={num_kv_heads}, C, d={head_dim}], got {tuple(k_pool.shape)}")
    if v_pool.shape != k_pool.shape:
        raise ValueError(f"v_pool has shape {tuple(v_pool.shape)} but k_pool has {tuple(k_pool.shape)}")
    for name, t in (("slot_ids", slot_ids), ("prefix_lens", prefix_lens)):
        if t.shape[0] != batch:
            raise ValueError(f"{name} must be [B={batch}], got {tuple(t.shape)}")
    if bitmask.shape[:2] != (batch, n) or 32 * bitmask.shape[2] < max(n, 1):
        raise ValueError(f"bitmask must be [B={batch}, n={n}, W >= {max(1, -(-n // 32))}], got {tuple(bitmask.shape)}")
    if num_splits is not None and (not isinstance(num_splits, int) or num_splits < 1):
        raise ValueError(f"num_splits must be None or an int >= 1, got {num_splits!r}")


def check_pool_values(slot_ids: torch.Tensor, prefix_lens: torch.Tensor, num_slots: int, capacity: int) -> None:
    """Host check of the index values (one device->host read; never called on the round's path):
    slots in [0, S), prefix lengths in [0, C]."""
    slots, lens = slot_ids.tolist(), prefix_lens.tolist()
    if any(not 0 <= s < num_slots for s in slots):
        raise ValueError(f"slot_ids must lie in [0, {num_slots}), got {slots}")
    if any(not 0 <= p <= capacity for p in lens):
        raise ValueError(f"prefix_lens must lie in [0, C={capacity}], got {lens}")


def pool_tree_attention_reference(
    q: torch.Tensor,  # [B, n, Hq, d]
    k_new: torch.Tensor,  # [B, n, Hkv, d]
    v_new: torch.Tensor,  # [B, n, Hkv, d]
    k_pool: torch.Tensor,  # [S, Hkv, C, d]
    v_pool: torch.Tensor,  # [S, Hkv, C, d]
    slot_ids: torch.Tensor,  # [B] int
    prefix_lens: torch.Tensor,  # [B] int
    bitmask: torch.Tensor,  # [B, n, W] int32
    scale: float | None = None,
    num_splits: int | None = None,  # the kernel's split-K count; the reference has one pass
) -> torch.Tensor:  # [B, n, Hq, d], q's dtype
    """Dense fp32 attention of every query over [its slot's C columns ; the pack], with the
    visibility of the contract as one boolean mask [B, n, C + n]. No host reads."""
    check_pool_inputs(q, k_new, v_new, k_pool, v_pool, slot_ids, prefix_lens, bitmask, num_splits)
    batch, n, num_q_heads, head_dim = q.shape
    scale = resolve_scale(scale, head_dim)
    group, capacity = num_q_heads // k_new.shape[2], k_pool.shape[2]
    slots = slot_ids.long()
    keys = torch.cat([k_pool[slots].transpose(1, 2), k_new], dim=1).float()  # [B, C+n, Hkv, d]
    values = torch.cat([v_pool[slots].transpose(1, 2), v_new], dim=1).float()  # [B, C+n, Hkv, d]
    keys = keys.repeat_interleave(group, dim=2)  # [B, C+n, Hq, d]: q head h -> kv head h // group
    values = values.repeat_interleave(group, dim=2)
    columns = torch.arange(capacity, device=q.device)
    prefix_visible = (columns[None, :] < prefix_lens[:, None]).unsqueeze(1).expand(batch, n, capacity)
    visible = torch.cat([prefix_visible, unpack_bitmask(bitmask, n)], dim=2)  # [B, n, C+n]
    scores = torch.einsum("bihd,bjhd->bhij", q.float(), keys) * scale  # [B, Hq, n, C+n]
    scores = scores.masked_fill(~visible[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows that see nothing -> zeros
    return torch.einsum("bhij,bjhd->bihd", probs, values).to(q.dtype)
