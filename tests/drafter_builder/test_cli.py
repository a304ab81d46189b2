"""`cast-trtllm train-drafter`: `curve` turns replay reports of checkpoints at several
training times into one learning curve (sorted by time, targets recorded) and refuses a
report without its training time; `train --rebuild-vocab` needs a run to resume; `fit`
reports training and validation tau of every data run; `train --init-from` continues a
head's record with a fresh optimizer (grown by `--grow-layers`, on a restarted schedule);
a continued head's thinned loss curve keeps its inherited history."""

from __future__ import annotations

import json

from click.testing import CliRunner

from drafter_builder.cli import train_drafter
from drafter_builder.cli.report import CHAIN_TARGETS

PNG = b"\x89PNG\r\n\x1a\n"


def _report(path, seconds, chain, cast):
    domains = {"gsm8k": {"prompts": 2, "chain": {"R": chain, "rounds": 9}, "cast:15": {"R": cast, "rounds": 7},
                         "depth1_reliability": {"ece": 0.01, "bins": []}}}
    path.write_text(json.dumps({"checkpoint": "x", "train_seconds": seconds, "steps": 10, "domains": domains}))
    return str(path)


def test_reports_become_a_curve_sorted_by_training_time(tmp_path):
    late = _report(tmp_path / "late.json", 7500.0, 1.9, 2.5)
    early = _report(tmp_path / "early.json", 3000.0, 1.7, 2.2)
    out = tmp_path / "curve.json"
    res = CliRunner().invoke(train_drafter, ["curve", late, early, "--json", str(out), "--plot", str(tmp_path / "c.png")])
    assert res.exit_code == 0, res.output
    curve = json.loads(out.read_text())
    assert [p["minutes"] for p in curve["points"]] == [50.0, 125.0]
    assert [p["domains"]["gsm8k"]["chain"]["R"] for p in curve["points"]] == [1.7, 1.9]
    assert "depth1_reliability" not in curve["points"][0]["domains"]["gsm8k"]
    assert curve["chain_targets"] == CHAIN_TARGETS
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG


def test_a_report_without_its_training_time_is_refused(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"checkpoint": "x", "domains": {}}))
    res = CliRunner().invoke(train_drafter, ["curve", str(path), "--json", str(tmp_path / "c.json")])
    assert res.exit_code != 0 and "records no train_seconds" in res.output


def test_rebuilding_the_vocabulary_growing_a_new_head_or_a_schedule_past_the_box_is_refused(tmp_path):
    res = CliRunner().invoke(train_drafter, ["train", "--work", str(tmp_path), "--rebuild-vocab"])
    assert res.exit_code == 2 and "needs --resume with a" in res.output
    res = CliRunner().invoke(train_drafter, ["train", "--work", str(tmp_path), "--fresh", "--rebuild-vocab"])
    assert res.exit_code == 2 and "--rebuild-vocab" in res.output
    res = CliRunner().invoke(train_drafter, ["train", "--work", str(tmp_path), "--grow-layers", "3"])
    assert res.exit_code == 2 and "pass --init-from" in res.output
    res = CliRunner().invoke(train_drafter, ["train", "--work", str(tmp_path), "--train-minutes", "10",
                                             "--schedule-from-min", "10"])
    assert res.exit_code == 2 and "--schedule-from-min must lie in [0, --train-minutes=10.0)" in res.output


def _two_run_dataset(model, tok, root):
    from drafter_builder.shards import build_dataset

    prompts = [("gsm8k_train", "What is 2 + 3?"), ("self_chat", "Say hi."), ("gsm8k_train", "Halve 10."),
               ("self_chat", "Name a colour.")]
    for run in ("a", "b"):
        build_dataset(model, tok, prompts, [1, 29], root / "train" / run, batch_size=2, max_new_tokens=20,
                      budget_s=float("inf"))


def test_fit_compares_each_data_runs_training_and_validation_tau(embedded_hf, tmp_path):
    from runtime.drafter import random_drafter, save_drafter
    from runtime.model.llama import TargetConfig

    model, tok = embedded_hf
    _two_run_dataset(model, tok, tmp_path)
    head = random_drafter(TargetConfig.from_hf(model.config), num_layers=1, block_size=4, target_layer_ids=[1, 29])
    save_drafter(head, tmp_path / "head")
    out = tmp_path / "fit.json"
    res = CliRunner().invoke(train_drafter, ["fit", "--work", str(tmp_path), "--checkpoint", str(tmp_path / "head"),
                                             "--val-shards", "1", "--threads", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    runs = json.loads(out.read_text())["runs"]
    assert sorted(runs) == ["a", "b"]
    assert all(0.0 <= row[k] <= 3.0 for row in runs.values() for k in ("train", "validation"))


def test_init_from_continues_a_heads_record_with_a_fresh_optimizer(embedded_hf, tmp_path, monkeypatch):
    """A head whose trainer state is gone (a new machine) goes on from its training.json:
    steps and minutes continue, earlier runs stay in the record, the data record keeps the
    runs it was trained on, and an existing trainer state is not silently overridden."""
    from drafter_builder.blocks import FrozenTarget
    from drafter_builder.cli import common
    from runtime.model.llama import TargetConfig

    model, tok = embedded_hf
    loaded = (model, tok, FrozenTarget.from_hf(model), TargetConfig.from_hf(model.config))
    monkeypatch.setattr(common, "load_target", lambda threads, seed=0: loaded)
    first, second = tmp_path / "first", tmp_path / "second"
    _two_run_dataset(model, tok, first)
    small = ["--num-layers", "1", "--block-size", "4", "--draft-layer-ids", "1,29", "--vocab-size", "64",
             "--val-shards", "1", "--threads", "1", "--seqs-per-step", "1", "--anchors", "2"]
    res = CliRunner().invoke(train_drafter, ["train", "--work", str(first), "--out", str(tmp_path / "head1"), "--fresh",
                                             "--max-steps", "3", *small])
    assert res.exit_code == 0, res.output
    _two_run_dataset(model, tok, second)
    (second / "train" / "a").rename(second / "train" / "c")  # the new machine's data run has another name
    res = CliRunner().invoke(train_drafter, ["train", "--work", str(second), "--out", str(tmp_path / "head2"),
                                             "--init-from", str(tmp_path / "head1"), "--max-steps", "5",
                                             "--rewarm-steps", "2", "--grow-layers", "2", "--schedule-from-min", "0.001",
                                             *small])
    assert res.exit_code == 0, res.output
    before = json.loads((tmp_path / "head1" / "training.json").read_text())
    after = json.loads((tmp_path / "head2" / "training.json").read_text())
    assert before["steps"] == 3 and after["steps"] == 5
    assert after["train_seconds"] > before["train_seconds"]
    assert [r["step"] for r in after["runs"]] == [0, 3]
    assert sorted(after["data"]) == ["a", "b", "c"]
    assert after["vocab"] == before["vocab"]
    assert (before["drafter_config"]["num_hidden_layers"], after["drafter_config"]["num_hidden_layers"]) == (1, 2)
    assert after["runs"][1]["grown_to_layers"] == 2 and after["runs"][1]["train_config"]["schedule_start_s"] == 0.06
    calibrations = [json.loads((d / "config.json").read_text())["cast_calibration"]
                    for d in (tmp_path / "head2", second / "checkpoint")]
    assert calibrations[0] == calibrations[1] and calibrations[0]["mass_exponent"] > 0  # fitted once, stored twice
    res = CliRunner().invoke(train_drafter, ["train", "--work", str(second), "--init-from", str(tmp_path / "head1"),
                                             *small])
    assert res.exit_code == 2 and "--init-from starts a new trainer state" in res.output
    res = CliRunner().invoke(train_drafter, ["train", "--work", str(second), "--out", str(tmp_path / "head3"),
                                             "--max-steps", "6", *small])  # resumes the continued head's state
    assert res.exit_code == 0, res.output
    resumed = json.loads((tmp_path / "head3" / "training.json").read_text())
    assert resumed["steps"] == 6 and sorted(resumed["data"]) == ["a", "b", "c"]  # the inherited runs stay
    sources = json.loads((tmp_path / "head3" / "config.json").read_text())["training_prompt_sources"]
    assert sources == json.loads((tmp_path / "head2" / "config.json").read_text())["training_prompt_sources"]


def test_a_continued_heads_loss_curve_keeps_its_inherited_history():
    from drafter_builder.cli.train import thin_loss_curve

    inherited = [{"step": 1 + i * 1145, "loss": 70.0 - i} for i in range(41)]  # a thinned record, steps 1..45801
    log = inherited + [{"step": s, "loss": 3.0} for s in range(45802, 54431)]  # then every step of the new run
    curve = thin_loss_curve(log)
    steps = [e["step"] for e in curve]
    assert steps == sorted(set(steps)) and curve[-1] == log[-1] and len(curve) <= 42
    assert sum(s <= 45801 for s in steps) >= 30  # by index, the inherited 41 entries would shrink to 1
    assert thin_loss_curve(curve) == curve  # saving again keeps it
    assert thin_loss_curve([]) == [] and thin_loss_curve(log[:1]) == log[:1]
