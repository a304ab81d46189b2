"""Execution variants of a bench session: other dtypes / thread counts run side by side,
label themselves, and (fp32) decode exactly what the default engine decodes."""

from __future__ import annotations

import pytest

from cast_trtllm.sampling import SamplingParams
from perf.harness import MethodSpec, parse_methods

from .conftest import tiny_session


def test_variant_labels_parse_and_bad_ones_are_refused():
    specs = parse_methods("ar,ar@bf16,ar@fp32-t2,cast:5@fp32,cast:auto@bf16-t1")
    assert [s.label for s in specs] == ["ar", "ar@bf16", "ar@fp32-t2", "cast:5@fp32", "cast:auto@bf16-t1"]
    for bad in ("ar@fp16", "ar@bf16-t0", "cast:5@"):
        with pytest.raises(ValueError):
            parse_methods(bad)


def test_an_fp32_variant_with_two_threads_decodes_what_the_default_engine_decodes(tmp_path, monkeypatch):
    monkeypatch.setenv("CAST_CACHE_DIR", str(tmp_path))
    session = tiny_session()
    greedy = SamplingParams(0.0)
    for method in ("ar", "cast:5"):
        base, variant = parse_methods(f"{method},{method}@fp32-t2")
        want, _ = session([1, 2, 3, 4], base, 12, greedy)
        got, _ = session([1, 2, 3, 4], variant, 12, greedy)
        assert got.token_ids == want.token_ids
    assert session.engine["variants"] == {"fp32-t2": "torch float32, 2 thread(s)"}


def test_a_bf16_variant_runs_on_a_bf16_copy_and_leaves_the_default_engine_in_fp32(tmp_path, monkeypatch):
    monkeypatch.setenv("CAST_CACHE_DIR", str(tmp_path))
    session = tiny_session()
    out, _ = session([5, 6], MethodSpec("cast", 5, variant="bf16"), 8, SamplingParams(0.0))
    assert len(out.token_ids) == 8
    assert session.variants["bf16"].engine.target.dtype.is_floating_point
    assert str(session.variants["bf16"].engine.target.dtype) == "torch.bfloat16"
    assert str(session.built.engine.target.dtype) == "torch.float32"
