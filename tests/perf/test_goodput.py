"""`perf.bench throughput` in process on a tiny random target + drafter (goodput, mean R and N,
the App. F best-first baseline), and through `serve --api openai` on the embedded model."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from perf.bench import bench
from perf.harness import parse_methods
from perf.throughput import run

from .conftest import tiny_session

METHODS = parse_methods("ar,chain,cast:12,cast:3,best-first:3")


@pytest.fixture(scope="module")
def rows():
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, 64, size=int(rng.integers(2, 20))).tolist() for _ in range(5)]
    return run(tiny_session().built.engine, prompts, 10, METHODS, [1, 3], progress=False)


def test_one_row_per_concurrency_and_method_with_goodput_and_round_figures(rows):
    assert [(r["concurrency"], r["method"]) for r in rows] == [(c, m.label) for c in (1, 3) for m in METHODS]
    for r in rows:
        assert r["tokens"] == 5 * 10 and r["decode_tokens_per_s"] > 0 and r["tokens_per_s"] > 0
        assert r["mean_R"] >= 1 and r["rounds"] > 0


def test_every_method_outputs_equal_ar_token_for_token(rows):
    assert all(r["equal_to_ar"] == r["requests"] == 5 for r in rows)


def test_uniform_and_best_first_verify_the_same_nodes_alone_and_best_first_shares_them_in_a_batch(rows):
    by = {(r["concurrency"], r["method"]): r for r in rows}
    assert by[1, "cast:3"]["mean_N"] == by[1, "best-first:3"]["mean_N"]
    assert 2.0 < by[1, "cast:3"]["mean_N"] <= 3  # 3 a round, 0 in a last round with one token left
    assert by[3, "chain"]["mean_N"] == by[1, "chain"]["mean_N"]


def test_best_first_and_ungated_auto_are_refused_through_the_server():
    result = CliRunner().invoke(bench, ["throughput", "--via", "openai", "--dataset", "gsm8k", "--methods",
                                        "ar,best-first:8"])
    assert result.exit_code != 0 and "best-first:8" in result.output and "Traceback" not in result.output


@pytest.mark.slow
def test_through_the_openai_server_every_output_equals_ar_and_latency_percentiles_are_reported(tmp_path):
    data = tmp_path / "tiny.jsonl"
    data.write_text("".join(json.dumps({"task_id": i, "prompt": p, "output_tokens": 6}) + "\n"
                            for i, p in enumerate(("What is 12 times 7?", "Name a colour."))))
    out = tmp_path / "o"
    result = CliRunner().invoke(bench, ["throughput", "--via", "openai", "--dataset", str(data), "--concurrency",
                                        "1,2", "--methods", "ar,chain,cast:auto", "--dtype", "float32",
                                        "--no-progress", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["via"] == "openai" and report["engine"]["server"].endswith("--dtype float32")
    rows = report["domains"]["tiny"]
    assert all(r["lost"] == 0 and r["equal_to_ar"] == r["requests"] == 2 and r["p50_ttft_ms"] > 0 for r in rows)
    assert "TTFT p50" in out.with_suffix(".md").read_text() and out.with_suffix(".png").is_file()
