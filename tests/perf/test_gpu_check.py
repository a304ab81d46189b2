"""perf/gpu_check: the CPU-runnable parts (dry run, report schema, correctness path, arguments)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cast_trtllm.profile import WidthProfile
from perf import gpu_attention, gpu_check
from plugins.tree_attention import tree_attention_reference

SCRIPT = Path(gpu_check.__file__).with_suffix(".sh")


def test_dry_run_writes_one_report_with_every_section_and_a_width_profile(tmp_path):
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--dry-run", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["dry_run"] and report["ok"] and report["device"] == "cpu" and report["sku"] == "cpu"
    sections = report["sections"]
    assert set(sections) == {"correctness", "attention", "launches", "latency", "rounds"}
    assert all(s["ok"] for s in sections.values())
    cases = sections["correctness"]["cases"]
    assert cases and all(c["max_abs_err"] <= c["tolerance"] for c in cases)
    assert any(c.get("kernel") == "pool" for c in cases)
    rows = sections["attention"]["rows"]
    assert [(r["batch"], r["n"], r["prefix"]) for r in rows] == [(1, 4, 32), (1, 8, 32), (3, 4, 32), (3, 8, 32),
                                                                 (1, 8, 256)]
    assert all({"pool_kernel_ms", "slot_attention_ms", "sdpa_ms"} <= set(r) for r in rows)
    launches = sections["launches"]["rows"]
    assert {(r["backend"], r["batch"], r["method"]) for r in launches} == {
        (b, n, m) for b in ("eager", "runner") for n in (1, 3) for m in ("ar", "cast:15")}
    assert all("error" not in r and r["aten_ops"] > 0 and r["host_reads"] == 1 for r in launches)
    latency = sections["latency"]
    assert latency["packed_counts"] == [1, 4, 8] and set(latency["latency_ms"]) == {"eager", "runner"}
    assert all(set(table) == {"1", "3"} for table in latency["latency_ms"].values())
    profile = WidthProfile.from_dict(latency["width_profile"])  # directly a width profile
    assert profile.packed_counts == (1, 4, 8) and profile.prefix_lengths == (32,)
    assert profile.provenance.source == "measured"
    rounds = sections["rounds"]["rows"]
    assert {(r["backend"], r["batch"], r["method"]) for r in rounds} == {
        (b, n, m) for b in ("eager", "runner") for n in (1, 3) for m in ("ar", "chain", "cast:15", "cast:auto")}
    assert all(r["greedy_equals_ar"] and set(r["split"]) == {"draft", "verify", "host"} for r in rounds)


def test_the_check_runs_without_yaml_or_safetensors(tmp_path):
    """The H200 image has neither guaranteed: the check must not import them (a subprocess blocks both)."""
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('yaml', 'safetensors'):\n"
            "            raise ImportError('blocked ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "from perf import gpu_check\n"
            f"sys.exit(gpu_check.main(['--dry-run', '--sections', 'rounds', '--out', {str(tmp_path / 'r.json')!r}]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "r.json").read_text())["sections"]["rounds"]["ok"]


def test_correctness_section_fails_on_a_wrong_kernel(monkeypatch):
    def off_by_a_bit(*args):
        return tree_attention_reference(*args) * 1.01 + 1e-3

    monkeypatch.setattr(gpu_attention, "kernel_or_reference", lambda device: (off_by_a_bit, "broken"))
    result = gpu_attention.check_correctness(torch.device("cpu"), dry_run=True, seed=0)
    assert result["kernel"] == "broken" and not result["ok"]
    packed = [c for c in result["cases"] if c.get("kernel") != "pool"]
    assert packed and all(not c["ok"] and c["max_abs_err"] > c["tolerance"] for c in packed)


def test_a_failing_section_is_reported_and_the_others_still_run(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_attention, "attention_ab", lambda *a: 1 / 0)
    out = tmp_path / "r.json"
    assert gpu_check.main(["--dry-run", "--sections", "correctness,attention", "--out", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["sections"]["correctness"]["ok"] and not report["ok"]
    assert report["sections"]["attention"] == {"ok": False, "error": "ZeroDivisionError: division by zero",
                                               "seconds": report["sections"]["attention"]["seconds"]}


@pytest.mark.parametrize("argv, message", [
    (["--dry-run", "--sections", "correctness,bogus"], "unknown ['bogus']; choose from correctness, attention, "
                                                        "launches, latency, rounds"),
    (["--dry-run", "--packed", "16,8"], "strictly ascending"),
    (["--dry-run", "--iters", "0"], "--iters >= 1"),
    (["--dry-run", "--round-backends", "eager,tensorrt"], "unknown backends ['tensorrt']"),
])
def test_bad_arguments_are_rejected_with_a_reason(argv, message, capsys):
    with pytest.raises(SystemExit):
        gpu_check.parse_args(argv)
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_without_cuda_only_the_dry_run_is_allowed(capsys):
    with pytest.raises(SystemExit):
        gpu_check.parse_args([])
    assert "--dry-run" in capsys.readouterr().err


def test_shell_script_is_valid_bash_with_a_time_guard():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    text = SCRIPT.read_text()
    assert "timeout 400 python -m perf.gpu_check" in text and "unset TRITON_INTERPRET" in text  # within 7 minutes
