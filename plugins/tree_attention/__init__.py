"""Tree-attention op: ragged queries over a committed prefix + ancestor-masked pack K/V.

Two layouts of one op:
  * packed (`reference`, spec + torch reference; `triton_kernel`, its Triton kernel; `trt_plugin`,
    the same kernel compiled ahead of time by `aot` for TensorRT): prefixes and packs of a ragged
    batch concatenated, cu_seqlens / cu_prefix offsets;
  * pool (`pool_reference`, spec + torch reference; `pool_kernel`, its split-K Triton kernels with
    GQA heads packed per program): K/V read straight from the engine's SlotPool by slot id and
    prefix length, every shape static (CUDA-graph capturable).
Triton kernels run on CUDA, or on the CPU under TRITON_INTERPRET=1.
"""
from __future__ import annotations

from plugins.tree_attention.pool_kernel import pool_tree_attention, pool_tree_attention_triton
from plugins.tree_attention.pool_reference import pool_tree_attention_reference
from plugins.tree_attention.reference import tree_attention_reference
from plugins.tree_attention.triton_kernel import tree_attention_triton, triton_available

__all__ = ["pool_tree_attention", "pool_tree_attention_reference", "pool_tree_attention_triton",
           "tree_attention_reference", "tree_attention_triton", "triton_available"]
