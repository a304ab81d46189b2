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

from plugins.tree_attention import triton_kernel
from plugins.tree_attention.kernel_spec import KernelSpec

AOT_ARCHS = (80, 89, 90, 100)
KERNEL_NAME = "tree_attention_fwd_kernel"


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
    triton_kernel.require_triton()
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
        fn=triton_kernel.tree_attention_fwd_kernel, signature=spec.signature(), constexprs=spec.constexprs()
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
