"""Ahead-of-time compile of the tree-attention Triton kernel to PTX, without a GPU.

`triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))` runs the whole
NVIDIA pipeline on the CPU (ttir -> ttgir -> llir -> ptx, plus a cubin from the ptxas
that ships inside the triton wheel). One binary is specialised per KernelSpec: dtype,
head counts, head dim, bitmask words and softmax scale are baked in, and the strides are
those of contiguous [tokens, heads, head_dim] / [tokens, W] tensors (the layout TensorRT
hands a plugin). Runtime parameters of the PTX entry, in order (TensorRT AOT plugin
convention: inputs, int scalars, outputs):

    q, k_prefix, v_prefix, k_pack, v_pack, bitmask, cu_seqlens, cu_prefix,  (pointers)
    num_requests (i32), out (pointer),
    then two trailing pointers Triton >= 3.3 appends (global / profile scratch); this
    kernel uses neither (checked: both sizes are 0), so a launcher may pass null.

Grid: (cdiv(T, block_m) + B, Hq, 1); block: (32 * num_warps, 1, 1); dynamic shared
memory: `shared_mem` bytes.
"""
from __future__ import annotations

from dataclasses import dataclass

from plugins.tree_attention.reference import resolve_scale

AOT_ARCHS = (80, 89, 90, 100)
KERNEL_NAME = "tree_attention_fwd_kernel"
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


@dataclass(frozen=True, slots=True)
class CompiledKernel:
    """One AOT binary plus what a launcher needs."""

    name: str  # PTX entry name
    arch: int  # e.g. 90 for sm_90
    ptx: str
    num_warps: int
    shared_mem: int  # dynamic shared memory bytes
    block_m: int

    @property
    def threads_per_block(self) -> int:
        return 32 * self.num_warps

    def grid(self, total_tokens: int, num_requests: int, num_q_heads: int) -> tuple[int, int, int]:
        return (-(-total_tokens // self.block_m) + num_requests, num_q_heads, 1)


def compile_binary(spec: KernelSpec, arch: int = 90, ptx_version: int | None = None):  # -> triton CompiledKernel
    """Triton's compiled kernel for sm_<arch> (asm: ttir ... ptx, cubin), on any machine.

    No GPU or driver is needed: Triton's own LLVM emits the PTX and the ptxas bundled
    in the triton wheel assembles the cubin. `ptx_version` (e.g. 84 for PTX ISA 8.4)
    lowers the PTX ISA version for older drivers; by default Triton uses the newest its
    bundled ptxas supports.
    """
    from plugins.tree_attention.triton_kernel import require_triton, tree_attention_fwd_kernel

    require_triton()
    import triton
    from triton.backends.compiler import GPUTarget

    if arch not in AOT_ARCHS:
        raise ValueError(f"arch must be one of {AOT_ARCHS} (sm_80/89/90/100), got {arch}")
    if triton.knobs.runtime.interpret:
        raise RuntimeError(
            "AOT compile needs a process where triton was imported without TRITON_INTERPRET=1 "
            "(the interpreter replaces triton.language's own jit functions); run it in a separate process"
        )
    options = dict(num_warps=spec.num_warps, num_stages=spec.num_stages)
    if ptx_version is not None:
        options["ptx_version"] = ptx_version
    source = triton.compiler.ASTSource(
        fn=tree_attention_fwd_kernel, signature=spec.signature(), constexprs=spec.constexprs()
    )
    binary = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    if binary.metadata.global_scratch_size or binary.metadata.profile_scratch_size:
        raise RuntimeError("the kernel unexpectedly needs Triton scratch memory; the TensorRT launch passes none")
    return binary


def compile_kernel(spec: KernelSpec, arch: int = 90, ptx_version: int | None = None) -> CompiledKernel:
    """PTX of the kernel for sm_<arch> plus its launch facts (see `compile_binary`)."""
    binary = compile_binary(spec, arch, ptx_version)
    meta = binary.metadata
    return CompiledKernel(
        name=meta.name, arch=arch, ptx=binary.asm["ptx"], num_warps=meta.num_warps,
        shared_mem=meta.shared, block_m=spec.block_m,
    )
