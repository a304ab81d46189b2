from __future__ import annotations

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
