"""The GPU round-loop section, run on its tiny shape on the CPU: the controlled-acceptance
drafter makes R follow the corruption rate, and greedy output still equals AR."""

import json

from perf import gpu_check
from perf.gpu_round_loop import run


def test_tiny_round_loop_reports_every_method_and_stays_lossless():
    import torch

    report = run("tiny", torch.device("cpu"), torch.float32, prompts=2, prompt_len=16, new_tokens=24,
                 corruptions=[0.0, 0.9], block_positions=7)
    rows = {(r["method"], r["corruption"]): r for r in report["rows"]}
    assert set(rows) == {("ar", None)} | {(m, c) for m in ("chain", "cast:15", "cast:auto") for c in (0.0, 0.9)}
    assert all(r["greedy_equals_ar"] for r in report["rows"][1:])
    assert rows[("chain", 0.0)]["mean_R"] > 4 > rows[("chain", 0.9)]["mean_R"]  # acceptance follows the rate
    assert all(0 <= r["host_overhead_share"] < 1 for r in report["rows"][1:])


def test_round_loop_is_a_section_of_the_gpu_check(tmp_path):
    out = tmp_path / "round_loop.json"
    assert gpu_check.main(["--dry-run", "--sections", "round_loop", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["sections"]["round_loop"]["rows"]
    assert rows[0]["method"] == "ar" and all(r["greedy_equals_ar"] for r in rows[1:])
