from __future__ import annotations

import json

import pytest

from cast_trtllm.sampling import SamplingParams
from perf.datasets import Request
from perf.harness import MethodSpec, parse_methods, run_bench
from perf.report import build_report, format_table

SPECS = [MethodSpec("ar"), MethodSpec("chain"), MethodSpec("cast", 5)]


def test_methods_parse_with_fixed_and_auto_budgets():
    assert [s.label for s in parse_methods("ar, chain,cast:15,cast:auto")] == ["ar", "chain", "cast:15", "cast:auto"]
    assert parse_methods("cast") == [MethodSpec("cast", None, draft_gate=True)]
    assert [s.label for s in parse_methods("cast:auto-ungated")] == ["cast:auto-ungated"]
    for bad in ("cast:0", "tree", "chain:3", "ar,ar"):
        with pytest.raises(ValueError, match="--methods"):
            parse_methods(bad)


def test_method_order_rotates_from_prompt_to_prompt_so_no_method_always_runs_first(session):
    order = []

    def recording(ids, spec, max_new_tokens, sampling):
        order.append(spec.label)
        return session(ids, spec, max_new_tokens, sampling)

    requests = [Request(i, 4, input_ids=(1, 2, 3 + i)) for i in range(3)]
    run_bench(requests, SPECS, recording, session.encode, SamplingParams(0.0, seed=0), warmup=False, progress=False)
    assert order == ["ar", "chain", "cast:5", "chain", "cast:5", "ar", "cast:5", "ar", "chain"]


@pytest.fixture(scope="module")
def report(session):
    requests = [Request(0, 10, input_ids=(1, 2, 3, 4)), Request(1, 10, input_ids=(5, 6, 7))]
    bench = run_bench(requests, SPECS, session, session.encode, SamplingParams(0.0, seed=0), progress=False)
    return bench, build_report(bench, "tiny", [10, 10], session.engine, {"command": "test"})


def test_report_has_trtllm_bench_shape_per_method(report):
    _, rep = report
    assert {"engine", "machine", "dataset", "settings", "runs", "summary"} <= set(rep)
    assert rep["dataset"]["num_requests"] == 2 and rep["dataset"]["isl_stats"]["maximum"] == 4
    json.dumps(rep)  # serializable as is
    for block in rep["runs"]:
        assert {"request_info", "performance", "decoding_stats"} <= set(block)
        assert block["request_info"]["num_requests"] == 2
        perf = block["performance"]
        assert {"decode_ms_per_token", "decode_tokens_per_s", "avg_time_to_first_token_ms", "time_split_ms",
                "request_latency_percentiles_ms"} <= set(perf)
        al = block["decoding_stats"]["acceptance_length_percentiles"]
        assert set(al) == {"p50", "p90", "p95", "p99", "minimum", "maximum", "average"}
        hist = block["decoding_stats"]["acceptance_length_histogram"]
        assert sum(hist.values()) == block["decoding_stats"]["num_rounds"]


def test_greedy_methods_emit_identical_tokens_and_ratios_follow_ms_per_token(report):
    bench, rep = report
    tokens = {label: [r.result.token_ids for r in runs] for label, runs in bench.runs.items()}
    assert tokens["ar"] == tokens["chain"] == tokens["cast:5"]
    rows = {r["method"]: r for r in rep["summary"]}
    t = {m: rows[m]["ms_per_token"] for m in rows}
    assert rows["ar"]["mean_R"] == 1.0 and rows["ar"]["speedup_over_ar"] == pytest.approx(1.0)
    assert rows["cast:5"]["speedup_over_ar"] == pytest.approx(t["ar"] / t["cast:5"])
    assert rows["cast:5"]["gain_over_chain"] == pytest.approx(t["chain"] / t["cast:5"] - 1)
    assert 4.0 < rows["cast:5"]["mean_budget"] <= 5.0  # 5 a round, 0 in a last round with one token left
    table = format_table(rep["summary"])
    assert table.startswith("| method") and "| cast:5 |" in table


def test_decode_ms_per_token_is_the_ratio_of_summed_decode_windows_to_tokens(report):
    bench, rep = report
    runs = bench.runs["chain"]
    expected = sum(r.result.timings.decode_ms for r in runs) / sum(len(r.result.token_ids) for r in runs)
    block = next(b for b in rep["runs"] if b["label"] == "chain")
    assert block["performance"]["decode_ms_per_token"] == pytest.approx(expected)


def test_every_greedy_method_reports_how_many_requests_equal_ar(report):
    _, rep = report
    rows = {r["method"]: r for r in rep["summary"]}
    assert all(r["lossless"] and r["equal_to_ar"] == r["requests"] == 2 for r in rows.values())
    assert all(q["equal_to_ar"] for b in rep["runs"] for q in b["requests"])
    assert format_table(rep["summary"]).splitlines()[2].endswith("| 2/2 |")


def test_latency_page_renders_speedups_per_domain_and_the_reproduce_command(report, tmp_path):
    from perf.page import latency_page

    _, rep = report
    bench = {"mode": "latency", "command": "python -m perf.bench latency --dataset gsm8k", "peers": {},
             "peer_gaps": {"dflash": "not importable"}, "domains": {"gsm8k": rep, "mt_bench": rep}}
    text = latency_page(bench, str(tmp_path / "lat"))
    assert "## gsm8k" in text and "## mt_bench" in text and "| cast:5 |" in text
    assert "python -m perf.bench latency --dataset gsm8k" in text and "not run here" in text
    assert "| ar | 1.00x | 1.00x | 1.00x | 4/4 |" in text
    assert (tmp_path / "lat.png").is_file()


def test_a_sweep_page_renders_table_2_and_the_ceiling_of_this_machine(report, tmp_path):
    from perf.page import latency_page
    from perf.sweep import sweep_table

    _, rep = report
    sweep = {"mode": "sweep", "command": "python -m perf.bench sweep --dataset gsm8k --budgets 5",
             "sweep": {"gsm8k": sweep_table(rep["summary"], [5])}, "domains": {"gsm8k": rep}}
    text = latency_page(sweep, str(tmp_path / "s"))
    assert "| gsm8k |" in text and "What this machine allows" in text and sweep["command"] in text
    assert (tmp_path / "s_sweep.png").is_file() and (tmp_path / "s.png").is_file()
