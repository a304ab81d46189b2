"""Tree-attention op: packed ragged queries over prefix + ancestor-masked pack K/V.

Contract, layout and the torch reference (the spec): `plugins.tree_attention.reference`.
The Triton kernel: `triton_kernel` (CUDA, or CPU under TRITON_INTERPRET=1). The TensorRT
plugin (`trt_plugin`) runs the same kernel compiled ahead of time (`aot`).
"""
from __future__ import annotations

from plugins.tree_attention.reference import tree_attention_reference
from plugins.tree_attention.triton_kernel import tree_attention_triton, triton_available

__all__ = ["tree_attention_reference", "tree_attention_triton", "triton_available"]
