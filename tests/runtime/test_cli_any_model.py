"""Any checkpoint the loader accepts runs through the commands, not only the embedded one:
`generate`, `bench` and `sweep` on a tiny Qwen3 checkpoint with its z-lab-format drafter, pinned
to torch fp32 and on the default execution path (whatever autoconfig picks)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cast_trtllm.cli import main

from tests.runtime.hf_checkpoints import write_tiny_checkpoint, write_tiny_drafter


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3")
    target = write_tiny_checkpoint("qwen3", root / "target")
    return target, write_tiny_drafter(target, root / "drafter", block_size=8)


def test_generate_runs_a_qwen3_checkpoint_with_its_drafter_and_equals_ar(qwen3):
    target, drafter = qwen3
    base = ["generate", "--target", str(target), "--drafter", str(drafter), "--prompt", "hi", "--json",
            "--dtype", "float32", "--threads", "1", "--max-new-tokens", "12", "--ignore-eos"]
    outs = {}
    for method in ("ar", "cast"):
        result = CliRunner().invoke(main, [*base, "--method", method, "--budget", "15"])
        assert result.exit_code == 0, result.output
        outs[method] = json.loads(result.stdout.strip().splitlines()[-1])
    assert outs["cast"]["token_ids"] == outs["ar"]["token_ids"] and len(outs["ar"]["token_ids"]) == 12
    assert outs["cast"]["engine"]["target_source"] == str(target)


def test_bench_runs_a_qwen3_checkpoint(qwen3, tmp_path):
    target, drafter = qwen3
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"task_id": i, "prompt": p, "output_tokens": 8}) + "\n"
                            for i, p in enumerate(["hello", "count to ten"])))
    report = tmp_path / "r.json"
    result = CliRunner().invoke(main, ["bench", "latency", "--dataset", str(data), "--methods", "ar,chain,cast:7",
                                       "--target", str(target), "--drafter", str(drafter), "--dtype", "float32",
                                       "--threads", "1", "--no-progress", "--out", str(report)])
    assert result.exit_code == 0, result.output
    rows = {r["method"]: r for r in json.loads(report.read_text())["domains"]["prompts"]["summary"]}
    assert set(rows) == {"ar", "chain", "cast:7"} and all(r["ms_per_token"] > 0 for r in rows.values())
    assert all(r["equal_to_ar"] == r["requests"] == 2 for r in rows.values())


@pytest.mark.parametrize("command, methods", [(["bench", "latency"], ["--methods", "chain"]),
                                              (["sweep"], ["--budgets", "3", "--no-ar", "--no-auto"])])
def test_bench_and_sweep_run_on_the_default_execution_path(qwen3, tmp_path, monkeypatch, command, methods):
    """No --dtype / --threads: whatever autoconfig measures and picks on this machine runs."""
    monkeypatch.setenv("CAST_CACHE_DIR", str(tmp_path / "cache"))
    target, drafter = qwen3
    data = tmp_path / "prompts.jsonl"
    data.write_text(json.dumps({"task_id": 0, "prompt": "hello", "output_tokens": 4}) + "\n")
    report = tmp_path / "r.json"
    result = CliRunner().invoke(main, [*command, "--dataset", str(data), *methods, "--target", str(target),
                                       "--drafter", str(drafter), "--no-progress", "--out", str(report)])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    run = json.loads(report.read_text())["domains"]["prompts"]
    assert run["engine"]["backend"] in ("torch", "onnxruntime") and "measured now" in run["engine"]["execution"]
    assert "chain" in {r["method"] for r in run["summary"]} and all(r["ms_per_token"] > 0 for r in run["summary"])
