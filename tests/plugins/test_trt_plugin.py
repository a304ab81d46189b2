"""The plugin's shape/dtype description, tested without TensorRT; the module imports anyway."""
import pytest

from plugins.tree_attention import trt_plugin
from plugins.tree_attention.trt_plugin import TensorSpec, describe_tree_attention, kernel_spec


def node_inputs(T=None, S=None, B1=None, Hq=32, Hkv=8, D=128, W=8, dtype="bfloat16") -> dict:
    return dict(
        q=TensorSpec((T, Hq, D), dtype), k_prefix=TensorSpec((S, Hkv, D), dtype),
        v_prefix=TensorSpec((S, Hkv, D), dtype), k_pack=TensorSpec((T, Hkv, D), dtype),
        v_pack=TensorSpec((T, Hkv, D), dtype), bitmask=TensorSpec((T, W), "int32"),
        cu_seqlens=TensorSpec((B1,), "int32"), cu_prefix=TensorSpec((B1,), "int32"),
    )


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_output_has_query_shape_and_dtype_with_dynamic_tokens(dtype):
    out = describe_tree_attention(**node_inputs(dtype=dtype))
    assert out == TensorSpec((None, 32, 128), dtype)


def test_static_shapes_are_accepted():
    out = describe_tree_attention(**node_inputs(T=64, S=4096, B1=5))
    assert out.shape == (64, 32, 128)


def _change(inputs: dict, name: str, **fields) -> dict:
    spec = inputs[name]
    inputs[name] = TensorSpec(fields.get("shape", spec.shape), fields.get("dtype", spec.dtype))
    return inputs


@pytest.mark.parametrize("name,fields,message", [
    ("bitmask", dict(dtype="int64"), "bitmask must be int32"),
    ("cu_seqlens", dict(dtype="float32"), "cu_seqlens must be int32"),
    ("q", dict(dtype="float64"), "not supported"),
    ("v_pack", dict(dtype="float16"), "share one dtype"),
    ("bitmask", dict(shape=(None,)), "rank 2"),
    ("q", dict(shape=(None, 30, 128)), "multiple"),
    ("k_prefix", dict(shape=(None, 8, 64)), "k_prefix must be"),
    ("bitmask", dict(shape=(None, None)), "W must be static"),
    ("k_pack", dict(shape=(10, 8, 128)), "rows"),
    ("cu_prefix", dict(shape=(4,)), r"\[B\+1\]"),
])
def test_contract_violations_raise_value_error(name, fields, message):
    inputs = node_inputs(T=12, B1=3) if name in ("k_pack", "cu_prefix") else node_inputs()
    with pytest.raises(ValueError, match=message):
        describe_tree_attention(**_change(inputs, name, **fields))


def test_kernel_spec_takes_static_dims_and_scale_from_the_node():
    inputs = node_inputs(Hq=9, Hkv=3, D=64, W=2, dtype="float16")
    spec = kernel_spec(inputs["q"], inputs["k_pack"], inputs["bitmask"], scale=0.125)
    assert (spec.dtype, spec.num_q_heads, spec.num_kv_heads, spec.head_dim, spec.mask_words, spec.scale) == (
        "float16", 9, 3, 64, 2, 0.125)


def test_module_imports_and_says_what_is_missing_without_tensorrt():
    if trt_plugin.trt is not None:
        pytest.skip("TensorRT is installed here")
    assert "TensorRT is not importable" in trt_plugin.tensorrt_status()
    with pytest.raises(RuntimeError, match="tensorrt"):
        trt_plugin.register_plugin()
    assert trt_plugin.PLUGIN_ID == "cast::tree_attention"
