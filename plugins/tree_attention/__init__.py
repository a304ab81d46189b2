"""Tree-attention op: packed ragged queries over prefix + ancestor-masked pack K/V.

Contract and layout: `plugins.tree_attention.contract`. Backends: `reference` (torch,
the spec) and `triton` (the kernel; CUDA, or CPU under TRITON_INTERPRET=1). The TensorRT
plugin (`trt_plugin`) runs the same kernel compiled ahead of time (`aot`).
"""
from __future__ import annotations

from plugins.tree_attention.reference import tree_attention_reference
from plugins.tree_attention.triton_kernel import tree_attention_triton, triton_available

__all__ = ["tree_attention_reference", "tree_attention_triton", "triton_available"]
