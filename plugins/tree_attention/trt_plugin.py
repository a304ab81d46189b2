"""TensorRT quickly-deployable plugin `cast::tree_attention` (TensorRT >= 10.9).

UNVALIDATED here: no machine of this project has had TensorRT installed. What this file
adds over pieces that ARE tested on CPU (the shape/dtype description
`describe_tree_attention`, the AOT PTX in `aot.py`, the kernel itself under the Triton
interpreter) is only the binding to `tensorrt.plugin`:

  * `register`   output = q's shape and dtype (checks in `describe_tree_attention`);
  * `autotune`   q/k/v/out in one float dtype (fp32 | fp16 | bf16), the rest int32;
  * `aot_impl`   the Triton kernel compiled ahead of time for the build GPU, grid from
                 the (dynamic) shapes, B passed as the one int extra argument;
  * `impl`       JIT fallback that launches the same kernel through torch + triton.

The bitmask, cu_seqlens and cu_prefix are ordinary dynamic inputs, so one engine
serves every tree shape inside a width bucket. Call `register_plugin()` once before
building or deserialising an engine that holds the node; `tensorrt_status()` says why
it cannot run where TensorRT is missing.
"""
from __future__ import annotations

from dataclasses import dataclass

from plugins.onnx_schema import OP_TYPE, PLUGIN_NAMESPACE
from plugins.tree_attention.aot import compile_kernel
from plugins.tree_attention.kernel_spec import KernelSpec
from plugins.tree_attention.reference import Dim, check_layout

PLUGIN_ID = f"{PLUGIN_NAMESPACE}::{OP_TYPE}"
MIN_TENSORRT = (10, 9)

try:
    import tensorrt as trt
    import tensorrt.plugin as trtp
except ImportError as exc:  # TensorRT comes from NVIDIA's index; absent on CPU machines
    trt = trtp = None
    _IMPORT_ERROR: ImportError | None = exc
else:
    _IMPORT_ERROR = None

_registered = False


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """A plugin input or output as TensorRT describes it: a dim is None when dynamic."""

    shape: tuple[Dim, ...]
    dtype: str  # "float32" | "float16" | "bfloat16" | "int32" | ...


def describe_tree_attention(
    q: TensorSpec, k_prefix: TensorSpec, v_prefix: TensorSpec, k_pack: TensorSpec, v_pack: TensorSpec,
    bitmask: TensorSpec, cu_seqlens: TensorSpec, cu_prefix: TensorSpec,
) -> TensorSpec:  # [T, Hq, D], dtype of q
    """Output spec of the plugin node; ValueError if the inputs break the op contract. T, S and
    B may be dynamic (one engine serves every tree of a width bucket); Hq, Hkv, D and W must be
    static, since the AOT binary bakes them in."""
    specs = (q, k_prefix, v_prefix, k_pack, v_pack, bitmask, cu_seqlens, cu_prefix)
    check_layout([s.shape for s in specs], [s.dtype for s in specs])
    static = dict(Hq=q.shape[1], Hkv=k_pack.shape[1], D=q.shape[2], W=bitmask.shape[1])
    dynamic = [name for name, value in static.items() if value is None]
    if dynamic:
        raise ValueError(f"{', '.join(dynamic)} must be static (build-time) dims: the AOT kernel bakes them in")
    return TensorSpec(q.shape, q.dtype)


def kernel_spec(q: TensorSpec, k_pack: TensorSpec, bitmask: TensorSpec, scale: float) -> KernelSpec:
    """The AOT kernel variant for a described node (static Hq, Hkv, D, W and dtype)."""
    return KernelSpec(dtype=q.dtype, num_q_heads=q.shape[1], num_kv_heads=k_pack.shape[1], head_dim=q.shape[2],
                      mask_words=bitmask.shape[1], scale=scale)


def tensorrt_status() -> str | None:
    """None when the plugin can be registered here, else a sentence saying what is missing."""
    if _IMPORT_ERROR is not None:
        return (
            f"TensorRT is not importable ({_IMPORT_ERROR}); install tensorrt>={'.'.join(map(str, MIN_TENSORRT))} "
            "from NVIDIA's package index (pip install --extra-index-url https://pypi.nvidia.com tensorrt)"
        )
    version = tuple(int(part) for part in trt.__version__.split(".")[:2])
    if version < MIN_TENSORRT or not hasattr(trtp, "aot_impl"):
        return f"TensorRT {trt.__version__} lacks tensorrt.plugin.aot_impl; need >= {'.'.join(map(str, MIN_TENSORRT))}"
    return None


def register_plugin() -> None:
    """Register `cast::tree_attention` with TensorRT's plugin registry (idempotent)."""
    global _registered
    if (status := tensorrt_status()) is not None:
        raise RuntimeError(status)
    if not _registered:
        _define()
        _registered = True


def _spec(desc) -> TensorSpec:
    dtypes = {trt.float32: "float32", trt.float16: "float16", trt.bfloat16: "bfloat16", trt.int32: "int32"}
    shape = tuple(d.constant_value() if d.is_constant else None for d in desc.shape_expr)
    return TensorSpec(shape, dtypes.get(desc.dtype, str(desc.dtype)))


def _define() -> None:
    from typing import List, Tuple, Union

    float_types = "FP32|FP16|BF16"

    @trtp.register(PLUGIN_ID)
    def tree_attention_desc(
        q: trtp.TensorDesc, k_prefix: trtp.TensorDesc, v_prefix: trtp.TensorDesc,
        k_pack: trtp.TensorDesc, v_pack: trtp.TensorDesc, bitmask: trtp.TensorDesc,
        cu_seqlens: trtp.TensorDesc, cu_prefix: trtp.TensorDesc, scale: float,
    ) -> trtp.TensorDesc:
        if not scale > 0:
            raise ValueError(f"scale attribute must be positive, got {scale}")
        descs = (q, k_prefix, v_prefix, k_pack, v_pack, bitmask, cu_seqlens, cu_prefix)
        describe_tree_attention(*(_spec(d) for d in descs))
        return q.like()

    @trtp.autotune(PLUGIN_ID)
    def tree_attention_autotune(
        q, k_prefix, v_prefix, k_pack, v_pack, bitmask, cu_seqlens, cu_prefix, outputs
    ) -> List[trtp.AutoTuneCombination]:
        combination = trtp.AutoTuneCombination()
        combination.pos([0, 1, 2, 3, 4, 8], float_types)  # q, k/v prefix, k/v pack, out
        combination.pos([5, 6, 7], "INT32")  # bitmask, cu_seqlens, cu_prefix
        return [combination]

    @trtp.aot_impl(PLUGIN_ID)
    def tree_attention_aot(
        q: trtp.TensorDesc, k_prefix: trtp.TensorDesc, v_prefix: trtp.TensorDesc,
        k_pack: trtp.TensorDesc, v_pack: trtp.TensorDesc, bitmask: trtp.TensorDesc,
        cu_seqlens: trtp.TensorDesc, cu_prefix: trtp.TensorDesc, scale: float,
        outputs: Tuple[trtp.TensorDesc], tactic: int,
    ) -> Tuple[Union[str, bytes], Union[str, bytes], trtp.KernelLaunchParams, trtp.SymExprs]:
        import triton

        arch = int(triton.runtime.driver.active.get_current_target().arch)  # the build GPU's, e.g. 90
        compiled = compile_kernel(kernel_spec(_spec(q), _spec(k_pack), _spec(bitmask), scale), arch=arch)
        num_requests = cu_seqlens.shape_expr[0] - 1
        launch = trtp.KernelLaunchParams()
        launch.grid_x = trtp.cdiv(q.shape_expr[0], compiled.block_m) + num_requests
        launch.grid_y = q.shape_expr[1]
        launch.block_x = compiled.threads_per_block
        launch.shared_mem = compiled.shared_mem
        extra_args = trtp.SymIntExprs.from_tuple([trtp.SymInt32(num_requests)])
        return compiled.name.encode(), compiled.ptx.encode(), launch, extra_args

    @trtp.impl(PLUGIN_ID)
    def tree_attention_jit(
        q: trtp.Tensor, k_prefix: trtp.Tensor, v_prefix: trtp.Tensor, k_pack: trtp.Tensor,
        v_pack: trtp.Tensor, bitmask: trtp.Tensor, cu_seqlens: trtp.Tensor, cu_prefix: trtp.Tensor,
        scale: float, outputs: Tuple[trtp.Tensor], stream: int,
    ) -> None:
        import torch

        from plugins.tree_attention.triton_kernel import tree_attention_triton

        with torch.cuda.stream(torch.cuda.ExternalStream(stream)):
            tensors = [torch.as_tensor(t, device="cuda") for t in (q, k_prefix, v_prefix, k_pack, v_pack,
                                                                   bitmask, cu_seqlens, cu_prefix)]
            torch.as_tensor(outputs[0], device="cuda").copy_(tree_attention_triton(*tensors, scale=scale))
