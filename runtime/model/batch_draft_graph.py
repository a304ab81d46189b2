"""The batched DFlash draft graph: ONE block pass for every drafting request, the feature
cache read in place from a `runtime.backends.slot_pool.SlotPool`.

Inputs:  block_ids [B, L+1] i64 ([b, mask, ...] per request), position_ids [B, L+1] i64,
         slot_rows [B] i64 (each request's slot, relative to the bound range),
         context_mask [B, C] f32 (0 on its committed rows, min elsewhere), then
         context_keys_0..{layers-1}, context_values_0.. [S, Hkv, C, d] (the pool's slot range).
Output:  logits [B, L, Vd] over the drafter's own vocabulary (`DraftHead.target_ids` maps
         them), or [B, L, V] when it has none.
The block is bidirectional (no mask within it); it attends to all of its request's
committed context. Only the drafter's few layers gather their slots' rows
(`index_select` on the slot axis); the target's graph never copies a prefix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from runtime.drafter.model import DFlashDrafter
from runtime.drafter.vocab import DraftHead
from runtime.model.batch_graph import padded, pool_input_names, slot_attention
from runtime.model.draft_graphs import check_shares_embeddings
from runtime.model.graphs import export_onnx, lm_head, rope_rows
from runtime.model.layers import apply_rope
from runtime.model.llama import LlamaTarget

MASKED = float(np.finfo(np.float32).min)


class BatchDraftGraph(nn.Module):
    def __init__(self, drafter: DFlashDrafter, target: LlamaTarget) -> None:
        super().__init__()
        check_shares_embeddings(drafter, target)
        self.drafter, self.target, self.rotary = drafter, target, drafter.config.rotary()
        self.scale = drafter.config.head_dim ** -0.5
        self.head = None if drafter.d2t is None else DraftHead(target.lm_head.weight, drafter.d2t)

    @property
    def input_names(self) -> tuple[str, ...]:
        return ("block_ids", "position_ids", "slot_rows", "context_mask") + pool_input_names(
            "context", self.drafter.config.num_hidden_layers)

    def forward(self, block_ids, position_ids, slot_rows, context_mask, *pool):
        cfg = self.drafter.config
        layers, hq, hkv, d = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        h = self.target.embed_tokens(block_ids.flatten())  # [B*(L+1), H]
        cos, sin = rope_rows(self.rotary, position_ids.flatten(), h.dtype)
        rows = torch.arange(block_ids.numel()).view(block_ids.shape)  # [B, L+1]: each block is one slot
        mask = context_mask[:, None, None, :]  # [B, 1, 1, C]
        for i, layer in enumerate(self.drafter.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_norm(attn.q_proj(x).view(-1, hq, d))
            k = attn.k_norm(attn.k_proj(x).view(-1, hkv, d))
            q, k = apply_rope(q, cos, sin, d // 2) * self.scale, apply_rope(k, cos, sin, d // 2)
            v = attn.v_proj(x).view(-1, hkv, d)
            past_k, past_v = (pool[j].index_select(0, slot_rows) for j in (i, layers + i))  # [B, Hkv, C, d]
            out = slot_attention(padded(q, rows, hq, d), padded(k, rows, hkv, d), padded(v, rows, hkv, d),
                                 past_k, past_v, mask, None, hkv, hq // hkv)  # [B, Hq, L+1, d]
            h = h + attn.o_proj(out.transpose(1, 2).reshape(-1, hq * d))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        hidden = self.drafter.norm(h.unflatten(0, (-1, cfg.block_size))[:, 1:])  # [B, L, H]: drop the root slot
        if self.head is None:
            return lm_head(self.target, hidden, shared=False)
        return self.head.draft_logits(hidden)


def export_batch_draft_graph(graph: BatchDraftGraph, path: str | Path) -> None:
    """Write `graph` with B, S and C dynamic."""
    cfg = graph.drafter.config
    weight = graph.target.lm_head.weight
    gen = torch.Generator().manual_seed(0)
    batch, slots, capacity = 2, 3, 8
    block = torch.full((batch, cfg.block_size), cfg.mask_token_id, dtype=torch.int64)
    positions = (5 + torch.arange(cfg.block_size)).repeat(batch, 1)
    mask = torch.full((batch, capacity), MASKED)
    mask[:, :5] = 0.0
    pool = [torch.randn(slots, cfg.num_key_value_heads, capacity, cfg.head_dim, generator=gen).to(weight.dtype)
            for _ in range(2 * cfg.num_hidden_layers)]
    args = tuple(a.to(weight.device) for a in (block, positions, torch.tensor([2, 0]), mask.to(weight.dtype), *pool))
    names = pool_input_names("context", cfg.num_hidden_layers)
    dynamic = {"block_ids": {0: "B"}, "position_ids": {0: "B"}, "slot_rows": {0: "B"},
               "context_mask": {0: "B", 1: "capacity"}, "logits": {0: "B"},
               **{name: {0: "slots", 2: "capacity"} for name in names}}
    export_onnx(graph, args, Path(path), graph.input_names, ("logits",), dynamic)
