"""`python -m perf.bench` end to end on the embedded model, tiny shapes: 2 prompts, 8 tokens."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from perf.bench import bench

PROMPTS = ("What is 12 times 7?", "Write a Python function that reverses a string.")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "tiny.jsonl"
    path.write_text("".join(json.dumps({"task_id": i, "prompt": p, "output_tokens": 8}) + "\n"
                            for i, p in enumerate(PROMPTS)))
    return path


def _run(args: list[str], out) -> dict:
    # fp32: these tests assert token equality with AR, which only fp32 promises; a machine's cached
    # `--dtype auto` pick (bf16 where it measured fastest) must not decide what they test
    result = CliRunner().invoke(bench, [*args, "--dtype", "float32", "--no-progress", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["command"].startswith(f"python -m perf.bench {args[0]} ") and "--dataset" in report["command"]
    assert out.with_suffix(".md").read_text().count(report["command"]) == 1
    assert out.with_suffix(".png").is_file()
    return report


def test_throughput_at_concurrency_1_and_2_equals_ar_for_every_method(dataset, tmp_path):
    report = _run(["throughput", "--dataset", str(dataset), "--concurrency", "1,2", "--methods", "ar,chain,cast:auto",
                   "--report_json", str(tmp_path / "r.json")], tmp_path / "t")
    assert {"cpu_model", "cpu_count", "torch_threads"} <= set(report["machine"])
    rows = report["domains"]["tiny"]
    methods = ("ar", "chain", "cast:auto")
    assert [(r["concurrency"], r["method"]) for r in rows] == [(c, m) for c in (1, 2) for m in methods]
    assert all(r["equal_to_ar"] == r["requests"] == 2 and r["tokens"] == 16 and r["tokens_per_s"] > 0 for r in rows)
    assert not any("_records" in r for r in rows)
    _check_trtllm_bench_report(json.loads((tmp_path / "r.json").read_text()))


def _check_trtllm_bench_report(r: dict) -> None:
    """trtllm-bench's report keys, the top level being the last method at the highest concurrency."""
    assert {"engine", "world_info", "request_info", "performance", "streaming_metrics", "decoding_stats",
            "dataset", "runs"} <= set(r)
    assert r["engine"]["method"] == "cast:auto" and r["world_info"]["max_batch_size"] == 2 and len(r["runs"]) == 6
    perf = r["performance"]
    assert {"request_throughput_req_s", "system_output_throughput_tok_s", "output_throughput_per_user_tok_s",
            "total_latency_ms", "request_latency_percentiles_ms"} <= set(perf) and perf["request_throughput_req_s"] > 0
    stream = r["streaming_metrics"]
    assert {"avg_ttft_ms", "avg_tpot_ms", "ttft_percentiles", "tpot_percentiles", "token_output_speed_tok_s"} <= set(stream)
    assert set(stream["tpot_percentiles"]) == {"minimum", "maximum", "average", "p50", "p90", "p95", "p99"}
    decoding = r["decoding_stats"]
    assert {"num_draft_tokens_percentiles", "num_accepted_draft_tokens_percentiles", "acceptance_length_percentiles",
            "draft_acceptance_rate_percentiles"} <= set(decoding)
    assert "positions, not nodes" in decoding["definition"]
    ar = [run for run in r["runs"] if run["engine"]["method"] == "ar"]
    assert ar and all("decoding_stats" not in run for run in ar)  # AR drafts nothing, as trtllm-bench omits it
    chain = [run["decoding_stats"] for run in r["runs"] if run["engine"]["method"] == "chain"]
    for d in chain:  # a chain's rate is trtllm-bench's accepted / draft tokens: it drafts its positions, L a round
        assert d["draft_acceptance_rate_percentiles"] == d["node_acceptance_rate_percentiles"]  # or max_tokens' room


@pytest.mark.slow
def test_latency_runs_the_engine_and_the_peers_side_by_side_and_lossless_rows_equal_ar(dataset, tmp_path):
    """hf always runs; dflash runs where z-lab's package is importable, else its gap is reported."""
    report = _run(["latency", "--dataset", str(dataset), "--methods", "ar,chain,cast:auto,hf,dflash"], tmp_path / "l")
    domain = report["domains"]["tiny"]
    assert {"cpu_model", "cpu_count", "torch_threads"} <= set(domain["machine"])
    rows = {r["method"]: r for r in domain["summary"]}
    ran = {"ar", "chain", "cast:auto", "hf"} | ({"dflash"} - set(report["peer_gaps"]))
    assert set(rows) == ran and set(report["peers"]) == ran & {"hf", "dflash"}
    assert all(r["lossless"] and r["equal_to_ar"] == r["requests"] == 2 for r in rows.values())
    assert all(r["speedup_over_ar"] > 0 and r["ms_per_token"] > 0 for r in rows.values())


def test_repeats_rotate_the_method_order_and_each_cell_reports_its_median_run():
    from perf.harness import MethodSpec
    from perf.throughput import sweep_cells

    methods, calls = [MethodSpec("ar"), MethodSpec("chain"), MethodSpec("cast", 3)], []

    def measure(c, m):
        calls.append((c, m.label))
        k = sum(1 for x in calls if x == (c, m.label))  # run k of this cell
        return {"concurrency": c, "method": m.label, "tokens_per_s": {1: 10.0, 2: 30.0, 3: 20.0}[k],
                "equal_to_ar": 3 if k == 2 else 4, "requests": 4}

    rows = sweep_cells([1, 4], methods, 3, measure, progress=False)
    assert [label for c, label in calls[:9]] == ["ar", "chain", "cast:3", "chain", "cast:3", "ar",
                                                 "cast:3", "ar", "chain"]
    assert [(r["concurrency"], r["method"]) for r in rows] == [(c, m.label) for c in (1, 4) for m in methods]
    assert all(r["tokens_per_s"] == 20.0 and r["runs_tokens_per_s"] == [10.0, 30.0, 20.0] for r in rows)
    assert all(r["equal_to_ar"] == 3 for r in rows)  # the fewest of its runs: one run that differs shows


def test_a_request_near_max_tokens_drafts_fewer_positions_and_the_rate_counts_them():
    from perf.trtllm_report import RequestRecord, decoding_stats, drafted_positions

    # 12 tokens: the prefill's 1, then rounds committing 4, 4, 2, 1 (the last one with 1 left: not drafted)
    r = RequestRecord(5, 12, 0.0, 0.1, 1.0, [4, 4, 2, 1], [8, 6, 2, 0], [True, True, True, False], 12)
    assert drafted_positions(r, 8) == 8 + 6 + 2  # room 11, 7, 3 before the drafted rounds: min(8, room - 1)
    assert drafted_positions(RequestRecord(5, 12, 0.0, 0.1, 1.0, [4, 4, 2, 1], [8, 6, 2, 0],
                                           [True, True, True, False]), 8) == 3 * 8  # no cap known: L a round
    chain = decoding_stats([r], "chain", 8)  # a chain verifies those positions: its rates are one
    assert chain["draft_acceptance_rate_percentiles"]["average"] == pytest.approx(7 / 16)
    assert chain["node_acceptance_rate_percentiles"] == chain["draft_acceptance_rate_percentiles"]
