"""The batched verify graph: ONE pass over every live request's pack (or prompt), K/V read
in place from a `runtime.backends.slot_pool.SlotPool`.

Tokens arrive flattened, T = Σ n_b, in any order; the graph pads them per slot to
[S, n] (S = slots bound, n = the longest pack) with `gather_rows`, runs each layer's
attention for all slots at once, and flattens back with `scatter_rows`. Attention of a
slot's queries reads two key sets and merges them in one softmax:
  past  the slot's pool rows [Hkv, C, d]  + past_mask [S, C]    (0 on rows < P, min elsewhere)
  new   the pack's own rows   [Hkv, n, d] + pack_mask [S, n, n] (ancestor-only tree mask)
so the committed prefix is never copied: the pool's per-layer arrays are graph inputs.
The pack's new K/V leave as outputs (token-major [T, layers, Hkv, d]); the backend gathers
the kept rows into the pool at commit (`SlotPool.commit`).

Inputs:  input_ids [T] i64, position_ids [T] i64, gather_rows [S, n] i64 (flat row of
         each padded slot row; padding repeats a valid row), scatter_rows [T] i64 (padded
         row s*n + j of each token), past_mask [S, C] f32, pack_mask [S, n, n] f32,
         logit_rows [m] i64, then past_keys_0..{layers-1} and past_values_0.. [S, Hkv, C, d].
Outputs: logits [m, V], new_keys, new_values [T, layers, Hkv, d], taps [T, F] if asked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from runtime.model.graphs import export_onnx, lm_head, rope_rows
from runtime.model.layers import apply_rope
from runtime.model.llama import LlamaTarget

MASKED = float(np.finfo(np.float32).min)


def pool_input_names(prefix: str, num_layers: int) -> tuple[str, ...]:
    """Per-layer pool inputs: <prefix>_keys_0.., then <prefix>_values_0.."""
    return tuple(f"{prefix}_{kind}_{i}" for kind in ("keys", "values") for i in range(num_layers))


def padded(x: torch.Tensor, gather_rows: torch.Tensor, heads: int, d: int) -> torch.Tensor:
    """x [T, heads, d] -> [S, heads, n, d] (slot-major, padded by `gather_rows` [S, n])."""
    return F.embedding(gather_rows, x.reshape(-1, heads * d)).unflatten(2, (heads, d)).transpose(1, 2)


def slot_attention(
    q: torch.Tensor,  # [S, Hq, n, d], already scaled
    k_new: torch.Tensor,  # [S, Hkv, n, d]
    v_new: torch.Tensor,  # [S, Hkv, n, d]
    k_past: torch.Tensor,  # [S, Hkv, C, d]
    v_past: torch.Tensor,  # [S, Hkv, C, d]
    past_mask: torch.Tensor | None,  # [S, 1, 1, C] additive; None: every past row visible
    pack_mask: torch.Tensor | None,  # [S, 1, G*n, n] additive, rows grouped (g, i); None: all visible
    num_kv_heads: int,
    group: int,  # G = Hq / Hkv
) -> torch.Tensor:  # [S, Hq, n, d]
    """Softmax attention over [past ; new] keys of each slot, without concatenating the keys:
    the two score blocks share one softmax. Query head h reads kv head h // G."""
    q = q.unflatten(1, (num_kv_heads, group)).flatten(2, 3)  # [S, Hkv, G*n, d]: row g*n + i
    past = torch.matmul(q, k_past.transpose(-1, -2))  # [S, Hkv, G*n, C]
    new = torch.matmul(q, k_new.transpose(-1, -2))  # [S, Hkv, G*n, n]
    if past_mask is not None:
        past = past + past_mask
    if pack_mask is not None:
        new = new + pack_mask
    probs = torch.softmax(torch.cat([past, new], dim=-1), dim=-1)
    split = k_past.shape[2]
    out = torch.matmul(probs[..., :split], v_past) + torch.matmul(probs[..., split:], v_new)  # [S, Hkv, G*n, d]
    return out.unflatten(2, (group, -1)).flatten(1, 2)  # [S, Hkv*G = Hq, n, d]


class BatchVerifyGraph(nn.Module):
    """The target's layers over a flattened batch of packs (see the module docstring)."""

    def __init__(self, target: LlamaTarget, tap_layer_ids: Sequence[int] = ()) -> None:
        super().__init__()
        self.target, self.tap_layer_ids = target, tuple(tap_layer_ids)
        cfg = target.config
        self.scale = cfg.head_dim ** -0.5

    @property
    def input_names(self) -> tuple[str, ...]:
        return ("input_ids", "position_ids", "gather_rows", "scatter_rows", "past_mask", "pack_mask",
                "logit_rows") + pool_input_names("past", self.target.config.num_layers)

    @property
    def output_names(self) -> tuple[str, ...]:
        return ("logits", "new_keys", "new_values") + (("taps",) if self.tap_layer_ids else ())

    def forward(self, input_ids, position_ids, gather_rows, scatter_rows, past_mask, pack_mask, logit_rows, *pool):
        target, cfg = self.target, self.target.config
        layers, hq, hkv, d = cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        h = target.embed_tokens(input_ids)  # [T, H]
        cos, sin = rope_rows(target.rotary, position_ids, h.dtype)
        past_mask4 = past_mask[:, None, None, :]  # [S, 1, 1, C]
        pack_mask4 = pack_mask.repeat(1, hq // hkv, 1)[:, None]  # [S, 1, G*n, n]
        new_keys, new_values, taps = [], [], {}
        for i, layer in enumerate(target.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(-1, hq, d)
            k = attn.k_proj(x).view(-1, hkv, d)
            v = attn.v_proj(x).view(-1, hkv, d)
            if attn.q_norm is not None:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = apply_rope(q, cos, sin, d // 2) * self.scale, apply_rope(k, cos, sin, d // 2)
            out = slot_attention(padded(q, gather_rows, hq, d), padded(k, gather_rows, hkv, d),
                                 padded(v, gather_rows, hkv, d), pool[i], pool[layers + i], past_mask4, pack_mask4,
                                 hkv, hq // hkv)  # [S, Hq, n, d]
            out = out.transpose(1, 2).flatten(0, 1).index_select(0, scatter_rows)  # [T, Hq, d]
            h = h + attn.o_proj(out.reshape(-1, hq * d))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            new_keys.append(k)
            new_values.append(v)
            taps[i] = h
        h = target.norm(h)
        taps[layers - 1] = h  # HF reports the last layer after the final norm
        logits = lm_head(target, h.index_select(0, logit_rows), shared=False)
        outputs = (logits, torch.stack(new_keys, dim=1), torch.stack(new_values, dim=1))
        if self.tap_layer_ids:
            outputs += (torch.cat([taps[i] for i in self.tap_layer_ids], dim=-1),)
        return outputs


def example_inputs(cfg, slots: int = 2, n: int = 3, capacity: int = 8, device=None, dtype=torch.float32) -> tuple:
    """Tracing inputs of a `BatchVerifyGraph` (two slots, chains of 3, past of 2)."""
    gen = torch.Generator().manual_seed(0)
    t = slots * n
    ids = torch.randint(0, cfg.vocab_size, (t,), generator=gen)
    positions = (2 + torch.arange(n)).repeat(slots)
    gather = torch.arange(t).view(slots, n)
    past_mask = torch.full((slots, capacity), MASKED)
    past_mask[:, :2] = 0.0
    pack_mask = torch.full((slots, n, n), MASKED).triu(1)  # causal
    pool = [torch.randn(slots, cfg.num_kv_heads, capacity, cfg.head_dim, generator=gen)
            for _ in range(2 * cfg.num_layers)]
    args = (ids, positions, gather, torch.arange(t), past_mask, pack_mask, torch.arange(t), *pool)
    return tuple(a.to(device=device, dtype=dtype) if a.is_floating_point() else a.to(device) for a in args)


def export_batch_verify_graph(graph: BatchVerifyGraph, path: str | Path) -> None:
    """Write `graph` with T, S, n, C, m dynamic."""
    weight = graph.target.lm_head.weight
    cfg = graph.target.config
    args = example_inputs(cfg, device=weight.device, dtype=weight.dtype)
    pool = {name: {0: "slots", 2: "capacity"} for name in pool_input_names("past", cfg.num_layers)}
    dynamic = {"input_ids": {0: "T"}, "position_ids": {0: "T"}, "gather_rows": {0: "slots", 1: "n"},
               "scatter_rows": {0: "T"}, "past_mask": {0: "slots", 1: "capacity"},
               "pack_mask": {0: "slots", 1: "n", 2: "n"}, "logit_rows": {0: "m"}, "logits": {0: "m"},
               "new_keys": {0: "T"}, "new_values": {0: "T"}, "taps": {0: "T"}, **pool}
    names = graph.input_names + graph.output_names
    export_onnx(graph, args, Path(path), graph.input_names, graph.output_names,
                {k: v for k, v in dynamic.items() if k in names})
