"""Pure shape/dtype description of the tree-attention plugin node (no TensorRT needed).

TensorRT hands the plugin symbolic shapes; here a dim is an int when it is a build-time
constant and None when it is dynamic. Packed length T, prefix total S and batch size B
may be dynamic (one engine serves every tree inside a width bucket); heads, head dim
and bitmask words W must be static, since the AOT binary bakes them in.
"""
from __future__ import annotations

from dataclasses import dataclass

from plugins.tree_attention.aot import KernelSpec

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
INPUT_NAMES = ("q", "k_prefix", "v_prefix", "k_pack", "v_pack", "bitmask", "cu_seqlens", "cu_prefix")
_RANKS = (3, 3, 3, 3, 3, 2, 1, 1)

Dim = int | None  # None: dynamic (known only at run time)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    shape: tuple[Dim, ...]
    dtype: str  # "float32" | "float16" | "bfloat16" | "int32" | ...


def _same(a: Dim, b: Dim) -> bool:
    return a is None or b is None or a == b


def describe_tree_attention(
    q: TensorSpec,  # [T, Hq, D]
    k_prefix: TensorSpec,  # [S, Hkv, D]
    v_prefix: TensorSpec,  # [S, Hkv, D]
    k_pack: TensorSpec,  # [T, Hkv, D]
    v_pack: TensorSpec,  # [T, Hkv, D]
    bitmask: TensorSpec,  # [T, W] int32
    cu_seqlens: TensorSpec,  # [B+1] int32
    cu_prefix: TensorSpec,  # [B+1] int32
) -> TensorSpec:  # [T, Hq, D], dtype of q
    """Output spec of the plugin node; ValueError if the inputs break the op contract."""
    specs = (q, k_prefix, v_prefix, k_pack, v_pack, bitmask, cu_seqlens, cu_prefix)
    for name, spec, rank in zip(INPUT_NAMES, specs, _RANKS):
        if len(spec.shape) != rank:
            raise ValueError(f"{name} must have rank {rank}, got shape {spec.shape}")
    if q.dtype not in FLOAT_DTYPES:
        raise ValueError(f"q dtype {q.dtype!r} is not supported; use one of {FLOAT_DTYPES}")
    for name, spec in zip(INPUT_NAMES[1:5], specs[1:5]):
        if spec.dtype != q.dtype:
            raise ValueError(f"{name} has dtype {spec.dtype!r} but q has {q.dtype!r}; q, k and v must share one dtype")
    for name, spec in zip(INPUT_NAMES[5:], specs[5:]):
        if spec.dtype != "int32":
            raise ValueError(f"{name} must be int32, got {spec.dtype!r}")
    _, num_q_heads, head_dim = q.shape
    num_kv_heads = k_pack.shape[1]
    static = dict(Hq=num_q_heads, Hkv=num_kv_heads, D=head_dim, W=bitmask.shape[1])
    dynamic = [name for name, value in static.items() if value is None]
    if dynamic:
        raise ValueError(f"{', '.join(dynamic)} must be static (build-time) dims: the AOT kernel bakes them in")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"q heads ({num_q_heads}) must be a multiple of kv heads ({num_kv_heads})")
    for name, spec in zip(INPUT_NAMES[1:5], specs[1:5]):
        if spec.shape[1] != num_kv_heads or spec.shape[2] != head_dim:
            raise ValueError(f"{name} must be [*, Hkv={num_kv_heads}, D={head_dim}], got {spec.shape}")
    for name, spec in (("k_pack", k_pack), ("v_pack", v_pack), ("bitmask", bitmask)):
        if not _same(spec.shape[0], q.shape[0]):
            raise ValueError(f"{name} has {spec.shape[0]} rows but q has {q.shape[0]}; both are the packed tokens T")
    if not _same(k_prefix.shape[0], v_prefix.shape[0]):
        raise ValueError(f"k_prefix ({k_prefix.shape[0]}) and v_prefix ({v_prefix.shape[0]}) must have equal rows")
    if not _same(cu_seqlens.shape[0], cu_prefix.shape[0]):
        raise ValueError(f"cu_seqlens ({cu_seqlens.shape[0]}) and cu_prefix ({cu_prefix.shape[0]}) must both be [B+1]")
    return TensorSpec(q.shape, q.dtype)


def kernel_spec(q: TensorSpec, k_pack: TensorSpec, bitmask: TensorSpec, scale: float) -> KernelSpec:
    """The AOT kernel variant for a described node (static Hq, Hkv, D, W and dtype)."""
    return KernelSpec(
        dtype=q.dtype, num_q_heads=q.shape[1], num_kv_heads=k_pack.shape[1], head_dim=q.shape[2],
        mask_words=bitmask.shape[1], scale=scale,
    )
