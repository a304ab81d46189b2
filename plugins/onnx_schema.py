"""ONNX custom-op schema of the tree-attention node that TensorRT maps to `cast::tree_attention`.

TensorRT's ONNX parser turns a node it has no built-in importer for into a plugin
looked up by op_type = plugin name, with the `plugin_namespace` and `plugin_version`
attributes; every other attribute is passed to the plugin as a field, and `aot = 1`
selects the ahead-of-time implementation. The node lives in the custom domain `cast`
(the verify graph's export, `runtime.model.graphs`, emits it), so the ONNX checker
accepts the model once `register_onnx_schema()` has run.
(Parser behaviour is from NVIDIA's docs and samples; not run here: no TensorRT.)

Inputs, in order (T packed tokens, S prefix tokens, B requests, see
`plugins.tree_attention.reference` for the full contract):
    q [T, Hq, D], k_prefix [S, Hkv, D], v_prefix [S, Hkv, D], k_pack [T, Hkv, D],
    v_pack [T, Hkv, D], bitmask int32 [T, W], cu_seqlens int32 [B+1], cu_prefix int32 [B+1]
Output: out [T, Hq, D], dtype of q.
"""
from __future__ import annotations

DOMAIN = "cast"
OP_TYPE = "tree_attention"
OPSET_VERSION = 1
PLUGIN_NAMESPACE = "cast"
PLUGIN_VERSION = "1"

FLOAT_TYPES = ("tensor(float)", "tensor(float16)", "tensor(bfloat16)")
# (name, ONNX type or "T" for the float type parameter, description)
INPUTS: tuple[tuple[str, str, str], ...] = (
    ("q", "T", "[T, Hq, D] packed queries"),
    ("k_prefix", "T", "[S, Hkv, D] cached prefix keys, ragged by cu_prefix"),
    ("v_prefix", "T", "[S, Hkv, D] cached prefix values"),
    ("k_pack", "T", "[T, Hkv, D] keys of the packed tokens"),
    ("v_pack", "T", "[T, Hkv, D] values of the packed tokens"),
    ("bitmask", "tensor(int32)", "[T, W] LSB-first ancestor bitmask rows"),
    ("cu_seqlens", "tensor(int32)", "[B+1] cumulative pack lengths"),
    ("cu_prefix", "tensor(int32)", "[B+1] cumulative prefix lengths"),
)
OUTPUTS: tuple[tuple[str, str, str], ...] = (("out", "T", "[T, Hq, D] attention output"),)
# (name, ONNX attribute type name, required)
ATTRIBUTES: tuple[tuple[str, str, bool], ...] = (
    ("scale", "FLOAT", True),
    ("plugin_namespace", "STRING", True),
    ("plugin_version", "STRING", False),
    ("aot", "INT", False),
)


def register_onnx_schema() -> None:
    """Register the op with onnx.defs so the checker validates nodes (idempotent)."""
    import onnx.defs as defs

    if defs.has(OP_TYPE, DOMAIN):
        return
    schema_type = defs.OpSchema.AttrType
    param = defs.OpSchema.FormalParameter
    defs.register_schema(
        defs.OpSchema(
            OP_TYPE, DOMAIN, OPSET_VERSION, __doc__ or "",
            inputs=[param(n, t, d) for n, t, d in INPUTS],
            outputs=[param(n, t, d) for n, t, d in OUTPUTS],
            type_constraints=[("T", list(FLOAT_TYPES), "q, k, v and out share one float type")],
            attributes=[
                defs.OpSchema.Attribute(n, getattr(schema_type, t), "", required=r) for n, t, r in ATTRIBUTES
            ],
        )
    )
