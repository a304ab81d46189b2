from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from perf.cli import bench, prepare_dataset
from perf.sweep import format_sweep, sweep_table
from perf.datasets import default_data_dir, read_requests


@pytest.mark.skipif(default_data_dir() is None, reason="../shared/data is not present")
def test_prepare_dataset_writes_trtllm_bench_jsonl(tmp_path):
    out = tmp_path / "gsm8k.jsonl"
    result = CliRunner().invoke(prepare_dataset, ["gsm8k", "--out", str(out), "--num-prompts", "4",
                                                  "--output-tokens", "32"])
    assert result.exit_code == 0, result.output
    assert [r.output_tokens for r in read_requests(out)] == [32] * 4


def test_bench_with_a_missing_drafter_names_the_checkpoint(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"task_id": 0, "prompt": "hi", "output_tokens": 4}\n')
    missing = tmp_path / "no-such-head"
    result = CliRunner().invoke(bench, ["latency", "--dataset", str(data), "--methods", "ar,chain", "--drafter",
                                        str(missing)])
    assert result.exit_code != 0 and "no-such-head" in result.output
    assert "Traceback" not in result.output


def test_bench_rejects_relaxed_rules_at_temperature_zero(tmp_path):
    result = CliRunner().invoke(bench, ["latency", "--dataset", "gsm8k", "--relaxed", "cactus:0.5"])
    assert result.exit_code != 0 and "temperature" in result.output


def test_sweep_table_puts_the_oracle_next_to_the_predicted_width():
    summary = [{"method": "chain", "ms_per_token": 10.0, "gain_over_chain": 0.0, "mean_budget": 15.0},
               {"method": "cast:3", "ms_per_token": 9.0, "gain_over_chain": 10 / 9 - 1, "mean_budget": 3.0},
               {"method": "cast:7", "ms_per_token": 8.0, "gain_over_chain": 0.25, "mean_budget": 7.0},
               {"method": "cast:auto", "ms_per_token": 8.2, "gain_over_chain": 10 / 8.2 - 1, "mean_budget": 6.1}]
    summary.append({"method": "cast:auto-ungated", "ms_per_token": 8.6, "gain_over_chain": 10 / 8.6 - 1,
                    "mean_budget": 6.5, "drafted_share": 1.0})
    row = sweep_table(summary, [3, 7])
    assert row["oracle_width"] == 7 and row["predicted_width"] == 6.1
    assert row["gap_pp"] == pytest.approx(100 * (10 / 8.2 - 1 - 0.25))
    assert row["ungated_gap_pp"] == pytest.approx(100 * (10 / 8.6 - 1 - 0.25)) and row["ar_ms_per_token"] is None
    assert "| 6.1 |" in format_sweep({"x": row}) and "| 6.5 |" in format_sweep({"x": row})


def _timed(method, ms, R, verify, overhead):
    return {"method": method, "ms_per_token": ms, "mean_R": R, "verify_share": verify, "overhead_share": overhead}


def test_ceiling_is_ar_over_the_verify_time_per_token_of_the_best_fixed_n():
    """t_AR / (t(N) * verify share): what is left if drafting and host work were free."""
    from perf.sweep import ceiling_rows, ceiling_table

    summary = [_timed("ar", 30.0, 1.0, 0.98, 0.02), _timed("chain", 36.0, 2.0, 0.8, 0.04),
               _timed("cast:3", 25.0, 2.0, 0.6, 0.05), _timed("cast:15", 30.0, 2.8, 0.8, 0.04),
               _timed("cast:auto", 24.0, 2.1, 0.7, 0.05)]
    (row,) = ceiling_rows({"gsm8k": {"summary": summary}})
    assert row["best_N"] == 3 and row["per_N_draft_and_host_free"] == {3: 2.0, 15: 1.25}
    assert row["ceiling_draft_free"] == pytest.approx(30.0 / (25.0 * 0.65))
    assert row["measured_auto"] == pytest.approx(30.0 / 24.0)
    assert "| gsm8k | 30.0 | 3 | 2.00 | 2.00x |" in ceiling_table([row])


def test_prepare_dataset_writes_trtllm_bench_token_norm_dist_rows(tmp_path):
    out = tmp_path / "syn.jsonl"
    result = CliRunner().invoke(prepare_dataset, ["token-norm-dist", "--out", str(out), "--num-requests", "5",
                                                  "--input-mean", "12", "--input-stdev", "3", "--output-mean", "7",
                                                  "--output-stdev", "0", "--random-seed", "1"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_id"] for r in rows] == list(range(5)) and all(set(r) == {"task_id", "input_ids", "output_tokens"}
                                                               for r in rows)
    assert all(r["output_tokens"] == 7 and all(0 <= t < 49152 for t in r["input_ids"]) for r in rows)
    assert len({len(r["input_ids"]) for r in rows}) > 1  # lengths drawn, not fixed
    assert read_requests(out)[0].input_ids == tuple(rows[0]["input_ids"])  # the bench reads it back
