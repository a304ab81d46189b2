"""The ONNX node the engine builder emits for the TensorRT tree-attention plugin."""
import pytest

onnx = pytest.importorskip("onnx")

from plugins import onnx_schema  # noqa: E402
from plugins.tree_attention import trt_plugin  # noqa: E402

NAMES = [name for name, _, _ in onnx_schema.INPUTS]


def model_with(node) -> "onnx.ModelProto":
    fp, i32 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT32
    shapes = dict(q=["T", 4, 16], k_prefix=["S", 2, 16], v_prefix=["S", 2, 16], k_pack=["T", 2, 16],
                  v_pack=["T", 2, 16], bitmask=["T", 1], cu_seqlens=["B1"], cu_prefix=["B1"])
    inputs = [onnx.helper.make_tensor_value_info(n, i32 if n in ("bitmask", "cu_seqlens", "cu_prefix") else fp,
                                                 shapes[n]) for n in NAMES]
    output = onnx.helper.make_tensor_value_info("out", fp, ["T", 4, 16])
    graph = onnx.helper.make_graph([node], "verify", inputs, [output])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17), onnx_schema.opset_import()])


def test_node_names_the_registered_trt_plugin():
    node = onnx_schema.make_node(NAMES, "out", scale=0.25, name="layer0.attn")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert (node.op_type, node.domain) == ("tree_attention", "cast")
    assert f"{attrs['plugin_namespace'].decode()}::{node.op_type}" == trt_plugin.PLUGIN_ID
    assert attrs == {"scale": 0.25, "plugin_namespace": b"cast", "plugin_version": b"1", "aot": 1}
    assert list(node.input) == NAMES and list(node.output) == ["out"]


def test_model_with_the_node_passes_the_onnx_checker():
    onnx_schema.register_onnx_schema()
    onnx_schema.register_onnx_schema()  # idempotent
    onnx.checker.check_model(model_with(onnx_schema.make_node(NAMES, "out", scale=0.25)), full_check=True)


def test_checker_rejects_a_node_without_scale():
    onnx_schema.register_onnx_schema()
    node = onnx.helper.make_node("tree_attention", NAMES, ["out"], domain="cast", plugin_namespace="cast")
    with pytest.raises(onnx.checker.ValidationError, match="scale"):
        onnx.checker.check_model(model_with(node))


@pytest.mark.parametrize("kwargs,message", [(dict(inputs=NAMES[:-1]), "8 inputs"), (dict(scale=0.0), "scale")])
def test_bad_node_arguments_raise_value_error(kwargs, message):
    args = dict(inputs=NAMES, output="out", scale=0.25) | kwargs
    with pytest.raises(ValueError, match=message):
        onnx_schema.make_node(**args)
