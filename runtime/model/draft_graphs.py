"""Export-friendly mirrors of the DFlash drafter's forwards (same weights, shared, not copied).

`DFlashDrafter.forward` (training's) writes through a cache object and takes a Python
attention backend, neither of which traces to ONNX; these modules run the same layers over
explicit tensors instead:

  DraftGraph    one DFlash block pass [b, mask...] over the feature cache (the draft engine):
                `batch_draft_graph.BatchDraftGraph`'s pass over one request;
  ContextGraph  target taps of committed positions -> the drafter's feature-cache K/V.

The engine builder (`engine_builder.onnx_export`) exports both (`export_draft_graph`,
`export_context_graph`); the runtime's drafters run `ContextGraph` token-major (torch
eagerly, onnxruntime exported) and their block pass is `BatchDraftGraph`.

KV layouts (`ContextGraph`'s `kv_layout`; `DraftGraph` reads "layer"):
  "layer"  context_keys [drafter layers, m, Hkv, d] (the build manifest's);
  "token"  context_keys [m, drafter layers, Hkv, d]: the rows a slot pool commits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from torch import nn

from runtime.drafter.model import DFlashDrafter
from runtime.model.batch_draft_graph import BatchDraftGraph
from runtime.model.graphs import export_onnx, lm_head

CONTEXT_OUTPUTS = ("context_keys", "context_values")
KVLayout = Literal["layer", "token"]
KV_LAYOUTS: tuple[str, ...] = ("layer", "token")


class DraftGraph(BatchDraftGraph):
    """inputs: block_ids [L+1] int64 ([b, mask, ...]), position_ids [L+1] int64,
    context_keys, context_values [drafter layers, m, Hkv, d]; output: logits [L, V], -inf
    outside a reduced draft vocabulary."""

    input_names = ("block_ids", "position_ids", "context_keys", "context_values")  # over the batch graph's

    def forward(self, block_ids, position_ids, context_keys, context_values):
        layers = self.drafter.config.num_hidden_layers
        pool = [kv[i].transpose(0, 1)[None] for kv in (context_keys, context_values) for i in range(layers)]
        hidden = self.hidden(block_ids[None], position_ids[None], torch.zeros(1, dtype=torch.int64,
                             device=block_ids.device), None, pool)[0]  # one slot, every context row visible
        return lm_head(self.target, hidden) if self.head is None else self.head(hidden)


class ContextGraph(nn.Module):
    """inputs: taps [m, F] of committed positions, position_ids [m] int64;
    outputs: context_keys, context_values (see `kv_layout`) of those m rows, to append."""

    input_names, output_names = ("taps", "position_ids"), CONTEXT_OUTPUTS

    def __init__(self, drafter: DFlashDrafter, kv_layout: KVLayout = "layer") -> None:
        super().__init__()
        if kv_layout not in KV_LAYOUTS:
            raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
        self.drafter, self.rotary = drafter, drafter.config.rotary()
        self.kv_axis = 0 if kv_layout == "layer" else 1  # axis of `layers` in the context K/V

    def forward(self, taps, position_ids):
        ctx = self.drafter.hidden_norm(self.drafter.fc(taps))  # [m, H]
        rope = self.rotary(position_ids, ctx.dtype)
        kv = [layer.self_attn.key_value(ctx, rope) for layer in self.drafter.layers]  # [Hkv, m, d] each
        return tuple(torch.stack([x[j].transpose(0, 1) for x in kv], dim=self.kv_axis) for j in (0, 1))


def export_draft_graph(graph: DraftGraph, path: str | Path, example_context: int = 5) -> None:
    """Write `graph` to `path` with the context length m a dynamic axis."""
    cfg = graph.drafter.config
    device, dtype = graph.target.lm_head.weight.device, graph.target.lm_head.weight.dtype
    gen = torch.Generator().manual_seed(0)
    block = torch.full((cfg.block_size,), cfg.mask_token_id, dtype=torch.int64, device=device)
    positions = example_context + torch.arange(cfg.block_size, device=device)
    shape = [cfg.num_hidden_layers, example_context, cfg.num_key_value_heads, cfg.head_dim]
    ctx = [torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for _ in range(2)]
    export_onnx(graph, (block, positions, *ctx), path, {name: {1: "context"} for name in CONTEXT_OUTPUTS})


def export_context_graph(graph: ContextGraph, path: str | Path) -> None:
    """Write `graph` to `path` with the appended row count m a dynamic axis."""
    fc = graph.drafter.fc.weight
    taps = torch.randn(3, fc.shape[1], generator=torch.Generator().manual_seed(0)).to(device=fc.device, dtype=fc.dtype)
    axis = 1 - graph.kv_axis
    dynamic = {"taps": {0: "m"}, "position_ids": {0: "m"}, "context_keys": {axis: "m"}, "context_values": {axis: "m"}}
    export_onnx(graph, (taps, torch.arange(3, device=fc.device)), path, dynamic)
