"""What one specialisation of the packed-layout tree-attention kernel folds in (dtype, heads,
head dim, bitmask words, scale, tile shapes, contiguous strides): shared by the JIT launcher
(`triton_kernel`) and the ahead-of-time compile (`aot`), so neither imports the other's caller.
"""
from __future__ import annotations

from dataclasses import dataclass

from plugins.tree_attention.reference import resolve_scale

_TRITON_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


@dataclass(frozen=True, slots=True)
class KernelSpec:
    """Everything baked into one AOT binary of the kernel (and what a JIT launch folds)."""

    dtype: str  # "float32" | "float16" | "bfloat16" (q, k, v and out)
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    mask_words: int  # W: int32 words per bitmask row
    scale: float | None = None  # None: 1/sqrt(head_dim)
    block_m: int = 16
    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        if self.dtype not in _TRITON_DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_TRITON_DTYPES)}, got {self.dtype!r}")
        for name in ("num_q_heads", "num_kv_heads", "head_dim", "mask_words", "num_warps", "num_stages"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(
                f"num_q_heads ({self.num_q_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        for name in ("block_m", "block_n"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two >= 16 (tl.dot minimum), got {value}")
        resolve_scale(self.scale, self.head_dim)  # ValueError unless None or positive finite

    def signature(self) -> dict[str, str]:
        """Triton signature: runtime pointer/int types, 'constexpr' for everything folded."""
        ptr = "*" + _TRITON_DTYPES[self.dtype]
        sig = {name: ptr for name in ("Q", "K_PREFIX", "V_PREFIX", "K_PACK", "V_PACK")}
        sig.update(BITMASK="*i32", CU_SEQLENS="*i32", CU_PREFIX="*i32", num_requests="i32", OUT=ptr)
        sig.update({name: "constexpr" for name in self.constexprs()})
        return sig

    def constexprs(self) -> dict[str, object]:
        """Folded scalars: scale, contiguous strides, tile shapes."""
        q_row, kv_row, d = self.num_q_heads * self.head_dim, self.num_kv_heads * self.head_dim, self.head_dim
        return dict(
            sm_scale=resolve_scale(self.scale, self.head_dim),
            stride_qt=q_row, stride_qh=d, stride_kpt=kv_row, stride_kph=d, stride_vpt=kv_row, stride_vph=d,
            stride_kt=kv_row, stride_kh=d, stride_vt=kv_row, stride_vh=d, stride_mt=self.mask_words,
            stride_ot=q_row, stride_oh=d,
            GROUP=self.num_q_heads // self.num_kv_heads, HEAD_DIM=self.head_dim,
            BLOCK_D=max(16, 1 << (self.head_dim - 1).bit_length()),  # a power of two >= 16 (the tl.dot minimum)
            BLOCK_M=self.block_m, BLOCK_N=self.block_n,
            DOT_PRECISION="ieee" if self.dtype == "float32" else "tf32",  # exact fp32 dots meet fp32 tolerance
        )
