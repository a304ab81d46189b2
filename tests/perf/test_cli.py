from __future__ import annotations

import pytest
from click.testing import CliRunner

from perf.cli import bench, format_sweep, prepare_dataset, sweep_table
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
    result = CliRunner().invoke(bench, ["--dataset", str(data), "--methods", "ar,chain", "--drafter", str(missing)])
    assert result.exit_code != 0 and "no-such-head" in result.output
    assert "Traceback" not in result.output


def test_bench_rejects_relaxed_rules_at_temperature_zero(tmp_path):
    result = CliRunner().invoke(bench, ["--dataset", "gsm8k", "--relaxed", "cactus:0.5"])
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


def _shard(task_ids, ms_per_round, skip):
    """A one-domain sweep report (budgets [1]) whose requests take ms_per_round[label] per round."""
    methods = ["chain", "cast:1", "cast:auto"]
    runs = [{"label": m, "method": m.split(":")[0], "budget": None,
             "requests": [{"task_id": t, "output_length": 10, "num_rounds": 5, "mean_R": 2.0, "decode_ms": 5 * ms,
                           "sum_budget": 5, "drafted_rounds": 4, "ttft_ms": 1.0,
                           "time_split_ms": {"draft": ms, "verify": 3 * ms, "overhead": ms}} for t in task_ids]}
            for m, ms in ms_per_round.items()]
    settings = {"methods": methods, "budgets": [1], "temperature": 0.0, "num_prompts": len(task_ids),
                "skip_prompts": skip}
    domain = {"engine": {}, "machine": {}, "settings": settings, "runs": runs, "summary": []}
    return {"sweep": {"he": {}}, "domains": {"he": domain}}


def test_sweep_reports_merge_by_domain_and_pool_prompt_shards_of_one_domain():
    from perf.sweep_merge import merge_sweeps

    a = {"sweep": {"gsm8k": {"oracle_width": 3}}, "domains": {"gsm8k": {"summary": []}}}
    fast = _shard([0, 1], {"chain": 40.0, "cast:1": 20.0, "cast:auto": 20.0}, 0)
    slow = _shard([2, 3, 4], {"chain": 80.0, "cast:1": 60.0, "cast:auto": 50.0}, 2)
    merged = merge_sweeps([a, fast, slow])
    assert set(merged["sweep"]) == set(merged["domains"]) == {"gsm8k", "he"}
    rows = {r["method"]: r for r in merged["domains"]["he"]["summary"]}
    assert rows["cast:1"]["ms_per_token"] == pytest.approx((2 * 100 + 3 * 300) / 50)  # summed windows / tokens
    assert rows["cast:auto"]["drafted_share"] == pytest.approx(0.8) and rows["cast:1"]["verify_share"] == 0.6
    table = merged["sweep"]["he"]
    assert table["oracle_width"] == 1 and table["gap_pp"] == pytest.approx(
        100 * (rows["cast:auto"]["gain_over_chain"] - rows["cast:1"]["gain_over_chain"]))
    with pytest.raises(ValueError, match="more than one shard"):
        merge_sweeps([fast, fast])
    other = _shard([5], {"chain": 1.0, "cast:1": 1.0, "cast:auto": 1.0}, 5)
    other["domains"]["he"]["settings"]["budgets"] = [3]
    with pytest.raises(ValueError, match="shards differ"):
        merge_sweeps([fast, other])
