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

import torch
from torch import nn

from runtime.drafter.model import DFlashDrafter
from runtime.drafter.vocab import DraftHead
from runtime.model.graphs import MASKED, export_onnx, lm_head, padded, pool_input_names, run_layers, slot_attention
from runtime.model.llama import LlamaTarget


class BatchDraftGraph(nn.Module):
    output_names = ("logits",)

    def __init__(self, drafter: DFlashDrafter, target: LlamaTarget) -> None:
        """`drafter` reads `target`'s embeddings and lm_head: it was checked to fit the target at
        load (`DrafterConfig.check_fits`; the export may run on a layer-truncated target)."""
        super().__init__()
        self.drafter, self.target, self.rotary = drafter, target, drafter.config.rotary()
        self.scale = drafter.config.head_dim ** -0.5
        # a reduced draft vocabulary scores only its rows of the lm_head
        self.head = None if drafter.d2t is None else DraftHead(target.lm_head.weight, drafter.d2t)

    @property
    def input_names(self) -> tuple[str, ...]:
        return ("block_ids", "position_ids", "slot_rows", "context_mask") + pool_input_names(
            "context", self.drafter.config.num_hidden_layers)

    def hidden(self, block_ids, position_ids, slot_rows, context_mask, pool) -> torch.Tensor:
        """The drafter's normed states [B, L, H] of every block's slots 1..L (see the module docstring)."""
        cfg = self.drafter.config
        layers, hq, hkv, d = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        rows = torch.arange(block_ids.numel(), device=block_ids.device).view(block_ids.shape)  # [B, L+1]: a slot each
        mask = None if context_mask is None else context_mask[:, None, None, :]  # [B, 1, 1, C]

        def attend(i, q, k, v):  # no mask within the block: [B, L+1, Hq, d]
            past_k, past_v = (pool[j].index_select(0, slot_rows) for j in (i, layers + i))  # [B, Hkv, C, d]
            return slot_attention(padded(q * self.scale, rows, hq, d), padded(k, rows, hkv, d), padded(v, rows, hkv, d),
                                  past_k, past_v, mask, None, hkv, hq // hkv).transpose(1, 2)

        h = run_layers(self.drafter.layers, self.target.embed_tokens(block_ids.flatten()), self.rotary,
                       position_ids.flatten(), (hq, hkv, d), attend)[0]
        return self.drafter.norm(h.unflatten(0, (-1, cfg.block_size))[:, 1:])  # drop each block's root slot

    def forward(self, block_ids, position_ids, slot_rows, context_mask, *pool):
        hidden = self.hidden(block_ids, position_ids, slot_rows, context_mask, pool)
        return lm_head(self.target, hidden, shared=False) if self.head is None else self.head.draft_logits(hidden)


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
    dynamic = {"block_ids": {0: "B"}, "position_ids": {0: "B"}, "slot_rows": {0: "B"},
               "context_mask": {0: "B", 1: "capacity"}, "logits": {0: "B"},
               **{name: {0: "slots", 2: "capacity"} for name in graph.input_names[4:]}}
    export_onnx(graph, args, path, dynamic)
