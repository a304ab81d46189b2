"""The backend benchmark runs end to end on a tiny target and writes its three reports."""

from __future__ import annotations

import json

import pytest

from perf.bench_backends import BACKENDS, Column, run, write_report
from tests.runtime.doubles import random_target

pytest.importorskip("onnxruntime")


def test_backend_bench_times_every_column_and_writes_json_table_and_plot(tmp_path):
    model = random_target(seed=1, vocab_size=64)
    columns = [Column(b, t) for t in (1, 2) for b in BACKENDS]
    samples = run(model, columns, widths=(1, 4), prefix=9, repeats=2, warmup=1, cache_dir=tmp_path / "onnx",
                  progress=False)
    assert {c.label for c in columns} == set(samples)
    assert all(len(v) == 2 and min(v) > 0 for by_n in samples.values() for v in by_n.values())
    report = write_report(samples, columns, tmp_path / "backends", {"target": "tiny", "prefix": 9, "repeats": 2})
    assert json.loads((tmp_path / "backends.json").read_text())["ms"]["ort-fp32 t2"]["4"]["median"] > 0
    assert report["machine"]["cpu_count"] >= 1 and report["machine"]["onnxruntime"]
    rows = [line for line in (tmp_path / "backends.md").read_text().splitlines() if line.startswith("| ")]
    assert [r.split(" | ")[0] for r in rows] == ["| n", "| 1", "| 4"] * 2  # median table, then p10
    assert all(r.endswith("x |") for r in rows if not r.startswith("| n"))
    assert (tmp_path / "backends.png").stat().st_size > 0
