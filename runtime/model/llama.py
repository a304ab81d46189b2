"""The target's weights and shape: a compact Llama-family decoder (`LlamaTarget`, `TargetConfig`).

The forwards that run these weights are `runtime.model.batch_graph.BatchVerifyGraph`
(the engine's one batched pass, torch or onnxruntime) and `runtime.model.graphs.VerifyGraph`
(the ONNX / TensorRT export). Why our own forward rather than HF's: the verify pass needs
depth position ids, an ancestor mask over prefix + pack, pending cache rows committed
after the walk, and hidden-state taps for the drafter, all of which HF's Cache API fights.
Weights are taken (shared, not copied) from a loaded HF causal LM of one of the
`SUPPORTED_MODEL_TYPES`: Llama (incl. llama3 RoPE scaling), Qwen2/2.5 (q/k/v biases) and
Qwen3 (q/k RMSNorm). fp32 logits equal HF's to rounding (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from runtime.model.layers import GatedMLP, RMSNorm, RopeScaling, Rotary, rope_scaling_of

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

    def tap_layers(self, layer_ids) -> tuple[int, ...]:
        """The drafter's tapped layer ids, checked against this target's layers."""
        bad = [i for i in layer_ids if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"tap layer ids {bad} are outside the target's {self.num_layers} layers")
        return tuple(int(i) for i in layer_ids)

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


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TargetConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaTarget(nn.Module):
    """Target weights. State (the KV cache) lives outside, in the backend's slot pool."""

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
