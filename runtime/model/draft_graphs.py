"""Export-friendly mirrors of the DFlash drafter's forwards (same weights, shared, not copied).

`DFlashDrafter.forward` (training's) writes through a cache object and takes a Python
attention backend, neither of which traces to ONNX; these modules run the same layers over
explicit tensors instead:

  DraftGraph    one DFlash block pass [b, mask...] over the feature cache (the draft engine);
  ContextGraph  target taps of committed positions -> the drafter's feature-cache K/V.

The engine builder (`engine_builder.onnx_export`) exports both (`export_draft_graph`,
`export_context_graph`); the runtime's drafters run `ContextGraph` token-major (torch
eagerly, onnxruntime exported) and their block pass is `batch_draft_graph.BatchDraftGraph`.

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
from runtime.drafter.vocab import DraftHead
from runtime.model.graphs import export_onnx, gqa_attention, lm_head, rope_rows
from runtime.model.layers import apply_rope
from runtime.model.llama import LlamaTarget

DRAFT_INPUTS = ("block_ids", "position_ids", "context_keys", "context_values")
CONTEXT_INPUTS = ("taps", "position_ids")
CONTEXT_OUTPUTS = ("context_keys", "context_values")
KVLayout = Literal["layer", "token"]
KV_LAYOUTS: tuple[str, ...] = ("layer", "token")


def _kv_axis(kv_layout: KVLayout) -> int:
    if kv_layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {kv_layout!r}")
    return 0 if kv_layout == "layer" else 1  # axis of `layers` in the context K/V


def check_shares_embeddings(drafter: DFlashDrafter, target: LlamaTarget) -> None:
    """The drafter reads the target's embeddings and lm_head: vocab and hidden size must match
    (its tapped layers are checked at load)."""
    d, t = drafter.config, target.config
    if (d.vocab_size, d.hidden_size) != (t.vocab_size, t.hidden_size):
        raise ValueError(f"drafter (vocab {d.vocab_size}, hidden {d.hidden_size}) does not fit the target "
                         f"(vocab {t.vocab_size}, hidden {t.hidden_size})")


class DraftGraph(nn.Module):
    """inputs: block_ids [L+1] int64 ([b, mask, ...]), position_ids [L+1] int64,
    context_keys, context_values [drafter layers, m, Hkv, d]; output: logits [L, V], -inf
    outside a reduced draft vocabulary."""

    def __init__(self, drafter: DFlashDrafter, target: LlamaTarget) -> None:
        super().__init__()
        check_shares_embeddings(drafter, target)
        self.drafter, self.target, self.rotary = drafter, target, drafter.config.rotary()
        self.scale = drafter.config.head_dim ** -0.5
        # a reduced draft vocabulary scores only its rows of the lm_head
        self.head = None if drafter.d2t is None else DraftHead(target.lm_head.weight, drafter.d2t)

    def forward(self, block_ids, position_ids, context_keys, context_values):
        cfg = self.drafter.config
        h = self.target.embed_tokens(block_ids)  # [L+1, H]
        n = h.shape[0]
        cos, sin = rope_rows(self.rotary, position_ids, h.dtype)
        for i, layer in enumerate(self.drafter.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_norm(attn.q_proj(x).view(n, cfg.num_attention_heads, cfg.head_dim))
            k = attn.k_norm(attn.k_proj(x).view(n, cfg.num_key_value_heads, cfg.head_dim))
            q, k = apply_rope(q, cos, sin, cfg.head_dim // 2), apply_rope(k, cos, sin, cfg.head_dim // 2)
            v = attn.v_proj(x).view(n, cfg.num_key_value_heads, cfg.head_dim)
            ctx_k, ctx_v = context_keys[i], context_values[i]  # [m, Hkv, d]
            out = gqa_attention(q, torch.cat([ctx_k, k]), torch.cat([ctx_v, v]), None, self.scale,  # no mask
                                (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim))
            h = h + attn.o_proj(out.reshape(n, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        hidden = self.drafter.norm(h[1:])  # slot 0 is the root: drop it
        return lm_head(self.target, hidden) if self.head is None else self.head(hidden)


class ContextGraph(nn.Module):
    """inputs: taps [m, F] of committed positions, position_ids [m] int64;
    outputs: context_keys, context_values (see `kv_layout`) of those m rows, to append."""

    def __init__(self, drafter: DFlashDrafter, kv_layout: KVLayout = "layer") -> None:
        super().__init__()
        self.drafter, self.rotary, self.kv_axis = drafter, drafter.config.rotary(), _kv_axis(kv_layout)

    def forward(self, taps, position_ids):
        cfg = self.drafter.config
        ctx = self.drafter.hidden_norm(self.drafter.fc(taps))  # [m, H]
        m = ctx.shape[0]
        cos, sin = rope_rows(self.rotary, position_ids, ctx.dtype)
        keys, values = [], []
        for layer in self.drafter.layers:
            attn = layer.self_attn
            k = attn.k_norm(attn.k_proj(ctx).view(m, cfg.num_key_value_heads, cfg.head_dim))
            keys.append(apply_rope(k, cos, sin))
            values.append(attn.v_proj(ctx).view(m, cfg.num_key_value_heads, cfg.head_dim))
        return torch.stack(keys, dim=self.kv_axis), torch.stack(values, dim=self.kv_axis)


def export_draft_graph(graph: DraftGraph, path: str | Path, example_context: int = 5) -> None:
    """Write `graph` to `path` with the context length m a dynamic axis."""
    cfg, path = graph.drafter.config, Path(path)
    device, dtype = graph.target.lm_head.weight.device, graph.target.lm_head.weight.dtype
    gen = torch.Generator().manual_seed(0)
    block = torch.full((cfg.block_size,), cfg.mask_token_id, dtype=torch.int64, device=device)
    positions = example_context + torch.arange(cfg.block_size, device=device)
    shape = [cfg.num_hidden_layers, example_context, cfg.num_key_value_heads, cfg.head_dim]
    ctx = [torch.randn(shape, generator=gen).to(device=device, dtype=dtype) for _ in range(2)]
    dynamic = {"context_keys": {1: "context"}, "context_values": {1: "context"}}
    export_onnx(graph, (block, positions, *ctx), path, DRAFT_INPUTS, ("logits",), dynamic)


def export_context_graph(graph: ContextGraph, path: str | Path) -> None:
    """Write `graph` to `path` with the appended row count m a dynamic axis."""
    fc = graph.drafter.fc.weight
    taps = torch.randn(3, fc.shape[1], generator=torch.Generator().manual_seed(0)).to(device=fc.device, dtype=fc.dtype)
    positions = torch.arange(3, device=fc.device)
    axis = 1 - graph.kv_axis
    dynamic = {"taps": {0: "m"}, "position_ids": {0: "m"}, "context_keys": {axis: "m"}, "context_values": {axis: "m"}}
    export_onnx(graph, (taps, positions), Path(path), CONTEXT_INPUTS, CONTEXT_OUTPUTS, dynamic)
