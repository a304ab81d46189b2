"""Export-friendly mirrors of the runtime's forwards (same weights, shared, not copied).

The runtime's `LlamaTarget.forward` writes into a preallocated KV cache and takes a
Python attention backend, neither of which traces to ONNX; these modules run the same
layers (`runtime.model.layers` RMSNorm / RoPE / gated MLP, the target's own Linear
weights) over explicit tensors instead:

  VerifyGraph   one ancestor-masked target pass over a pack (the verify engine);
  DraftGraph    one DFlash block pass [b, mask...] over the feature cache (the draft engine);
  ContextGraph  target taps of committed positions -> the drafter's feature-cache K/V.

KV layout everywhere is token-major, as the tree-attention op wants it:
past_keys [layers, P, Hkv, d]. Attention inside VerifyGraph is either written in
standard ONNX ops (flavour "onnx": the bitmask is expanded to an additive mask in the
graph; runs in onnxruntime) or the `cast::tree_attention` custom node (flavour "plugin":
the bitmask goes to the TensorRT plugin as is).
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch
from torch import nn

from plugins import onnx_schema
from plugins.tree_attention import tree_attention_reference
from runtime.drafter.model import DFlashDrafter
from runtime.drafter.vocab import DraftHead
from runtime.model.layers import Rotary, apply_rope, default_inv_freq
from runtime.model.llama import LlamaTarget

Flavour = Literal["onnx", "plugin"]
FLAVOURS: tuple[str, ...] = ("onnx", "plugin")
BIT_WEIGHTS = torch.tensor([1 << b for b in range(31)] + [-(1 << 31)], dtype=torch.int32)  # bit b of an int32


def bitmask_to_additive(bitmask: torch.Tensor, prefix_len_like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bitmask [n, W] int32 (LSB-first) -> additive mask [n, P+n]: 0 where visible, dtype-min else.

    `prefix_len_like` is any tensor with P rows (its length gives P inside the graph).
    Bit k of word k // 32 is read with a gather + BitwiseAnd against the constant table
    of bit weights (ONNX BitShift has no int32 form).
    """
    n = bitmask.shape[0]
    cols = torch.arange(n, device=bitmask.device)  # [n] pack column k
    weights = BIT_WEIGHTS.to(bitmask.device)
    words = bitmask.index_select(1, torch.div(cols, 32, rounding_mode="floor"))  # [n, n] word of column k
    visible = torch.bitwise_and(words, weights[torch.remainder(cols, 32)]) != 0  # [n, n]
    blocked = torch.zeros(visible.shape, dtype=dtype, device=bitmask.device).masked_fill(
        ~visible, torch.finfo(dtype).min
    )
    prefix = torch.zeros(n, prefix_len_like.shape[0], dtype=dtype, device=bitmask.device)  # prefix: all visible
    return torch.cat([prefix, blocked], dim=1)


def gqa_attention(
    q: torch.Tensor,  # [n, Hq, d]
    keys: torch.Tensor,  # [S, Hkv, d]
    values: torch.Tensor,  # [S, Hkv, d]
    mask: torch.Tensor | None,  # [n, S] additive, or None (all visible)
    scale: float,
) -> torch.Tensor:  # [n, Hq, d]
    """Softmax attention in plain MatMul/Softmax ops; query head h reads kv head h // G."""
    n, num_q_heads, d = q.shape
    num_kv_heads = keys.shape[1]
    group = num_q_heads // num_kv_heads
    qg = q.permute(1, 0, 2).reshape(num_kv_heads, group * n, d)  # [Hkv, G*n, d]
    scores = torch.matmul(qg, keys.permute(1, 2, 0)) * scale  # [Hkv, G*n, S]
    scores = scores.reshape(num_kv_heads, group, n, -1).float()
    if mask is not None:
        scores = scores + mask.float()
    probs = torch.softmax(scores, dim=-1).to(q.dtype).reshape(num_kv_heads, group * n, -1)
    out = torch.matmul(probs, values.permute(1, 0, 2))  # [Hkv, G*n, d]
    return out.reshape(num_q_heads, n, d).permute(1, 0, 2)


class _TreeAttentionNode(torch.autograd.Function):
    """`cast::tree_attention` in the exported graph; the torch reference while tracing."""

    @staticmethod
    def forward(ctx, q, k_prefix, v_prefix, k_pack, v_pack, bitmask, cu_seqlens, cu_prefix, scale: float):
        return tree_attention_reference(q, k_prefix, v_prefix, k_pack, v_pack, bitmask, cu_seqlens, cu_prefix, scale)

    @staticmethod
    def symbolic(g, q, k_prefix, v_prefix, k_pack, v_pack, bitmask, cu_seqlens, cu_prefix, scale: float):
        out = g.op(
            f"{onnx_schema.DOMAIN}::{onnx_schema.OP_TYPE}", q, k_prefix, v_prefix, k_pack, v_pack, bitmask,
            cu_seqlens, cu_prefix, scale_f=scale, plugin_namespace_s=onnx_schema.PLUGIN_NAMESPACE,
            plugin_version_s=onnx_schema.PLUGIN_VERSION, aot_i=1,
        )
        out.setType(q.type())
        return out


def _one_request_offsets(rows_like: torch.Tensor) -> torch.Tensor:  # rows_like: [m, heads, d]
    """[2] int32 = [0, m], computed in the graph (m is dynamic)."""
    count = torch.ones_like(rows_like[:, 0, 0], dtype=torch.int32)  # [m]
    return torch.cat([torch.zeros_like(count[:1]), count.sum(0, keepdim=True, dtype=torch.int32)])


def lm_head(target: LlamaTarget, h: torch.Tensor) -> torch.Tensor:  # h: [n, H] -> [n, V]
    """Logits; with tied embeddings written as W @ h^T against the embedding initializer, so
    the exported file holds the [V, H] matrix once (a Linear would be constant-folded into a
    second, transposed copy)."""
    weight = target.lm_head.weight
    if weight.data_ptr() == target.embed_tokens.weight.data_ptr() and weight.shape == target.embed_tokens.weight.shape:
        return torch.matmul(target.embed_tokens.weight, h.t()).t()
    return target.lm_head(h)


def _rope(rotary: Rotary, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n, 1, d]: broadcast over heads of a token-major [n, H, d] tensor."""
    cos, sin = rotary(positions, dtype)
    return cos[:, None, :], sin[:, None, :]


class VerifyGraph(nn.Module):
    """inputs: input_ids [n] int64, position_ids [n] int64, bitmask [n, W] int32,
    past_keys, past_values [layers, P, Hkv, d]; outputs: logits [n, V],
    new_keys, new_values [layers, n, Hkv, d] (the pack's rows), taps [n, F] if asked."""

    def __init__(self, target: LlamaTarget, flavour: Flavour, tap_layer_ids: Sequence[int] = ()) -> None:
        super().__init__()
        if flavour not in FLAVOURS:
            raise ValueError(f"flavour must be one of {FLAVOURS}, got {flavour!r}")
        self.target, self.flavour, self.tap_layer_ids = target, flavour, tuple(tap_layer_ids)
        self.scale = target.config.head_dim ** -0.5

    def _attention(self, q, k_new, v_new, past_k, past_v, bitmask, mask) -> torch.Tensor:
        if self.flavour == "onnx":
            return gqa_attention(q, torch.cat([past_k, k_new]), torch.cat([past_v, v_new]), mask, self.scale)
        return _TreeAttentionNode.apply(
            q, past_k, past_v, k_new, v_new, bitmask, _one_request_offsets(q), _one_request_offsets(past_k), self.scale
        )

    def forward(self, input_ids, position_ids, bitmask, past_keys, past_values):
        target, cfg = self.target, self.target.config
        h = target.embed_tokens(input_ids)  # [n, H]
        n = h.shape[0]
        cos, sin = _rope(target.rotary, position_ids, h.dtype)
        mask = bitmask_to_additive(bitmask, past_keys[0], h.dtype) if self.flavour == "onnx" else None
        new_keys, new_values, taps = [], [], {}
        for i, layer in enumerate(target.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(n, cfg.num_heads, cfg.head_dim)
            k = attn.k_proj(x).view(n, cfg.num_kv_heads, cfg.head_dim)
            v = attn.v_proj(x).view(n, cfg.num_kv_heads, cfg.head_dim)
            if attn.q_norm is not None:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            out = self._attention(q, k, v, past_keys[i], past_values[i], bitmask, mask)  # [n, Hq, d]
            h = h + attn.o_proj(out.reshape(n, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
            new_keys.append(k)
            new_values.append(v)
            taps[i] = h
        h = target.norm(h)
        taps[cfg.num_layers - 1] = h  # HF reports the last layer after the final norm
        outputs = (lm_head(target, h), torch.stack(new_keys), torch.stack(new_values))
        if self.tap_layer_ids:
            outputs += (torch.cat([taps[i] for i in self.tap_layer_ids], dim=-1),)
        return outputs


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
        cos, sin = _rope(self.rotary, position_ids, h.dtype)
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
        cos, sin = _rope(self.rotary, position_ids, ctx.dtype)
        keys, values = [], []
        for layer in self.drafter.layers:
            attn = layer.self_attn
            k = attn.k_norm(attn.k_proj(ctx).view(m, cfg.num_key_value_heads, cfg.head_dim))
            keys.append(apply_rope(k, cos, sin))
            values.append(attn.v_proj(ctx).view(m, cfg.num_key_value_heads, cfg.head_dim))
        return torch.stack(keys), torch.stack(values)
