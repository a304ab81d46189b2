"""Tree-attention op: packed ragged queries over prefix + ancestor-masked pack K/V.

Contract and layout: `plugins.tree_attention.contract`. Backends: `reference` (torch,
the spec) and `triton` (the kernel; CUDA, or CPU under TRITON_INTERPRET=1). The TensorRT
plugin (`trt_plugin`) runs the same kernel compiled ahead of time (`aot`).
"""
from __future__ import annotations

from typing import Literal

import torch

from plugins.tree_attention.reference import tree_attention_reference
from plugins.tree_attention.triton_kernel import tree_attention_triton, triton_available

Backend = Literal["auto", "reference", "triton"]

__all__ = ["Backend", "tree_attention", "tree_attention_reference", "tree_attention_triton", "triton_available"]


def tree_attention(
    q: torch.Tensor,  # [T, Hq, D]
    k_prefix: torch.Tensor,  # [S, Hkv, D]
    v_prefix: torch.Tensor,  # [S, Hkv, D]
    k_pack: torch.Tensor,  # [T, Hkv, D]
    v_pack: torch.Tensor,  # [T, Hkv, D]
    bitmask: torch.Tensor,  # [T, W] int32
    cu_seqlens: torch.Tensor,  # [B+1] int32
    cu_prefix: torch.Tensor,  # [B+1] int32
    scale: float | None = None,
    backend: Backend = "auto",
) -> torch.Tensor:  # [T, Hq, D], dtype of q
    """Dispatch: "auto" runs the Triton kernel on CUDA tensors (when triton is installed)
    and the torch reference otherwise."""
    if backend == "auto":
        backend = "triton" if q.is_cuda and triton_available() else "reference"
    args = (q, k_prefix, v_prefix, k_pack, v_pack, bitmask, cu_seqlens, cu_prefix)
    if backend == "reference":
        return tree_attention_reference(*args, scale=scale)
    if backend == "triton":
        return tree_attention_triton(*args, scale=scale)
    raise ValueError(f"backend must be 'auto', 'reference' or 'triton', got {backend!r}")
