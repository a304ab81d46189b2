"""Width profiles: the measured verify-cost table of one deployment, as versioned JSON.

A profile belongs to one GPU SKU x target x dtype. `latency_ms[prefix][batch][i]` is the
median verify-forward latency of `batch` requests over a `prefix`-token KV cache, each
packing `packed_counts[i]` tokens (pending root + tree nodes). Derived fields (affine fit
per row over `fit_range`, detected cliffs, chosen buckets) are stored so a reader sees what
the width policy will see. JSON keys for prefix and batch are decimal strings. The format
knows nothing of width rules or policies (`cast_trtllm.width` reads it); it is also where
the shipped profiles are found (`reference_profiles`, `find_measured_profile`).

Errors name the offending field as a JSON path, e.g.
`profile.latency_ms["1024"]["1"]: expected 8 values (one per packed count), got 7`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from cast_trtllm.cost_curve import choose_buckets, detect_cliffs, fit_affine
from cast_trtllm.json_fields import ascending_ints, fields_of, int_keyed, milliseconds, milliseconds_list

SCHEMA_VERSION = 1
REFERENCE_DIR = Path(__file__).parent / "profiles" / "reference"
MEASURED_DIR = Path(__file__).parent / "profiles" / "measured"


@dataclass(frozen=True, slots=True)
class Provenance:
    source: str                       # "measured" or "reference: CAST paper Table 5"
    date: str | None = None           # ISO date of the measurement (required if measured)
    torch_version: str | None = None
    transformers_version: str | None = None
    host: str | None = None
    notes: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not (
                self.source == "measured" or self.source.startswith("reference")):
            raise ValueError(f'profile.provenance.source: expected "measured" or '
                             f'"reference: ...", got {self.source!r}')
        if self.source == "measured" and not self.date:
            raise ValueError("profile.provenance.date: required for a measured profile")


@dataclass(frozen=True, slots=True)
class AffineFit:
    intercept_ms: float  # c0
    slope_ms: float      # c1, ms per packed token (per request)


@dataclass(frozen=True, slots=True)
class WidthProfile:
    sku: str
    device: str                                       # device name as the probe saw it
    target: str
    dtype: str
    prefix_lengths: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    packed_counts: tuple[int, ...]                    # n = N + 1
    latency_ms: dict[int, dict[int, tuple[float, ...]]]  # [prefix][batch] -> [len(n)]
    buckets: tuple[int, ...]                          # subset of packed_counts
    fit_range: tuple[int, int]
    fits: dict[int, dict[int, AffineFit]]             # [prefix][batch]
    cliffs: dict[int, dict[int, tuple[int, ...]]]     # [prefix][batch] -> n landed on
    provenance: Provenance
    drafter_ms: dict[int, float] = field(default_factory=dict)   # [batch], width-independent
    overhead_ms: dict[int, float] = field(default_factory=dict)  # [batch], host work per round
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(f"profile.schema_version: this build reads version "
                             f"{SCHEMA_VERSION}, got {self.schema_version}")
        for name in ("sku", "device", "target", "dtype"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"profile.{name}: expected a non-empty string")
        for name in ("prefix_lengths", "batch_sizes", "packed_counts", "buckets"):
            object.__setattr__(self, name, ascending_ints(getattr(self, name), f"profile.{name}"))
        n = self.packed_counts
        if not set(self.buckets) <= set(n):
            raise ValueError(f"profile.buckets: {sorted(set(self.buckets) - set(n))} are not "
                             f"measured packed counts {list(n)}")
        if not (isinstance(self.fit_range, (list, tuple)) and len(self.fit_range) == 2):
            raise ValueError(f"profile.fit_range: expected [lo, hi], got {self.fit_range!r}")
        lo, hi = self.fit_range
        if not (lo < hi and sum(lo <= v <= hi for v in n) >= 2):
            raise ValueError(f"profile.fit_range: [{lo}, {hi}] must hold >= 2 packed counts "
                             f"of {list(n)}")
        object.__setattr__(self, "fit_range", (int(lo), int(hi)))
        object.__setattr__(self, "latency_ms", self._grid("latency_ms", self._check_row))
        object.__setattr__(self, "fits", self._grid("fits", self._check_fit))
        object.__setattr__(self, "cliffs", self._grid("cliffs", self._check_cliffs))
        for name in ("drafter_ms", "overhead_ms"):
            per_batch = getattr(self, name)
            if not set(per_batch) <= set(self.batch_sizes):
                raise ValueError(f"profile.{name}: batch sizes {sorted(per_batch)} must be a "
                                 f"subset of profile.batch_sizes {list(self.batch_sizes)}")
            for b, v in per_batch.items():
                milliseconds(v, f'profile.{name}["{b}"]', positive=False)

    # -- lookups -------------------------------------------------------------------------
    def prefix_bucket(self, prefix_len: int) -> int:
        """Smallest measured prefix >= prefix_len (cost grows with prefix), else the largest."""
        i = int(np.searchsorted(self.prefix_lengths, prefix_len))
        return self.prefix_lengths[min(i, len(self.prefix_lengths) - 1)]

    def fixed_ms(self, batch: int) -> float:
        """Width-independent ms per round (drafter + overhead), linear in batch between keys."""
        return sum(float(np.interp(batch, sorted(d), [d[k] for k in sorted(d)]))
                   for d in (self.drafter_ms, self.overhead_ms) if d)

    # -- JSON ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for name in ("latency_ms", "fits", "cliffs"):
            out[name] = {str(p): {str(b): v for b, v in row.items()}
                         for p, row in out[name].items()}
        for name in ("drafter_ms", "overhead_ms"):
            out[name] = {str(b): v for b, v in out[name].items()}
        return {"schema_version": out.pop("schema_version"), **out}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WidthProfile:
        """Parse and validate a JSON object; ValueError names the field that is wrong."""
        kw = dict(fields_of(data, "profile", {f.name for f in fields(cls)}, {"drafter_ms", "overhead_ms"}))
        names = {f.name for f in fields(Provenance)}
        kw["provenance"] = Provenance(**fields_of(data["provenance"], "profile.provenance", names, names - {"source"}))
        for name in ("latency_ms", "fits", "cliffs"):
            kw[name] = {p: int_keyed(row, f'profile.{name}["{p}"]')
                        for p, row in int_keyed(data[name], f"profile.{name}").items()}
        fit = {"intercept_ms", "slope_ms"}
        kw["fits"] = {p: {b: AffineFit(**fields_of(v, f'profile.fits["{p}"]["{b}"]', fit)) for b, v in row.items()}
                      for p, row in kw["fits"].items()}
        for name in ("drafter_ms", "overhead_ms"):
            kw[name] = int_keyed(data.get(name) or {}, f"profile.{name}")
        return cls(**kw)

    # -- validation helpers --------------------------------------------------------------
    def _grid(self, name: str, check) -> dict:
        grid = getattr(self, name)
        if not isinstance(grid, dict) or sorted(grid) != list(self.prefix_lengths):
            got = sorted(grid) if isinstance(grid, dict) else grid
            raise ValueError(f"profile.{name}: expected one entry per prefix length "
                             f"{list(self.prefix_lengths)}, got {got}")
        out = {}
        for p in self.prefix_lengths:
            row = grid[p]
            if not isinstance(row, dict) or sorted(row) != list(self.batch_sizes):
                got = sorted(row) if isinstance(row, dict) else row
                raise ValueError(f'profile.{name}["{p}"]: expected one entry per batch size '
                                 f"{list(self.batch_sizes)}, got {got}")
            out[p] = {b: check(row[b], f'profile.{name}["{p}"]["{b}"]') for b in self.batch_sizes}
        return out

    def _check_row(self, row, path: str) -> tuple[float, ...]:
        return milliseconds_list(row, path, "a latency in ms", "packed count", self.packed_counts)

    def _check_fit(self, fit, path: str) -> AffineFit:
        if not isinstance(fit, AffineFit) or not all(
                math.isfinite(v) for v in (fit.intercept_ms, fit.slope_ms)):
            raise ValueError(f"{path}: expected finite intercept_ms and slope_ms, got {fit!r}")
        return fit

    def _check_cliffs(self, cliffs, path: str) -> tuple[int, ...]:
        if not isinstance(cliffs, (list, tuple)) or not set(cliffs) <= set(self.packed_counts):
            raise ValueError(f"{path}: expected a list of measured packed counts, got {cliffs!r}")
        return tuple(int(c) for c in cliffs)


def build_profile(*, sku: str, device: str, target: str, dtype: str,
                  packed_counts: list[int], latency_ms: dict[int, dict[int, list[float]]],
                  provenance: Provenance, fit_range: tuple[int, int] | None = None,
                  buckets: list[int] | None = None, max_buckets: int = 8,
                  drafter_ms: dict[int, float] | None = None,
                  overhead_ms: dict[int, float] | None = None) -> WidthProfile:
    """A profile from a measured table: fits each row, detects cliffs, chooses buckets.

    fit_range defaults to [smallest count >= 2, largest] (n = 1 runs the decode kernels);
    buckets default to `choose_buckets` on the first (prefix, batch) row.
    """
    n = np.asarray(packed_counts)
    if fit_range is None:
        multi = n[n >= 2]
        fit_range = (int(multi[0]), int(n[-1])) if len(multi) >= 2 else (int(n[0]), int(n[-1]))
    fits, cliffs = {}, {}
    for p, row in latency_ms.items():
        fits[p], cliffs[p] = {}, {}
        for b, ms in row.items():
            c0, c1 = fit_affine(n, ms, *fit_range)
            fits[p][b] = AffineFit(round(c0, 6), round(c1, 6))
            cliffs[p][b] = tuple(detect_cliffs(n, ms))
    if buckets is None:
        first = latency_ms[min(latency_ms)]
        buckets = choose_buckets(n, first[min(first)], max_buckets)
    return WidthProfile(
        sku=sku, device=device, target=target, dtype=dtype,
        prefix_lengths=tuple(sorted(latency_ms)),
        batch_sizes=tuple(sorted(next(iter(latency_ms.values())))),
        packed_counts=tuple(packed_counts), latency_ms=latency_ms, buckets=tuple(buckets),
        fit_range=fit_range, fits=fits, cliffs=cliffs, provenance=provenance,
        drafter_ms=dict(drafter_ms or {}), overhead_ms=dict(overhead_ms or {}))


def load_profile(path: str | Path) -> WidthProfile:
    with open(path) as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from err
    try:
        return WidthProfile.from_dict(data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err


def save_profile(profile: WidthProfile, path: str | Path) -> None:
    text = json.dumps(profile.to_dict(), indent=2)
    # keep number lists (latency rows, counts) on one line
    text = re.sub(r"\[\s+([-+\d.eE,\s]*?)\s+\]",
                  lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
    Path(path).write_text(text + "\n")


def reference_profiles() -> list[Path]:
    """The shipped reference profiles (paper tables), sorted by file name."""
    return sorted(REFERENCE_DIR.glob("*.json"))


def find_measured_profile(target: str, dtype: str, device_kind: str, device: str | None = None) -> Path | None:
    """The shipped probe-measured profile for (target, dtype, cpu|cuda), if there is one.

    Only probe output (provenance.source == "measured") qualifies; reference tables of the
    paper never stand in for the deployed engine. Where several match, the one measured
    on `device` (the probe's device name, e.g. "cpu (Intel(R) Xeon(R) Processor)") wins;
    otherwise the first by file name.
    """
    matches = []
    for path in sorted(MEASURED_DIR.glob("*.json")):
        profile = load_profile(path)
        on_cpu = profile.sku == "cpu"
        if (profile.target == target and profile.dtype == dtype and on_cpu == (device_kind == "cpu")
                and profile.provenance.source == "measured"):
            matches.append((profile.device == device, path))
    exact = [path for same, path in matches if same]
    return (exact or [path for _, path in matches] or [None])[0]
