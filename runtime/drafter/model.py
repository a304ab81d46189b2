"""The DFlash block drafter (z-lab `DFlashDraftModel` math, Qwen3 layers).

Terminology: context = the cache-backed prefix x, seen only through target taps;
block = [b, mask, …, mask] (L+1 slots, slot 0 holds the pending root's embedding).

- context features: c = hidden_norm(fc(concat_i target hidden_states[i+1])) [m, H];
  every drafter layer projects the SAME c to keys/values (k_norm on keys, RoPE at the
  context's absolute positions; no input_layernorm on c). Those K/V are the feature
  cache, appended once per committed position.
- block: h = target embeddings of the block; per layer, pre-norm attention whose
  queries are the block and whose keys/values are context ∪ block, with NO mask
  (non-causal inside the block), then the gated MLP.
- output: the drafter's own final `norm`, then the target's lm_head (no target norm),
  on slots 1..L → marginals q_1..q_L; with a reduced draft vocabulary only its rows of
  the lm_head (buffer `d2t`, see `runtime.drafter.vocab`).
This matches dflash 0.1.0 `DFlashDraftModel.forward` + `compute_logits` (tested).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from runtime.drafter.config import DrafterConfig
from runtime.drafter.vocab import D2T_KEY
from runtime.model.layers import GatedMLP, RMSNorm, apply_rope


class DrafterAttention(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_key_value_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)

    def key_value(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [m, H] → k, v: [Hkv, m, d] (k normed and rotated)."""
        m = x.shape[0]
        k = self.k_norm(self.k_proj(x).view(m, self.num_kv_heads, self.head_dim))
        v = self.v_proj(x).view(m, self.num_kv_heads, self.head_dim)
        return apply_rope(k.transpose(0, 1), *rope), v.transpose(0, 1)

    def forward(self, x: torch.Tensor, rope, cache: Any, layer: int, backend: Any, prepared: Any) -> torch.Tensor:
        """x: [T, H] normed block states. Keys/values: what `cache.write` returns for this
        layer (context ∪ block); `backend(q, keys, values, prepared)` applies the visibility."""
        n = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(n, self.num_heads, self.head_dim))
        q = apply_rope(q.transpose(0, 1), *rope)  # [Hq, T, d]
        keys, values = cache.write(layer, *self.key_value(x, rope))  # scratch rows, never committed
        out = backend(q, keys, values, prepared)  # [Hq, T, d]
        return self.o_proj(out.transpose(0, 1).reshape(n, -1))


class DrafterLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.self_attn = DrafterAttention(cfg)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h: torch.Tensor, rope, cache: Any, layer: int, backend: Any, prepared: Any) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), rope, cache, layer, backend, prepared)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDrafter(nn.Module):
    """Weights only; parameter names equal the checkpoint's safetensors keys."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(len(cfg.target_layer_ids) * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DrafterLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # [Vd] int64 EAGLE-3 offsets when the head has a reduced draft vocabulary, else None
        if cfg.draft_vocab_size is None:
            self.d2t: torch.Tensor | None = None
        else:
            self.register_buffer(D2T_KEY, torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))

    def forward(self, block_embeds: torch.Tensor, rope, cache: Any, backend: Any, prepared: Any) -> torch.Tensor:
        """The ONE DFlash layer stack (serving, batched drafting and training all run it).

        block_embeds: [T, H] target embeddings of one or more blocks [b, mask…] laid end
        to end; rope: cos, sin [T, d] at each row's absolute position. `cache.write(layer,
        k, v)` stores the block rows and returns the keys/values each row may see (context
        ∪ block: training's in-memory context, `drafter_builder.blocks.ContextKV`); `backend`
        attends (no mask inside a block). Returns the final-normed hidden states of all T
        rows [T, H]; slot 0 of each block is the root (drop it).
        """
        h = block_embeds
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache, i, backend, prepared)
        return self.norm(h)
