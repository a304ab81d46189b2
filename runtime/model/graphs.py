"""Export-friendly mirror of the target's verify pass, and its ONNX exporter.

`VerifyGraph` runs the target's layers
(`runtime.model.layers` RMSNorm / RoPE / gated MLP, the target's own Linear weights,
shared, not copied) over explicit tensors: one ancestor-masked pass over a pack
[b, z_1..z_N] at positions P + depth, reading the committed prefix's K/V and returning the
pack's own K/V rows, for the TensorRT path: the engine builder (`engine_builder.onnx_export`)
exports it through `export_verify_graph`. (The runtime's own batched pass is
`runtime.model.batch_graph.BatchVerifyGraph`.)

KV layout: past_keys [layers, P, Hkv, d], new_keys [layers, n, Hkv, d] (the build manifest's).
Attention is written in standard ONNX ops (flavour "onnx": the bitmask is expanded to an
additive mask in the graph) or is the `cast::tree_attention` custom node (flavour
"plugin": the bitmask goes to the TensorRT plugin as is).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
import torch
from torch import nn

from cast_trtllm.masks import bitmask
from cast_trtllm.tree import build_chain
from plugins import onnx_schema
from plugins.tree_attention import tree_attention_reference
from runtime.model.layers import Rotary, apply_rope
from runtime.model.llama import LlamaTarget

Flavour = Literal["onnx", "plugin"]
FLAVOURS: tuple[str, ...] = ("onnx", "plugin")
OPSET = 18  # BitwiseAnd needs >= 18
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
    mask: torch.Tensor | None,  # [G*n, S] additive, rows grouped as `group_rows` makes them; None: all visible
    scale: float,
    heads: tuple[int, int, int],  # (Hq, Hkv, d) as Python ints
) -> torch.Tensor:  # [n, Hq, d]
    """Softmax attention in plain MatMul/Softmax ops; query head h reads kv head h // G.

    No shape is read off a tensor: every reshape is constants and -1, so the exported graph
    carries no Shape/Gather/Concat chains per layer."""
    num_q_heads, num_kv_heads, d = heads
    qg = q.permute(1, 0, 2).reshape(num_kv_heads, -1, d)  # [Hkv, G*n, d]: row g*n + i
    scores = (torch.matmul(qg, keys.permute(1, 2, 0)) * scale).float()  # [Hkv, G*n, S]
    if mask is not None:
        scores = scores + mask.float()
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    out = torch.matmul(probs, values.permute(1, 0, 2))  # [Hkv, G*n, d]
    return out.reshape(num_q_heads, -1, d).permute(1, 0, 2)


def group_rows(mask: torch.Tensor, group: int) -> torch.Tensor:
    """mask [n, S] -> [G*n, S]: the rows of `gqa_attention`'s grouped queries (built once per pass)."""
    return mask.repeat(group, 1)


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


def lm_head(target: LlamaTarget, h: torch.Tensor, shared: bool = True) -> torch.Tensor:  # h: [n, H] -> [n, V]
    """Logits. With tied embeddings and `shared`, written as W @ h^T against the embedding
    initializer, so the exported file holds the [V, H] matrix once; otherwise a Linear, which
    constant-folds into a second, transposed [H, V] copy: V·H more floats, but onnxruntime's
    CPU GEMM runs it faster (embedded target, n = 1: 54 vs 64 ms per verify pass)."""
    weight = target.lm_head.weight
    tied = weight.data_ptr() == target.embed_tokens.weight.data_ptr() and weight.shape == target.embed_tokens.weight.shape
    if shared and tied:
        return torch.matmul(target.embed_tokens.weight, h.t()).t()
    return target.lm_head(h)


def rope_rows(rotary: Rotary, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n, 1, d]: broadcast over heads of a token-major [n, H, d] tensor."""
    cos, sin = rotary(positions, dtype)
    return cos[:, None, :], sin[:, None, :]


class VerifyGraph(nn.Module):
    """inputs: input_ids [n] int64, position_ids [n] int64, bitmask [n, W] int32,
    past_keys, past_values [layers, P, Hkv, d]; outputs: logits [n, V], new_keys,
    new_values (the pack's rows, same layout), taps [n, F] if asked (tap for layer id i =
    HF's hidden_states[i+1]; the last layer's after the final norm)."""

    def __init__(self, target: LlamaTarget, flavour: Flavour, tap_layer_ids: Sequence[int] = ()) -> None:
        super().__init__()
        if flavour not in FLAVOURS:
            raise ValueError(f"flavour must be one of {FLAVOURS}, got {flavour!r}")
        self.target, self.flavour, self.tap_layer_ids = target, flavour, tuple(tap_layer_ids)
        cfg = target.config
        self.scale, self.heads = cfg.head_dim ** -0.5, (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)

    input_names = ("input_ids", "position_ids", "bitmask", "past_keys", "past_values")

    @property
    def output_names(self) -> tuple[str, ...]:
        return ("logits", "new_keys", "new_values") + (("taps",) if self.tap_layer_ids else ())

    def _attention(self, q, k_new, v_new, past_k, past_v, bitmask, mask) -> torch.Tensor:
        if self.flavour == "onnx":
            return gqa_attention(q, torch.cat([past_k, k_new]), torch.cat([past_v, v_new]), mask, self.scale,
                                 self.heads)
        return _TreeAttentionNode.apply(
            q, past_k, past_v, k_new, v_new, bitmask, _one_request_offsets(q), _one_request_offsets(past_k), self.scale
        )

    def forward(self, input_ids, position_ids, bitmask, past_keys, past_values):
        target, cfg = self.target, self.target.config
        h = target.embed_tokens(input_ids)  # [n, H]
        cos, sin = rope_rows(target.rotary, position_ids, h.dtype)
        past_rows = past_keys[0]  # [P, Hkv, d]: gives P inside the graph
        mask = None
        if self.flavour == "onnx":
            mask = group_rows(bitmask_to_additive(bitmask, past_rows, h.dtype), cfg.num_heads // cfg.num_kv_heads)
        new_keys, new_values, taps = [], [], {}
        for i, layer in enumerate(target.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(-1, cfg.num_heads, cfg.head_dim)
            k = attn.k_proj(x).view(-1, cfg.num_kv_heads, cfg.head_dim)
            v = attn.v_proj(x).view(-1, cfg.num_kv_heads, cfg.head_dim)
            if attn.q_norm is not None:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = apply_rope(q, cos, sin, cfg.head_dim // 2), apply_rope(k, cos, sin, cfg.head_dim // 2)
            past_k, past_v = past_keys[i], past_values[i]  # [P, Hkv, d]
            out = self._attention(q, k, v, past_k, past_v, bitmask, mask)  # [n, Hq, d]
            h = h + attn.o_proj(out.reshape(-1, cfg.num_heads * cfg.head_dim))
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


def export_onnx(module: nn.Module, args: tuple, path: Path, inputs: Sequence[str], outputs: Sequence[str],
                dynamic_axes: dict[str, dict[int, str]], custom_opsets: dict[str, int] | None = None) -> None:
    """torch's TorchScript exporter (`dynamo=False`: the dynamo one needs onnxscript, not a
    dependency) at `OPSET`, constant-folded, warnings of tracing by design silenced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # shape checks traced as constants: expected
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter is legacy, on purpose
        torch.onnx.export(
            module.eval(), args, str(path), dynamo=False, opset_version=OPSET, input_names=list(inputs),
            output_names=list(outputs), dynamic_axes=dynamic_axes, custom_opsets=custom_opsets,
            do_constant_folding=True,
        )


def export_verify_graph(graph: VerifyGraph, path: str | Path, mask_words: int, example_prefix: int = 5) -> None:
    """Write `graph` to `path` with n (packed tokens) and P (past rows) as dynamic axes.

    mask_words: W, the bitmask's fixed word count (an engine's largest bucket).
    """
    cfg, path = graph.target.config, Path(path)
    device, dtype = graph.target.lm_head.weight.device, graph.target.lm_head.weight.dtype
    words = mask_words
    n = min(3, 32 * words)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (n,), generator=gen).to(device)
    positions = example_prefix + torch.arange(n, device=device)
    causal = build_chain(np.zeros((n - 1, 1), np.int64), np.zeros((n - 1, 1)))  # a prefill: the chain's mask
    rows = torch.from_numpy(bitmask(causal, num_words=words)).to(device)  # [n, W]
    past_shape = [cfg.num_layers, example_prefix, cfg.num_kv_heads, cfg.head_dim]
    past = [torch.randn(past_shape, generator=gen).to(device=device, dtype=dtype) for _ in range(2)]
    dynamic = {"input_ids": {0: "n"}, "position_ids": {0: "n"}, "bitmask": {0: "n"}, "past_keys": {1: "past"},
               "past_values": {1: "past"}, "logits": {0: "n"}, "new_keys": {1: "n"}, "new_values": {1: "n"},
               "taps": {0: "n"}}
    custom = {onnx_schema.DOMAIN: onnx_schema.OPSET_VERSION} if graph.flavour == "plugin" else None
    names = graph.input_names + graph.output_names
    export_onnx(graph, (ids, positions, rows, *past), path, graph.input_names, graph.output_names,
                {k: v for k, v in dynamic.items() if k in names}, custom)
