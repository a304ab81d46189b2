"""Layers shared by the target forward and the DFlash drafter.

Each matches its Hugging Face counterpart operation for operation (RMSNorm upcasts to
fp32, RoPE angles are computed in fp32 then cast), so fp32 logits agree with the HF
model to rounding.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
from torch import nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps), computed in fp32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class Rotary(nn.Module):
    """Rotary position embedding from precomputed inverse frequencies.

    `inv_freq` [head_dim/2] already carries any rope scaling (default, llama3, linear…);
    `attention_scaling` multiplies cos/sin as in HF.
    """

    def __init__(self, inv_freq: torch.Tensor, attention_scaling: float = 1.0) -> None:
        super().__init__()
        # a plain attribute, not a buffer: `module.to(bfloat16)` must not round it
        self.inv_freq = inv_freq.to(torch.float32)
        self.attention_scaling = attention_scaling

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [n] int64. Returns cos, sin: [n, head_dim] in `dtype`."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions[:, None].to(torch.float32) * self.inv_freq[None, :]  # [n, d/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype), sin.to(dtype)


def default_inv_freq(head_dim: int, rope_theta: float) -> torch.Tensor:
    """[head_dim/2] inverse frequencies of unscaled RoPE."""
    return 1.0 / (rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


# RoPE scaling in a canonical, hashable form: sorted (key, value) pairs of the HF
# `rope_scaling` / `rope_parameters` dict, `rope_type` included, `rope_theta` left out;
# () means plain (unscaled) RoPE.
RopeScaling = tuple[tuple[str, Any], ...]
COMPUTED_ROPE_TYPES = ("default", "linear", "llama3")  # what `rope_inv_freq` computes


def rope_scaling_of(params: Mapping[str, Any] | None) -> RopeScaling:
    """The canonical form of an HF RoPE dict (None or rope_type "default": ())."""
    params = dict(params or {})
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    params.pop("rope_theta", None)
    if rope_type == "default":
        return ()
    return (("rope_type", rope_type), *sorted(params.items()))


def rope_inv_freq(head_dim: int, rope_theta: float, scaling: RopeScaling = ()) -> torch.Tensor:
    """[head_dim/2] inverse frequencies with the scaling applied (HF's static rules)."""
    inv_freq = default_inv_freq(head_dim, rope_theta)
    params = dict(scaling)
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / float(params["factor"])
    if rope_type == "llama3":
        # Llama 3.1: long wavelengths divided by `factor`, short kept, a smooth blend between
        factor, low, high = float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"])
        old_len = float(params["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, blended, scaled)
    supported = ", ".join(COMPUTED_ROPE_TYPES)
    raise ValueError(f"RoPE scaling type {rope_type!r} is not supported here (supported: {supported})")


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half: int | None = None) -> torch.Tensor:
    """x: [heads, n, d]; cos, sin: [n, d]. Rotates the two halves of each head.
    `half` = d // 2 as a Python int keeps an exported graph free of shape arithmetic."""
    half = x.shape[-1] // 2 if half is None else half
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)); parameter names follow the HF / DFlash checkpoints."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
