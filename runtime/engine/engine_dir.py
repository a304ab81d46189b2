"""A built engine directory (`cast-trtllm build --out DIR`) as what the runtime runs.

The builder writes, beside its TensorRT-facing graphs and `manifest.json`, the runtime's
own batched graphs into `DIR/onnxruntime/` (`runtime.backends.onnx_cache` layout: one
folder per target identity and per drafter identity) and names them in the manifest's
`runtime` record. `--engine DIR` runs those graphs (onnxruntime, fp32 on the CPU) and
never exports: a checkpoint whose identity the directory does not hold is refused with a
message saying how to rebuild. The first-use cache of a run without `--engine` is the same
layout under `$CAST_CACHE_DIR/onnx`: a build into the cache directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"
RUNTIME_FOLDER = "onnxruntime"


def runtime_record(graphs: Path, target_identity: str, drafter_identity: str | None) -> dict[str, Any]:
    """The manifest's `runtime` record for graphs exported under `graphs` (DIR/onnxruntime)."""
    return {"backend": "onnxruntime", "dtype": "float32", "folder": graphs.name,
            "target_graphs": target_identity, "drafter_graphs": drafter_identity}


def runtime_graphs(engine_dir: str | Path) -> tuple[Path, dict[str, Any]]:
    """(DIR/onnxruntime, the manifest) of a built engine directory; a clear error if it is not one."""
    engine_dir = Path(engine_dir)
    path = engine_dir / MANIFEST_NAME
    if not path.is_file():
        raise ValueError(f"--engine {engine_dir}: no {MANIFEST_NAME} there; build one with "
                         f"`cast-trtllm build --sku cpu --out {engine_dir}`")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"--engine {engine_dir}: {MANIFEST_NAME} is not JSON ({err}); rebuild the directory") from err
    record = manifest.get("runtime")
    if not isinstance(record, dict) or record.get("backend") != "onnxruntime":
        why = record.get("note") if isinstance(record, dict) else "it was built before the runtime graphs existed"
        raise ValueError(f"--engine {engine_dir}: the build has no runtime graphs ({why}); rebuild it with "
                         f"`cast-trtllm build --sku cpu --out {engine_dir}` (an fp32 SKU)")
    return engine_dir / record["folder"], manifest
