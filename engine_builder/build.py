"""Engine build for one GPU SKU: ONNX graphs, plugin PTX, build manifest, TensorRT engines.

    manifest = build("h200", "embedded", Path("build/"), drafter="default")

Writes into `out`: verify graphs (standard-ops flavour `verify_onnx.onnx`, which
onnxruntime runs; custom-node flavour `verify_plugin.onnx`, for TensorRT), the drafter's
`draft.onnx` + `context.onnx`, the AOT PTX of the tree-attention kernel for the SKU's
arch (`plugin/`), and `manifest.json` (SKU, buckets, one optimization profile per
bucket, files, versions, plugin archs). Engines are built only where TensorRT imports;
else `manifest["engines"]` is empty and `manifest["tensorrt"]` says why. The TensorRT-facing
graphs are single-request; the runtime's batched graphs (one pass over every request) go
to `onnxruntime/` for fp32 SKUs, and `--engine DIR` runs them (`runtime.engine.engine_dir`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import torch

from engine_builder import onnx_export as ox
from engine_builder.skus import SkuSpec, load_sku
from plugins.tree_attention.aot import AOT_ARCHS, compile_kernel
from plugins.tree_attention.kernel_spec import KernelSpec
from plugins.tree_attention.trt_plugin import tensorrt_status
from runtime.engine.engine_dir import MANIFEST_NAME
from runtime.model.llama import LlamaTarget

MANIFEST_VERSION = 1
VERIFY_FILES = {"onnx": "verify_onnx.onnx", "plugin": "verify_plugin.onnx"}


def plugin_ptx(spec: SkuSpec, target: LlamaTarget, words: int, out: Path) -> dict[str, Any]:
    """AOT PTX of the tree-attention kernel for the SKU's arch (the plugin's aot_impl
    recompiles on the build GPU; this copy documents and checks the binary ahead)."""
    record: dict[str, Any] = {"op": "cast::tree_attention", "aot_archs": list(AOT_ARCHS), "ptx": []}
    if spec.compute_capability is None:
        return {**record, "note": f"SKU {spec.name} has no compute capability: no GPU kernel"}
    arch = int(spec.compute_capability.replace(".", ""))
    if arch not in AOT_ARCHS:
        return {**record, "note": f"sm_{arch} is outside the AOT archs {list(AOT_ARCHS)}"}
    cfg = target.config
    kernel = KernelSpec(dtype=spec.dtype, num_q_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
                        head_dim=cfg.head_dim, mask_words=words)
    try:
        compiled = compile_kernel(kernel, arch=arch)
    except RuntimeError as err:  # no triton, or this process imported it in interpreter mode
        return {**record, "note": f"PTX not generated here: {err}"}
    path = out / "plugin" / f"tree_attention_sm{arch}.ptx"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(compiled.ptx)
    record["ptx"].append({"arch": arch, "file": str(path.relative_to(out)), "kernel": compiled.name,
                          "num_warps": compiled.num_warps, "shared_mem": compiled.shared_mem,
                          "block_m": compiled.block_m, "spec": dataclasses.asdict(kernel)})
    return record


def runtime_graphs(spec: SkuSpec, target: LlamaTarget, drafter, taps, out: Path,
                   progress: Callable[[str], None]) -> dict[str, Any]:
    """The graphs `--engine DIR` runs (`runtime.engine.engine_dir`): the runtime's own batched
    verify, draft and context graphs, exported into DIR/onnxruntime (fp32 SKUs: onnxruntime
    runs fp32 on the CPU)."""
    if spec.dtype != "float32":
        return {"backend": None, "note": f"SKU {spec.name} builds {spec.dtype}; the onnxruntime runtime runs fp32 "
                                         "(build --sku cpu for a directory --engine runs)"}
    from runtime.backends.onnx_cache import model_identity, verify_graph_path
    from runtime.backends.ort_drafter import drafter_graph_paths, drafter_identity
    from runtime.drafter.executor import bind_to_target
    from runtime.engine.engine_dir import RUNTIME_FOLDER, runtime_record

    folder = out / RUNTIME_FOLDER
    progress("exporting the runtime's batched graphs (what --engine runs)")
    verify_graph_path(target, taps, folder)
    bound = None if drafter is None else bind_to_target(drafter, target)[0]
    if bound is not None:
        drafter_graph_paths(bound, target, folder)
    return runtime_record(folder, model_identity(target, taps),
                          None if bound is None else f"drafter-{drafter_identity(bound, target)}")


def _versions() -> dict[str, str | None]:
    out = {}
    for package in ("cast-trtllm", "torch", "onnx", "onnxruntime", "triton", "tensorrt"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    return out


def build(sku: str, target_source: str, out: Path, drafter_source: str = "default", num_layers: int | None = None,
          flavours: tuple[str, ...] = tuple(VERIFY_FILES), progress: Callable[[str], None] = lambda msg: None,
          try_engines: bool = True) -> dict[str, Any]:
    """Export, write the manifest, and build engines if `try_engines` and TensorRT imports; returns the
    manifest (its "tensorrt" entry: what was built, or why the engines were not).

    sku: shipped SKU name or spec .yaml path; target_source / drafter_source: what `--target` /
    `--drafter` name to every command, loaded by the one loader (drafter "none": no draft graphs);
    num_layers: export only the first K >= 1 target layers (smoke builds); flavours: keys of VERIFY_FILES."""
    from runtime.loader import load_models

    spec = load_sku(sku)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    progress(f"loading target {target_source!r} and drafter {drafter_source!r} in {spec.dtype}")
    loaded = load_models(target_source, drafter_source, "cpu", getattr(torch, spec.dtype))
    target, target_name = loaded.target, loaded.name
    full_layers = target.config.num_layers
    drafter = loaded.drafter  # checked against the full target it was trained for
    drafter_dir = loaded.drafter_source
    if num_layers is not None and num_layers < full_layers:
        target = ox.truncate_target(target, num_layers)
        dropped = [i for i in (drafter.config.target_layer_ids if drafter else ()) if i >= num_layers]
        if dropped:
            raise ValueError(f"--num-layers {num_layers} drops target layers {dropped} that the drafter taps")
    cfg = target.config
    words = ox.mask_words(spec.packed_buckets[-1])
    prefix_max = min(spec.prefix_buckets[-1], cfg.context_window - spec.packed_buckets[-1])
    if prefix_max < 1:
        raise ValueError(f"the target's context window {cfg.context_window} cannot hold the largest bucket")
    prefix_opt = min(spec.prefix_buckets[0], prefix_max)
    taps = drafter.config.target_layer_ids if drafter is not None else ()

    graphs: dict[str, Any] = {}
    for flavour in flavours:
        progress(f"exporting the verify graph ({flavour} attention)")
        graphs[f"verify_{flavour}"] = ox.export_verify(target, out / VERIFY_FILES[flavour], flavour, words, taps)
    verify_profiles = ox.optimization_profiles(spec.packed_buckets, words, prefix_opt, prefix_max)
    any_verify = next(iter(graphs.values()))
    profiles = {"verify": [{**p, "shapes": ox.profile_shapes(p, any_verify["inputs"])} for p in verify_profiles]}
    if drafter is not None:
        progress("exporting the draft and context graphs")
        graphs["draft"] = ox.export_draft(drafter, target, out / "draft.onnx")
        graphs["context"] = ox.export_context(drafter, out / "context.onnx")
        block = drafter.config.block_size
        ranges = {"draft": {"context": {"min": 1, "opt": prefix_opt, "max": prefix_max}},
                  "context": {"m": {"min": 1, "opt": block, "max": prefix_max}}}
        profiles.update({name: [{**dims, "shapes": ox.profile_shapes(dims, graphs[name]["inputs"])}]
                         for name, dims in ranges.items()})
    runtime = (runtime_graphs(spec, target, drafter, taps, out, progress) if cfg.num_layers == full_layers else
               {"backend": None, "note": f"a smoke build of {cfg.num_layers} of {full_layers} layers runs nowhere"})
    progress("plugin: ahead-of-time PTX of the tree-attention kernel for the SKU arch")
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "sku": {k: getattr(spec, k) for k in ("name", "display_name", "compute_capability", "dtype",
                                              "packed_buckets", "prefix_buckets", "max_batch")},
        "target": {"source": target_source, "name": target_name, "exported_layers": cfg.num_layers,
                   "full_layers": full_layers, "truncated": cfg.num_layers < full_layers,
                   "config": dataclasses.asdict(cfg)},
        "drafter": None if drafter is None else {
            "path": str(drafter_dir), "block_size": drafter.config.block_size,
            "target_layer_ids": list(drafter.config.target_layer_ids), "layers": drafter.config.num_hidden_layers},
        "batch": 1,
        "mask_words": words,
        "kv_layout": "[layers, tokens, kv_heads, head_dim]",
        "graphs": graphs,
        "runtime": runtime,
        "optimization_profiles": profiles,
        "plugin": plugin_ptx(spec, target, words, out),
        "versions": _versions(),
        "engines": [],
    }
    status = tensorrt_status() if try_engines else "skipped (ONNX-only build)"
    if status is None and "verify_plugin" in graphs:
        progress("building TensorRT engines")
        manifest["engines"] = build_engines(out, manifest, progress)
        message = f"built {len(manifest['engines'])} TensorRT engines in {out}"
    elif status is None:
        message = "TensorRT engines need the plugin flavour of the verify graph (--flavour plugin or both)"
    elif spec.compute_capability is None:
        message = (f"no TensorRT engines: the TensorRT step is for GPU SKUs ({spec.name} has no GPU). Wrote "
                   f"{len(graphs)} ONNX graphs and {MANIFEST_NAME} to {out}; `--engine {out}` runs its graphs")
    else:
        message = (f"no TensorRT engines built: {status}. Wrote {len(graphs)} ONNX graphs and "
                   f"{MANIFEST_NAME} to {out}; build the engines from them on a machine with TensorRT")
    manifest["tensorrt"] = message
    (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


ENGINE_GRAPHS = {"verify_plugin": "verify", "draft": "draft", "context": "context"}  # graph -> engine / profiles


def build_engines(out: Path, manifest: dict[str, Any], progress: Callable[[str], None]) -> list[dict[str, Any]]:
    """TensorRT (>= 10.9) engines from the exported graphs. UNVALIDATED: no machine of this
    project has had TensorRT; what it consumes is checked on CPU (graphs in onnxruntime /
    onnx's reference evaluator, the manifest's profiles, the plugin's AOT PTX), and this only
    hands them to TensorRT's ONNX parser and builder. The verify engine parses
    `verify_plugin.onnx` (`cast::tree_attention` resolves to the plugin `register_plugin`
    registers) with ONE optimization profile per width bucket, in bucket order (the runtime
    selects profile i for packs in bucket i); draft and context get one each. Networks are
    strongly typed: precision comes from the graph (exported in the SKU dtype)."""
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
