"""TensorRT engines from the exported ONNX graphs (TensorRT >= 10.9).

UNVALIDATED: no machine of this project has had TensorRT. Everything this file consumes
is checked on CPU (the graphs in onnxruntime / onnx's reference evaluator, the profiles
in the manifest, the plugin's description and AOT PTX); this file only hands them to
TensorRT's ONNX parser and builder:

  * the verify engine parses `verify_plugin.onnx` (the `cast::tree_attention` node is
    resolved to the quickly-deployable plugin registered by `register_plugin`, AOT
    implementation) and gets ONE optimization profile per width bucket, in bucket order,
    so the runtime selects profile i for packs in bucket i;
  * the draft and context engines get one profile each;
  * networks are strongly typed: precision comes from the graph (exported in the SKU dtype).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

ENGINE_GRAPHS = {"verify_plugin": "verify", "draft": "draft", "context": "context"}


def build_engines(out: Path, manifest: dict[str, Any], progress: Callable[[str], None]) -> list[dict[str, Any]]:
    import tensorrt as trt

    from plugins.tree_attention.trt_plugin import register_plugin

    register_plugin()
    logger = trt.Logger(trt.Logger.WARNING)
    engines = []
    for graph, profile_key in ENGINE_GRAPHS.items():
        if graph not in manifest["graphs"]:
            continue
        onnx_path = out / manifest["graphs"][graph]["file"]
        builder = trt.Builder(logger)
        network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise RuntimeError(f"TensorRT could not parse {onnx_path.name}: {errors}")
        config = builder.create_builder_config()
        profiles = manifest["optimization_profiles"][profile_key]
        for record in profiles:
            profile = builder.create_optimization_profile()
            for name, shape in record["shapes"].items():
                profile.set_shape(name, shape["min"], shape["opt"], shape["max"])
            config.add_optimization_profile(profile)
        progress(f"building {graph} engine ({len(profiles)} optimization profiles)")
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise RuntimeError(f"TensorRT failed to build the {graph} engine (see the log above)")
        path = out / f"{profile_key}.engine"
        path.write_bytes(bytes(serialized))
        engines.append({"graph": graph, "file": path.name, "bytes": path.stat().st_size,
                        "profiles": [r.get("bucket") for r in profiles]})
    return engines
