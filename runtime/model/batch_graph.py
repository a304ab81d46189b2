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
the kept rows into the pool at commit (`SlotPool.commit_many`).

Inputs:  input_ids [T] i64, position_ids [T] i64, gather_rows [S, n] i64 (flat row of
         each padded slot row; padding repeats a valid row), scatter_rows [T] i64 (padded
         row s*n + j of each token), past_mask [S, C] f32, pack_mask [S, n, n] f32,
         logit_rows [m] i64, then past_keys_0..{layers-1} and past_values_0.. [S, Hkv, C, d].
Outputs: logits [m, V], new_keys, new_values [T, layers, Hkv, d], taps [T, F] if asked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from runtime.model.graphs import MASKED, export_onnx, padded, pool_input_names, slot_attention, target_pass
from runtime.model.llama import LlamaTarget


class BatchVerifyGraph(nn.Module):
    """The target's layers over a flattened batch of packs (see the module docstring)."""

    def __init__(self, target: LlamaTarget, tap_layer_ids: Sequence[int] = ()) -> None:
        super().__init__()
        self.target, self.tap_layer_ids = target, tuple(tap_layer_ids)
        self.scale = target.config.head_dim ** -0.5
        self.input_names = ("input_ids", "position_ids", "gather_rows", "scatter_rows", "past_mask", "pack_mask",
                            "logit_rows") + pool_input_names("past", target.config.num_layers)
        self.output_names = ("logits", "new_keys", "new_values") + (("taps",) if self.tap_layer_ids else ())

    def forward(self, input_ids, position_ids, gather_rows, scatter_rows, past_mask, pack_mask, logit_rows, *pool):
        cfg = self.target.config
        layers, hq, hkv, d = cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        past_mask4 = past_mask[:, None, None, :]  # [S, 1, 1, C]
        pack_mask4 = pack_mask.repeat(1, hq // hkv, 1)[:, None]  # [S, 1, G*n, n]

        def attend(i, q, k, v):  # padded per slot, then flattened back: [T, Hq, d]
            out = slot_attention(padded(q * self.scale, gather_rows, hq, d), padded(k, gather_rows, hkv, d),
                                 padded(v, gather_rows, hkv, d), pool[i], pool[layers + i], past_mask4, pack_mask4,
                                 hkv, hq // hkv)  # [S, Hq, n, d]
            return out.transpose(1, 2).flatten(0, 1).index_select(0, scatter_rows)

        return target_pass(self.target, self.tap_layer_ids, input_ids, position_ids, attend, 1, logit_rows,
                           shared=False)


def export_batch_verify_graph(graph: BatchVerifyGraph, path: str | Path) -> None:
    """Write `graph` with T, S, n, C, m dynamic, traced on two slots with chains of 3 over a past of 2."""
    cfg, weight = graph.target.config, graph.target.lm_head.weight
    gen, slots, n, capacity = torch.Generator().manual_seed(0), 2, 3, 8
    t = slots * n
    past_mask = torch.full((slots, capacity), MASKED)
    past_mask[:, :2] = 0.0
    pack_mask = torch.full((slots, n, n), MASKED).triu(1)  # causal
    pool = [torch.randn(slots, cfg.num_kv_heads, capacity, cfg.head_dim, generator=gen)
            for _ in range(2 * cfg.num_layers)]
    args = (torch.randint(0, cfg.vocab_size, (t,), generator=gen), (2 + torch.arange(n)).repeat(slots),
            torch.arange(t).view(slots, n), torch.arange(t), past_mask, pack_mask, torch.arange(t), *pool)
    args = tuple(a.to(weight.device, weight.dtype) if a.is_floating_point() else a.to(weight.device) for a in args)
    pool_axes = {name: {0: "slots", 2: "capacity"} for name in pool_input_names("past", cfg.num_layers)}
    dynamic = {"input_ids": {0: "T"}, "position_ids": {0: "T"}, "gather_rows": {0: "slots", 1: "n"},
               "scatter_rows": {0: "T"}, "past_mask": {0: "slots", 1: "capacity"},
               "pack_mask": {0: "slots", 1: "n", 2: "n"}, "logit_rows": {0: "m"}, "logits": {0: "m"},
               "new_keys": {0: "T"}, "new_values": {0: "T"}, "taps": {0: "T"}, **pool_axes}
    export_onnx(graph, args, path, dynamic)
