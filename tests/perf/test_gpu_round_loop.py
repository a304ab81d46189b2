"""The GPU round loop on its tiny shape on the CPU: the calibrated oracle drafter makes R follow
the corruption rate, greedy output still equals AR, and the margin-robust random target keeps
its greedy continuation when a pass of another shape runs it (the bf16 near-tie artifact the
first H200 run hit)."""

import json

import torch

from perf import gpu_check
from perf.gpu_round_loop import SHAPES, continuations, random_target, run


def test_tiny_round_loop_reports_every_method_and_acceptance_follows_the_rate():
    rows = {}
    for rate in (0.0, 0.6):
        report = run("tiny", torch.device("cpu"), torch.float32, batches=(2,), prompt_len=16, new_tokens=24,
                     corruption=rate, block_positions=7)
        rows.update({(r["method"], rate): r for r in report["rows"]})
    assert {m for m, _ in rows} == {"ar", "chain", "cast:15", "cast:auto"}
    assert all(r["greedy_equals_ar"] for r in rows.values())
    assert rows[("chain", 0.0)]["mean_R"] > 4 > rows[("chain", 0.6)]["mean_R"]  # acceptance follows the rate
    assert rows[("cast:15", 0.6)]["mean_R"] > rows[("chain", 0.6)]["mean_R"]  # the tree finds ranks below 1
    assert all(0 <= r["split"]["host"] < 1 for r in rows.values())
    assert all(0 < r["host_reads_per_round"] <= 1 for r in rows.values())  # a prefill-only round reads none


def test_random_target_keeps_its_greedy_continuation_in_bf16_whatever_the_pass_shape():
    cfg = SHAPES["tiny"]
    model = random_target(cfg, torch.device("cpu"), torch.bfloat16)
    ids = torch.randint(0, cfg.vocab_size, (32,))
    top2 = model.lm_head(model.norm(model.embed_tokens(ids))).float().topk(2, dim=-1).values
    assert ((top2[:, 0] - top2[:, 1]) > 0.25 * top2[:, 0]).all()  # a margin far beyond bf16's 2^-8
    prompts, alone = continuations(model, cfg, 1, 16, 24)
    _, together = continuations(model, cfg, 3, 16, 24)  # request 0 is the same prompt, in a batch of 3
    assert alone[0].token_ids == together[0].token_ids


def test_round_loop_is_a_section_of_the_gpu_check(tmp_path):
    out = tmp_path / "round_loop.json"
    assert gpu_check.main(["--dry-run", "--sections", "rounds", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["sections"]["rounds"]["rows"]
    assert rows[0]["method"] == "ar" and all(r["greedy_equals_ar"] for r in rows[1:])
