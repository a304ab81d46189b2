"""Export-friendly mirrors of the drafter's forwards (same weights, shared, not copied).

The target's verify pass is `runtime.model.graphs.VerifyGraph` (the runtime's onnxruntime
backend runs it too); these modules mirror the DFlash drafter the same way:

  DraftGraph    one DFlash block pass [b, mask...] over the feature cache (the draft engine);
  ContextGraph  target taps of committed positions -> the drafter's feature-cache K/V.

KV layout is token-major, as the tree-attention op wants it:
context_keys [drafter layers, m, Hkv, d].
"""

from __future__ import annotations

import torch
from torch import nn

from runtime.drafter.model import DFlashDrafter
from runtime.drafter.vocab import DraftHead
from runtime.model.graphs import gqa_attention, lm_head, rope_rows
from runtime.model.layers import Rotary, apply_rope, default_inv_freq
from runtime.model.llama import LlamaTarget


def drafter_rotary(drafter: DFlashDrafter) -> Rotary:
    cfg = drafter.config
    return Rotary(default_inv_freq(cfg.head_dim, cfg.rope_theta))


class DraftGraph(nn.Module):
    """inputs: block_ids [L+1] int64 ([b, mask, ...]), position_ids [L+1] int64,
    context_keys, context_values [drafter layers, m, Hkv, d]; output: logits [L, V]."""

    def __init__(self, drafter: DFlashDrafter, target: LlamaTarget) -> None:
        super().__init__()
        d, t = drafter.config, target.config
        if (d.vocab_size, d.hidden_size) != (t.vocab_size, t.hidden_size):  # layer taps: checked at load
            raise ValueError(f"drafter (vocab {d.vocab_size}, hidden {d.hidden_size}) does not fit the target "
                             f"(vocab {t.vocab_size}, hidden {t.hidden_size})")
        self.drafter, self.target, self.rotary = drafter, target, drafter_rotary(drafter)
        self.scale = drafter.config.head_dim ** -0.5
        # a reduced draft vocabulary scores only its rows of the lm_head (-inf elsewhere)
        self.head = None if drafter.d2t is None else DraftHead(target.lm_head.weight, drafter.d2t)

    def forward(self, block_ids, position_ids, context_keys, context_values):
        cfg = self.drafter.config
        h = self.target.embed_tokens(block_ids)  # [L+1, H]
        n = h.shape[0]
        cos, sin = rope_rows(self.rotary, position_ids, h.dtype)
        for i, layer in enumerate(self.drafter.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = apply_rope(attn.q_norm(attn.q_proj(x).view(n, cfg.num_attention_heads, cfg.head_dim)), cos, sin)
            k = apply_rope(attn.k_norm(attn.k_proj(x).view(n, cfg.num_key_value_heads, cfg.head_dim)), cos, sin)
            v = attn.v_proj(x).view(n, cfg.num_key_value_heads, cfg.head_dim)
            keys, values = torch.cat([context_keys[i], k]), torch.cat([context_values[i], v])
            out = gqa_attention(q, keys, values, None, self.scale)  # no mask: non-causal block
            h = h + attn.o_proj(out.reshape(n, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        hidden = self.drafter.norm(h[1:])
        return lm_head(self.target, hidden) if self.head is None else self.head(hidden)


class ContextGraph(nn.Module):
    """inputs: taps [m, F] of committed positions, position_ids [m] int64;
    outputs: context_keys, context_values [drafter layers, m, Hkv, d] to append."""

    def __init__(self, drafter: DFlashDrafter) -> None:
        super().__init__()
        self.drafter, self.rotary = drafter, drafter_rotary(drafter)

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
        return torch.stack(keys), torch.stack(values)
