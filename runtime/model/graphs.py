"""The layer code every graph runs, and the TensorRT-facing single-request verify graph.

Shared by every forward (`batch_graph.BatchVerifyGraph`, the engine's batched pass;
`batch_draft_graph` / `draft_graphs`, the drafter's): `run_layers` (the decoder layers of
the target or of the drafter, attention left to the caller), `slot_attention` (softmax
over a slot's [past ; new] keys, past read in place), `target_pass` (embeddings, layers,
norm, lm_head, taps), `export_onnx`.

`VerifyGraph` runs the target's layers (its own Linear weights, shared, not copied) over
explicit tensors: one ancestor-masked pass over a pack [b, z_1..z_N] at positions
P + depth, reading the committed prefix's K/V and returning the pack's own K/V rows, for
the TensorRT path: the engine builder (`engine_builder.onnx_export`) exports it through
`export_verify_graph`. KV layout: past_keys [layers, P, Hkv, d], new_keys [layers, n, Hkv, d]
(the build manifest's). Attention is `slot_attention` over one slot (flavour "onnx": the
bitmask is expanded to an additive mask in the graph) or the `cast::tree_attention` custom
node (flavour "plugin": the bitmask goes to the TensorRT plugin as is).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Callable, Literal, Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

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
MASKED = float(np.finfo(np.float32).min)  # additive mask value of a hidden column
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def run_layers(layers: nn.ModuleList, h: torch.Tensor, rotary: Rotary, positions: torch.Tensor,
               heads: tuple[int, int, int], attend: Attend) -> tuple[torch.Tensor, list, list, list]:
    """h [T, H] at `positions` [T] through decoder `layers` (the target's or the drafter's;
    q/k RMSNorm where a layer has them). heads: (Hq, Hkv, d) as Python ints.
    attend(i, q [T, Hq, d], k, v [T, Hkv, d]) -> layer i's attention output, T x Hq x d in
    token-major order (RoPE applied to q and k, q not scaled).
    Returns (h, keys, values, hidden): per layer its k, v and its output."""
    hq, hkv, d = heads
    cos, sin = rotary(positions, h.dtype)
    cos, sin = cos[:, None, :], sin[:, None, :]  # [T, 1, d]: broadcast over heads
    keys, values, hidden = [], [], []
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = attn.q_proj(x).view(-1, hq, d)
        k = attn.k_proj(x).view(-1, hkv, d)
        v = attn.v_proj(x).view(-1, hkv, d)
        if attn.q_norm is not None:
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = apply_rope(q, cos, sin, d // 2), apply_rope(k, cos, sin, d // 2)
        h = h + attn.o_proj(attend(i, q, k, v).reshape(-1, hq * d))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
        keys.append(k)
        values.append(v)
        hidden.append(h)
    return h, keys, values, hidden


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


def lm_head(target: LlamaTarget, h: torch.Tensor, shared: bool = True) -> torch.Tensor:  # h: [n, H] -> [n, V]
    """Logits. With tied embeddings and `shared`, written as W @ h^T against the embedding
    initializer, so the exported file holds the [V, H] matrix once; otherwise a Linear, which
    constant-folds into a second, transposed [H, V] copy: V·H more floats, but onnxruntime's
    CPU GEMM runs it faster (embedded target, n = 1: 54 vs 64 ms per verify pass)."""
    weight, embed = target.lm_head.weight, target.embed_tokens.weight
    if shared and weight.data_ptr() == embed.data_ptr() and weight.shape == embed.shape:  # tied
        return torch.matmul(embed, h.t()).t()
    return target.lm_head(h)


def target_pass(target: LlamaTarget, tap_layer_ids: Sequence[int], input_ids: torch.Tensor,
                position_ids: torch.Tensor, attend: Attend, kv_dim: int, logit_rows: torch.Tensor | None = None,
                shared: bool = True) -> tuple[torch.Tensor, ...]:
    """The target over tokens [T] -> logits [T (or the m `logit_rows`), V], new_keys, new_values
    (per layer [T, Hkv, d], stacked on `kv_dim`), taps [T, F] if asked (tap for layer id i =
    HF's hidden_states[i+1]; the last layer's after the final norm)."""
    cfg = target.config
    h, keys, values, hidden = run_layers(target.layers, target.embed_tokens(input_ids), target.rotary, position_ids,
                                         (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim), attend)
    h = hidden[-1] = target.norm(h)  # HF reports the last layer after the final norm
    rows = h if logit_rows is None else h.index_select(0, logit_rows)
    outputs = (lm_head(target, rows, shared), torch.stack(keys, dim=kv_dim), torch.stack(values, dim=kv_dim))
    if tap_layer_ids:
        outputs += (torch.cat([hidden[i] for i in tap_layer_ids], dim=-1),)
    return outputs


def bitmask_to_additive(bitmask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """bitmask [n, W] int32 (LSB-first) -> additive pack mask [n, n]: 0 where visible, dtype-min else.

    Bit k of word k // 32 is read with a gather + BitwiseAnd against the constant table
    of bit weights (ONNX BitShift has no int32 form)."""
    cols = torch.arange(bitmask.shape[0], device=bitmask.device)  # [n] pack column k
    words = bitmask.index_select(1, torch.div(cols, 32, rounding_mode="floor"))  # [n, n] word of column k
    visible = torch.bitwise_and(words, BIT_WEIGHTS.to(bitmask.device)[torch.remainder(cols, 32)]) != 0  # [n, n]
    return torch.zeros(visible.shape, dtype=dtype, device=bitmask.device).masked_fill(~visible, torch.finfo(dtype).min)


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


class VerifyGraph(nn.Module):
    """inputs: input_ids [n] int64, position_ids [n] int64, bitmask [n, W] int32,
    past_keys, past_values [layers, P, Hkv, d]; outputs: logits [n, V], new_keys,
    new_values (the pack's rows, same layout), taps [n, F] if asked (see `target_pass`)."""

    input_names = ("input_ids", "position_ids", "bitmask", "past_keys", "past_values")

    def __init__(self, target: LlamaTarget, flavour: Flavour, tap_layer_ids: Sequence[int] = ()) -> None:
        super().__init__()
        if flavour not in FLAVOURS:
            raise ValueError(f"flavour must be one of {FLAVOURS}, got {flavour!r}")
        self.target, self.flavour, self.tap_layer_ids = target, flavour, tuple(tap_layer_ids)
        self.output_names = ("logits", "new_keys", "new_values") + (("taps",) if self.tap_layer_ids else ())
        self.scale = target.config.head_dim ** -0.5

    def forward(self, input_ids, position_ids, bitmask, past_keys, past_values):
        cfg = self.target.config
        group = cfg.num_heads // cfg.num_kv_heads
        if self.flavour == "onnx":
            def one(x):  # [n, heads, d] -> one slot's [1, heads, n, d]
                return x.transpose(0, 1)[None]

            pack_mask = bitmask_to_additive(bitmask, self.target.embed_tokens.weight.dtype).repeat(group, 1)[None, None]

            def attend(i, q, k, v):  # [1, Hq, n, d] -> [n, Hq, d]
                return slot_attention(one(q) * self.scale, one(k), one(v), one(past_keys[i]), one(past_values[i]),
                                      None, pack_mask, cfg.num_kv_heads, group)[0].transpose(0, 1)
        else:
            def attend(i, q, k, v):
                return _TreeAttentionNode.apply(q, past_keys[i], past_values[i], k, v, bitmask, _one_request_offsets(q),
                                                _one_request_offsets(past_keys[i]), self.scale)
        return target_pass(self.target, self.tap_layer_ids, input_ids, position_ids, attend, kv_dim=0)


def export_onnx(graph: nn.Module, args: tuple, path: str | Path, dynamic_axes: dict[str, dict[int, str]],
                custom_opsets: dict[str, int] | None = None) -> None:
    """Write `graph` (its `input_names`, `output_names`) with torch's TorchScript exporter
    (`dynamo=False`: the dynamo one needs onnxscript, not a dependency) at `OPSET`,
    constant-folded, warnings of tracing by design silenced; axes of absent names dropped."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    names = (*graph.input_names, *graph.output_names)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # shape checks traced as constants: expected
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter is legacy, on purpose
        torch.onnx.export(
            graph.eval(), args, str(path), dynamo=False, opset_version=OPSET, input_names=list(graph.input_names),
            output_names=list(graph.output_names), dynamic_axes={k: v for k, v in dynamic_axes.items() if k in names},
            custom_opsets=custom_opsets, do_constant_folding=True,
        )


def export_verify_graph(graph: VerifyGraph, path: str | Path, mask_words: int, example_prefix: int = 5) -> None:
    """Write `graph` to `path` with n (packed tokens) and P (past rows) as dynamic axes.

    mask_words: W, the bitmask's fixed word count (an engine's largest bucket).
    """
    cfg = graph.target.config
    device, dtype = graph.target.lm_head.weight.device, graph.target.lm_head.weight.dtype
    n = min(3, 32 * mask_words)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (n,), generator=gen).to(device)
    positions = example_prefix + torch.arange(n, device=device)
    causal = build_chain(np.zeros((n - 1, 1), np.int64), np.zeros((n - 1, 1)))  # a prefill: the chain's mask
    rows = torch.from_numpy(bitmask(causal, num_words=mask_words)).to(device)  # [n, W]
    past_shape = [cfg.num_layers, example_prefix, cfg.num_kv_heads, cfg.head_dim]
    past = [torch.randn(past_shape, generator=gen).to(device=device, dtype=dtype) for _ in range(2)]
    dynamic = {"input_ids": {0: "n"}, "position_ids": {0: "n"}, "bitmask": {0: "n"}, "past_keys": {1: "past"},
               "past_values": {1: "past"}, "logits": {0: "n"}, "new_keys": {1: "n"}, "new_values": {1: "n"},
               "taps": {0: "n"}}
    custom = {onnx_schema.DOMAIN: onnx_schema.OPSET_VERSION} if graph.flavour == "plugin" else None
    export_onnx(graph, (ids, positions, rows, *past), path, dynamic, custom)
