"""The device part of a round as ONE static-shape function of its buffers (issue 37).

`device_round(target, taps, pool, meta, max_depth, attend)`:
  meta [B, 3 + 4n] int64, one row per request (padded rows commit nothing):
     slot, P (committed rows), commit (1: walk greedily and commit here),
     tokens [n] (pending root, then the tree's nodes), parent [n] (pack row of each
     node's parent; -1 for the root), depth [n] (0 for the root), present [n] (0: padding)
  -> the target over every pack at positions P + depth, each query attending to its slot's
     pool rows [0, P) and to its ancestors in the pack (one merged softmax), the greedy walk
     of every pack (`runtime.device_trees.greedy_accept`), and, for rows with commit = 1,
     the kept K/V scattered into the pool in place (the rest of a fixed-size scatter goes
     to the pool's trash column).
  Returns logits [B, n, V], new_keys / new_values [B*n, layers, Hkv, d], taps [B*n, F] and
  the committed path's taps [B, 1 + D, F] (both None without taps), and `read` [B, 1 + 2(1 + D)] int64: accepted
  count, committed pack rows, committed tokens then the next root. One tensor, one read.

No host scalar read, no data-dependent shape: `torch._dynamo` traces it whole and a CUDA
graph captures it per (batch, width) bucket (`runtime.engine.model_runner`).
"""

from __future__ import annotations

from typing import Callable

import torch

from runtime.device_trees import TreeBatch, greedy_accept
from runtime.model.graphs import slot_attention, target_pass
from runtime.model.llama import LlamaTarget

META_HEAD = 3  # slot, P, commit
PoolAttend = Callable[..., torch.Tensor]  # (q, k_new, v_new, k_pool, v_pool, slots, lengths, visible) -> out


def meta_width(n: int) -> int:
    return META_HEAD + 4 * n


def unpack(meta: torch.Tensor, max_depth: int):
    """meta [B, 3 + 4n] -> slot, P, commit [B]; pack tokens [B, n]; the tree (nodes 1..n-1) as a TreeBatch."""
    n = (meta.shape[1] - META_HEAD) // 4
    slot, length, commit = meta[:, 0], meta[:, 1], meta[:, 2] != 0
    tokens, parent, depth, present = meta[:, META_HEAD:].view(meta.shape[0], 4, n).unbind(1)
    score = torch.zeros(present[:, 1:].shape, dtype=torch.float64, device=meta.device)
    tree = TreeBatch(tokens[:, 1:], parent[:, 1:] - 1, depth[:, 1:].clamp_min(1),
                     score.masked_fill(present[:, 1:] == 0, -torch.inf), max_depth)
    return slot, length, commit, tokens, depth, tree


def eager_pool_attention(q, k_new, v_new, k_pool, v_pool, slots, lengths, visible, scale: float) -> torch.Tensor:
    """Torch attention of packs over their slots' pool rows: q [B, n, Hq, d], k_new [B, n, Hkv, d],
    k_pool [S, Hkv, C, d], visible [B, n, n] bool -> [B, n, Hq, d]. The CPU's path (it gathers each
    request's slot, a copy the Triton pool kernel does not make)."""
    B, n, hq, d = q.shape
    hkv = k_new.shape[2]
    group, low = hq // hkv, torch.finfo(q.dtype).min
    past_k, past_v = k_pool.index_select(0, slots), v_pool.index_select(0, slots)  # [B, Hkv, C, d]
    columns = torch.arange(past_k.shape[2], device=q.device)
    past_mask = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(
        torch.ones((), dtype=torch.bool, device=q.device), low) * (columns[None, :] >= lengths[:, None])
    pack_mask = torch.where(visible, 0.0, low).to(q.dtype).repeat(1, group, 1)[:, None]  # [B, 1, G*n, n]
    out = slot_attention((q * scale).transpose(1, 2), k_new.transpose(1, 2), v_new.transpose(1, 2), past_k, past_v,
                         past_mask[:, None, None, :], pack_mask, hkv, group)  # [B, Hq, n, d]
    return out.transpose(1, 2)


def visible_bitmask(visible: torch.Tensor) -> torch.Tensor:
    """[B, n, n] bool -> [B, n, ceil(n/32)] int32 words, bit k % 32 of word k // 32 (LSB-first)."""
    B, n, _ = visible.shape
    words = -(-n // 32)
    padded = torch.nn.functional.pad(visible, (0, words * 32 - n)).view(B, n, words, 32).to(torch.int64)
    value = (padded << torch.arange(32, device=visible.device)).sum(-1)  # [0, 2^32)
    return torch.where(value >= 2 ** 31, value - 2 ** 32, value).to(torch.int32)


def forward(target: LlamaTarget, taps: tuple[int, ...], pool, tokens, positions, slots, lengths, visible,
            attend: PoolAttend):
    """The target over packs [B, n] -> logits [B*n, V], keys, values [B*n, layers, Hkv, d], taps | None."""
    cfg = target.config
    B, n = tokens.shape
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    layers = cfg.num_layers

    def attend_layer(i, q, k, v):  # flat [B*n, heads, d] -> [B*n, Hq, d]
        out = attend(q.view(B, n, hq, d), k.view(B, n, hkv, d), v.view(B, n, hkv, d), pool.keys[i],
                     pool.values[i], slots, lengths, visible)
        return out.reshape(B * n, hq, d)

    del layers
    outs = target_pass(target, taps, tokens.reshape(-1), positions.reshape(-1), attend_layer, kv_dim=1, shared=False)
    return outs[0], outs[1], outs[2], (outs[3] if taps else None)


def device_round(target: LlamaTarget, taps: tuple[int, ...], pool, meta: torch.Tensor, max_depth: int,
                 attend: PoolAttend):
    """The round's device part (module docstring)."""
    slot, length, commit, tokens, depth, tree = unpack(meta, max_depth)
    B, n = tokens.shape
    visible = tree.ancestors()  # [B, n, n]: a padding node sees the root and itself
    logits, keys, values, tap_rows = forward(target, taps, pool, tokens, length[:, None] + depth, slot, length,
                                             visible, attend)
    argmax = logits.argmax(dim=-1).view(B, n)
    rows, accepted, committed = greedy_accept(tree, tokens[:, 0], argmax)  # [B, 1 + D]
    steps = torch.arange(rows.shape[1], device=meta.device)
    keep = (steps[None, :] <= accepted[:, None]) & commit[:, None]
    columns = torch.where(keep, length[:, None] + steps[None, :], pool.trash)
    flat = (torch.arange(B, device=meta.device)[:, None] * n + rows).reshape(-1)
    pool.scatter(slot[:, None].expand_as(rows).reshape(-1), columns.reshape(-1), keys.index_select(0, flat),
                 values.index_select(0, flat))
    kept_taps = None if tap_rows is None else tap_rows.index_select(0, flat).view(B, rows.shape[1], -1)
    read = torch.cat([accepted[:, None], rows, committed], 1)
    return logits.view(B, n, -1), keys, values, tap_rows, kept_taps, read
