"""A compact Llama-family forward over a preallocated KV cache (batch of one sequence).

Why our own forward rather than HF's: the verify pass needs depth position ids, an
ancestor mask over prefix + pack, pending cache rows that are compacted in place after
the walk, and hidden-state taps for the drafter, all of which HF's Cache API fights.
Weights are taken (shared, not copied) from a loaded HF causal LM of one of the
`SUPPORTED_MODEL_TYPES`: Llama (incl. llama3 RoPE scaling), Qwen2/2.5 (q/k/v biases) and
Qwen3 (q/k RMSNorm). fp32 logits equal HF's to rounding (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from runtime.kv_cache import KVCache
from runtime.model.attention import AttentionBackend
from runtime.model.layers import GatedMLP, RMSNorm, RopeScaling, Rotary, apply_rope, rope_scaling_of

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
# RoPE types whose HF inverse frequencies are static (taken as they are from the HF model)
TARGET_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True, slots=True)
class TargetConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    context_window: int
    qk_norm: bool = False
    attention_bias: bool = False  # q/k/v projections carry a bias (Qwen2; `attention_bias` in Llama/Qwen3)
    o_proj_bias: bool = False  # so does o_proj (`attention_bias` in Llama/Qwen3; never in Qwen2)
    rope_theta: float = 10_000.0
    rope_scaling: RopeScaling = ()  # canonical form, see runtime.model.layers.rope_scaling_of

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} must be a multiple of num_kv_heads {self.num_kv_heads}")

    @staticmethod
    def from_hf(config: Any) -> "TargetConfig":
        """Shape of an HF config; ValueError for anything this forward does not compute."""
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            supported = ", ".join(SUPPORTED_MODEL_TYPES)
            raise ValueError(f"model_type {model_type!r} is not supported; supported: {supported}")
        rope = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
        rope_theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
        scaling = rope_scaling_of(rope)
        unsupported = _not_computed(config, dict(scaling).get("rope_type", "default"), rope_theta)
        if unsupported:
            raise ValueError(f"this {model_type} checkpoint uses what the target forward does not compute: "
                             + "; ".join(unsupported))
        bias = model_type == "qwen2" or bool(getattr(config, "attention_bias", False))
        heads = config.num_attention_heads
        return TargetConfig(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            intermediate_size=config.intermediate_size,
            rms_norm_eps=config.rms_norm_eps,
            context_window=config.max_position_embeddings,
            qk_norm=model_type == "qwen3",
            attention_bias=bias,
            o_proj_bias=bias and model_type != "qwen2",
            rope_theta=float(rope_theta),
            rope_scaling=scaling,
        )


def _not_computed(config: Any, rope_type: str, rope_theta: float | None) -> list[str]:
    """What an HF config asks for that `LlamaTarget` does not compute."""
    problems = []
    if getattr(config, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {config.hidden_act!r} (only silu)")
    if getattr(config, "mlp_bias", False):
        problems.append("mlp_bias")
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        problems.append("sliding-window attention layers")
    if rope_type not in TARGET_ROPE_TYPES:
        problems.append(f"RoPE type {rope_type!r} (supported: {', '.join(TARGET_ROPE_TYPES)})")
    if rope_theta is None:
        problems.append("no rope_theta")
    return problems


class Attention(nn.Module):
    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_proj_bias)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self,
        x: torch.Tensor,  # [n, H]
        rope: tuple[torch.Tensor, torch.Tensor],  # cos, sin [n, d]
        cache: KVCache,
        layer: int,
        backend: AttentionBackend,
        prepared: Any,
    ) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(0, 1), *rope)  # [Hq, n, d]
        k = apply_rope(k.transpose(0, 1), *rope)  # [Hkv, n, d]
        keys, values = cache.write(layer, k, v.transpose(0, 1))  # [Hkv, P+n, d]
        out = backend(q, keys, values, prepared)  # [Hq, n, d]
        return self.o_proj(out.transpose(0, 1).reshape(n, -1))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h, rope, cache, layer, backend, prepared) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), rope, cache, layer, backend, prepared)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaTarget(nn.Module):
    """Target model. State (the KV cache) lives outside, in the executor."""

    def __init__(self, cfg: TargetConfig, rotary: Rotary) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.rotary = rotary

    @staticmethod
    def from_hf(hf_model: nn.Module) -> "LlamaTarget":
        """Wrap the weights of a loaded HF causal LM (shared storage, no copy)."""
        cfg = TargetConfig.from_hf(hf_model.config)
        rope = hf_model.model.rotary_emb
        with torch.device("meta"):
            model = LlamaTarget(cfg, Rotary(torch.ones(cfg.head_dim // 2)))
        state = {k.removeprefix("model."): v for k, v in hf_model.state_dict().items()}
        state["lm_head.weight"] = hf_model.get_output_embeddings().weight
        state = {k: v for k, v in state.items() if "rotary" not in k}
        model.load_state_dict(state, strict=True, assign=True)
        model.rotary = Rotary(rope.inv_freq.detach().clone(), float(rope.attention_scaling))
        model.to(hf_model.lm_head.weight.device)
        return model.eval().requires_grad_(False)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(token_ids)

    @torch.inference_mode()
    def forward(
        self,
        token_ids: torch.Tensor,  # [n] int64
        positions: torch.Tensor,  # [n] int64 absolute RoPE positions
        cache: KVCache,
        backend: AttentionBackend,
        prepared: Any,
        tap_layer_ids: Sequence[int] = (),
        logits_rows: slice | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One pass over n new tokens; their K/V land in the cache's pending rows.

        Returns logits [len(rows), V] for `logits_rows` (all rows when None) and taps
        [n, len(tap_layer_ids) * H]: tap for layer id i is HF's hidden_states[i+1] (the
        output of layer i; for the last layer HF reports it after the final norm).
        """
        h = self.embed_tokens(token_ids)  # [n, H]
        rope = self.rotary(positions, h.dtype)
        wanted = {i: None for i in tap_layer_ids}
        for i, layer in enumerate(self.layers):
            h = layer(h, rope, cache, i, backend, prepared)
            if i in wanted:
                wanted[i] = h
        h = self.norm(h)
        last = self.config.num_layers - 1
        if last in wanted:
            wanted[last] = h
        taps = torch.cat([wanted[i] for i in tap_layer_ids], dim=-1) if tap_layer_ids else None
        logits = self.lm_head(h if logits_rows is None else h[logits_rows])  # [rows, V]
        return logits, taps
