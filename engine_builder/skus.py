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
        where = f"skus/{self.name}.yaml"
        for name in ("display_name", "notes"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{where}: {name}: expected a string")
        if not self.device_names or not all(isinstance(d, str) and d for d in self.device_names):
            raise ValueError(f"{where}: device_names: expected a non-empty list of strings")
        if self.compute_capability is not None and not isinstance(self.compute_capability, str):
            raise ValueError(f'{where}: compute_capability: expected a quoted string like "9.0" '
                             f"or null, got {self.compute_capability!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"{where}: dtype: expected one of {DTYPES}, got {self.dtype!r}")
        for name in ("packed_buckets", "prefix_buckets"):
            values = getattr(self, name)
            if not values or any(isinstance(v, bool) or not isinstance(v, int) for v in values) \
                    or values[0] < 1 or any(b <= a for a, b in zip(values, values[1:])):
                raise ValueError(f"{where}: {name}: expected strictly ascending integers >= 1, "
                                 f"got {list(values)}")
        if type(self.max_batch) is not int or self.max_batch < 1:
            raise ValueError(f"{where}: max_batch: expected an integer >= 1, "
                             f"got {self.max_batch!r}")
        if not isinstance(self.cuda_graphs, bool):
            raise ValueError(f"{where}: cuda_graphs: expected true or false, "
                             f"got {self.cuda_graphs!r}")
        if self.cuda_graphs and self.compute_capability is None:
            raise ValueError(f"{where}: cuda_graphs: a SKU without a compute_capability (CPU) "
                             "cannot capture CUDA graphs")


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
