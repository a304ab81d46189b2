from __future__ import annotations

import pytest

from cast_trtllm.sampling import SamplingParams
from perf.datasets import Request
from perf.harness import MethodSpec, run_bench
from perf.relaxed_eval import RelaxedEngine, parse_relaxed, relaxed_block
from perf.report import build_report

from .conftest import tiny_session


def test_relaxed_rule_parsing_requires_name_and_alpha():
    assert parse_relaxed("ensemble:0.5").alpha == 0.5
    for bad in ("ensemble", "nope:1", "cactus:x"):
        with pytest.raises(ValueError, match="--relaxed"):
            parse_relaxed(bad)


def test_relaxed_twin_reports_tv_length_change_and_eq4_proxy():
    session = tiny_session(RelaxedEngine)
    lossless = MethodSpec("cast", 5)
    exact = MethodSpec("cast", 5, parse_relaxed("ensemble:0"))  # pi = p: a lossless rule in disguise
    lossy = MethodSpec("cast", 5, parse_relaxed("ensemble:0.9"))
    requests = [Request(0, 12, input_ids=(1, 2, 3)), Request(1, 12, input_ids=(4, 5))]
    bench = run_bench(requests, [lossless, exact, lossy], session, session.encode,
                      SamplingParams(1.0, seed=0), progress=False)
    assert all(r.step_tvs is None for r in bench.runs["cast:5"])
    exact_tvs = [tv for r in bench.runs[exact.label] for tv in r.step_tvs]
    lossy_tvs = [tv for r in bench.runs[lossy.label] for tv in r.step_tvs]
    assert exact_tvs and max(exact_tvs) < 1e-9
    assert max(lossy_tvs) > 1e-3
    rep = build_report(bench, "tiny", [12, 12], session.engine, {})
    blocks = {b["label"]: b for b in rep["runs"]}
    out = relaxed_block(lossy.label, lossy.relaxed, blocks[lossy.label], blocks["cast:5"], lossy_tvs)
    assert out["rule"]["lossy"] is True and out["mean_step_tv"] > 0
    assert {"response_length_change", "eq4_speedup_proxy", "lossless_eq4_speedup_proxy", "mean_R"} <= set(out)
