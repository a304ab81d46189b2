"""perf/gpu_check: the CPU-runnable parts (dry run, report schema, correctness path, arguments)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from cast_trtllm.profile import WidthProfile
from perf import gpu_check
from plugins.tree_attention import tree_attention_reference

SCRIPT = Path(gpu_check.__file__).with_suffix(".sh")


def test_dry_run_writes_one_report_with_every_section_and_a_width_profile(tmp_path):
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--dry-run", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["dry_run"] and report["ok"] and report["device"] == "cpu" and report["sku"] == "cpu"
    sections = report["sections"]
    assert set(sections) == {"correctness", "kernel", "probe"} and all(s["ok"] for s in sections.values())
    cases = sections["correctness"]["cases"]
    assert cases and all(c["max_abs_err"] <= c["tolerance"] for c in cases)
    assert [(r["prefix"], r["n"]) for r in sections["kernel"]["rows"]] == [(32, 16), (32, 32), (64, 16), (64, 32)]
    probe = sections["probe"]
    assert probe["packed_counts"] == [1, 4, 8, 16] and set(probe["latency_ms"]) == {"torch"}
    profile = WidthProfile.from_dict(probe["width_profile"])  # directly a width profile
    assert profile.packed_counts == (1, 4, 8, 16) and profile.prefix_lengths == (32,)
    assert profile.provenance.source == "measured"
    assert list(profile.latency_ms[32][1]) == probe["latency_ms"]["torch"]["32"]


def test_correctness_section_fails_on_a_wrong_kernel(monkeypatch):
    def off_by_a_bit(*args):
        return tree_attention_reference(*args) * 1.01 + 1e-3

    monkeypatch.setattr(gpu_check, "kernel_or_reference", lambda device: (off_by_a_bit, "broken"))
    result = gpu_check.check_correctness(torch.device("cpu"), dry_run=True, seed=0)
    assert result["kernel"] == "broken" and not result["ok"]
    assert all(not c["ok"] and c["max_abs_err"] > c["tolerance"] for c in result["cases"])


def test_a_failing_section_is_reported_and_the_others_still_run(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "time_kernel", lambda *a: 1 / 0)
    out = tmp_path / "r.json"
    assert gpu_check.main(["--dry-run", "--sections", "correctness,kernel", "--out", str(out)]) == 1
    report = json.loads(out.read_text())
    assert report["sections"]["correctness"]["ok"] and not report["ok"]
    assert report["sections"]["kernel"] == {"ok": False, "error": "ZeroDivisionError: division by zero",
                                            "seconds": report["sections"]["kernel"]["seconds"]}


@pytest.mark.parametrize("argv, message", [
    (["--dry-run", "--sections", "correctness,bogus"], "unknown ['bogus']; choose from correctness, kernel, probe, "
                                                        "round_loop"),
    (["--dry-run", "--packed", "16,8"], "strictly ascending"),
    (["--dry-run", "--iters", "0"], "--iters >= 1"),
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
    assert "timeout 330 python -m perf.gpu_check" in text and "unset TRITON_INTERPRET" in text
    assert "timeout 140 python -m perf.gpu_check --sections round_loop" in text  # 330 + 140 s: within 8 minutes
