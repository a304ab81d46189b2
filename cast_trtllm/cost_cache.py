"""Where the online cost model's learned tables live: one file per machine, configuration and head."""

from __future__ import annotations

import os
from pathlib import Path


def cost_cache_key(device_name: str, backend: str, dtype: str, threads: int, target_name: str,
                   drafter: str) -> str:
    """One file name per machine, configuration and head, e.g.
    `cpu-amd-epyc__onnxruntime__float32__t2__smollm2-135m__head-1a2b3c4d` (`drafter`: the
    head's identity: another head accepts differently, so its draft costs and table differ)."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    parts = (device_name, backend, dtype, f"t{threads}", target_name, drafter)
    slugs = ["-".join("".join(c if c.isalnum() else " " for c in str(p).lower()).split()) for p in parts]
    if not all(slugs):
        raise ValueError(f"every cache key part needs a letter or digit, got {parts}")
    return "__".join(slugs)


def cache_root() -> Path:
    """The project's cache: `$CAST_CACHE_DIR`, else `~/.cache/cast-trtllm` (cost tables, execution
    choices, exported graphs each in a folder of their own)."""
    root = os.environ.get("CAST_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "cast-trtllm"


def default_cache_dir() -> Path:
    """Where learned tables live: `cache_root()/cost`."""
    return cache_root() / "cost"
