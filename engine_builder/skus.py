"""Per-GPU-SKU build specs (`engine_builder/skus/<name>.yaml`): buckets, dtype, batch, prefixes.

    spec = load_sku("h100-sxm")
    spec.packed_buckets   # (1, 16, 32, 48, 64, 96, 128): packed widths n = N + 1 to capture

A spec says what to compile or capture ahead; the width profile probed on that SKU says
which bucket a round should use.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import yaml

SKU_DIR = Path(__file__).parent / "skus"
DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True, slots=True)
class SkuSpec:
    name: str                          # file stem, e.g. "rtx-pro-6000-blackwell"
    display_name: str
    device_names: tuple[str, ...]      # substrings of the device name the probe reports
    compute_capability: str | None     # "9.0"; None for the CPU
    dtype: str
    packed_buckets: tuple[int, ...]    # packed widths n per request, ascending
    max_batch: int
    prefix_buckets: tuple[int, ...]    # KV-prefix lengths to probe/capture, ascending
    cuda_graphs: bool
    notes: str = ""

    def __post_init__(self) -> None:
        def require(ok: bool, key: str, expected: str) -> None:
            if not ok:
                raise ValueError(f"skus/{self.name}.yaml: {key}: {expected}, got {getattr(self, key)!r}")

        for key in ("display_name", "notes"):
            require(isinstance(getattr(self, key), str), key, "expected a string")
        require(bool(self.device_names) and all(isinstance(d, str) and d for d in self.device_names), "device_names",
                "expected a non-empty list of strings")
        require(self.compute_capability is None or isinstance(self.compute_capability, str), "compute_capability",
                'expected a quoted string like "9.0" or null')
        require(self.dtype in DTYPES, "dtype", f"expected one of {DTYPES}")
        for key in ("packed_buckets", "prefix_buckets"):
            v = getattr(self, key)
            require(bool(v) and all(type(x) is int for x in v) and v[0] >= 1 and all(b > a for a, b in zip(v, v[1:])),
                    key, "expected strictly ascending integers >= 1")
        require(type(self.max_batch) is int and self.max_batch >= 1, "max_batch", "expected an integer >= 1")
        require(isinstance(self.cuda_graphs, bool), "cuda_graphs", "expected true or false")
        require(not self.cuda_graphs or self.compute_capability is not None, "cuda_graphs",
                "a SKU without a compute_capability (CPU) cannot capture CUDA graphs")


def list_skus() -> list[str]:
    """Names of the shipped SKU specs, sorted."""
    return sorted(p.stem for p in SKU_DIR.glob("*.yaml"))


def load_sku(name_or_path: str | Path) -> SkuSpec:
    """A shipped spec by name (`"h100-sxm"`) or any spec file by path."""
    path = Path(name_or_path)
    if path.suffix != ".yaml":
        path = SKU_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            raise ValueError(f"unknown SKU {name_or_path!r}; shipped: {', '.join(list_skus())}")
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a YAML mapping")
    allowed = {f.name for f in fields(SkuSpec)} - {"name"}
    required = allowed - {"notes"}
    if set(data) - allowed or required - set(data):
        raise ValueError(f"{path}: unknown keys {sorted(set(data) - allowed)}, "
                         f"missing keys {sorted(required - set(data))}")
    for key in ("device_names", "packed_buckets", "prefix_buckets"):
        if isinstance(data[key], list):
            data[key] = tuple(data[key])
    return SkuSpec(name=path.stem, **data)


def sku_for_device(device_name: str) -> SkuSpec | None:
    """The shipped spec whose longest `device_names` entry occurs in `device_name`."""
    best, best_len = None, 0
    for name in list_skus():
        spec = load_sku(name)
        for pattern in spec.device_names:
            if pattern.lower() in device_name.lower() and len(pattern) > best_len:
                best, best_len = spec, len(pattern)
    return best
