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
    opsets = [onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid(onnx_schema.DOMAIN, onnx_schema.OPSET_VERSION)]
    return onnx.helper.make_model(graph, opset_imports=opsets)


def plugin_node(**attrs) -> "onnx.NodeProto":
    """The node as the verify export (`runtime.model.graphs`) emits it, `attrs` overriding."""
    attrs = dict(scale=0.25, plugin_namespace=onnx_schema.PLUGIN_NAMESPACE,
                 plugin_version=onnx_schema.PLUGIN_VERSION, aot=1) | attrs
    attrs = {k: v for k, v in attrs.items() if v is not None}
    return onnx.helper.make_node(onnx_schema.OP_TYPE, NAMES, ["out"], domain=onnx_schema.DOMAIN, **attrs)


def test_node_names_the_registered_trt_plugin():
    assert f"{onnx_schema.PLUGIN_NAMESPACE}::{onnx_schema.OP_TYPE}" == trt_plugin.PLUGIN_ID == "cast::tree_attention"


def test_model_with_the_node_passes_the_onnx_checker():
    onnx_schema.register_onnx_schema()
    onnx_schema.register_onnx_schema()  # idempotent
    onnx.checker.check_model(model_with(plugin_node()), full_check=True)


def test_checker_rejects_a_node_without_scale():
    onnx_schema.register_onnx_schema()
    with pytest.raises(onnx.checker.ValidationError, match="scale"):
        onnx.checker.check_model(model_with(plugin_node(scale=None)))
