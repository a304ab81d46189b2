"""`train-drafter report`, `fit`, `curve` and `calibrate`: how well a head drafts, where its training stands.

  report     greedy replay of held-out prompts: committed round length R per domain and method
  fit        teacher-forced tau on trained-on beside held-out sequences of each data run
  curve      R per domain against training minutes, from `report --json` files
  calibrate  the plug-in mass calibration (acceptance ~= rho ** beta) on the validation split: the
             width rule's g(N) is only as good as the path masses are calibrated (paper Prop. 1);
             the fitted exponent goes into the head's config.json (`cast_calibration`)
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from drafter_builder import replay as RP
from drafter_builder import shards as S
from drafter_builder import train as T
from drafter_builder.cli import common
from drafter_builder.cli.common import CHECKPOINT, HELDOUT_SETS, THREADS, VAL_SHARDS, WORK, file_option
from runtime.drafter import load_drafter

REPORT_BUDGETS = (3, 7, 15, 31, 63)
CHAIN_TARGETS = {"gsm8k": 2.0, "humaneval": 2.0, "mt_bench": 1.6}  # the training issue's must-show


def _heldout_records(work: Path, layer_ids: list[int], hidden: int, per_set: int | None) -> dict[str, list]:
    out = {}
    for name in HELDOUT_SETS:
        folder = work / "heldout" / name
        if folder.is_dir():
            out[name] = S.load_records(S.shard_paths(folder), S.stored_layer_ids(folder), layer_ids, hidden)[:per_set]
    if not out:
        raise click.ClickException(f"no held-out data under {work / 'heldout'}; run `train-drafter heldout` first")
    return out


def acceptance_report(drafter, frozen, heldout: dict[str, list]) -> dict:
    """Per domain: chain R (whole block) and CAST R per budget, depth-1 reliability, first-rejection ranks."""
    rules = {"chain": RP.chain_rule, **{f"cast:{n}": RP.budget_rule(n) for n in REPORT_BUDGETS}}
    out: dict[str, Any] = {}
    for name, recs in heldout.items():
        scores = [RP.score_anchors(drafter, frozen, r) for r in recs]
        row: dict[str, Any] = {"prompts": len(recs)}
        for label, rule in rules.items():
            lengths = [x for s in scores for x in RP.replay(s, rule)[0]]
            row[label] = {"R": round(sum(lengths) / len(lengths), 4), "rounds": len(lengths)}
        row["depth1_reliability"] = RP.depth1_reliability(scores)
        row["first_rejection_rank"] = RP.first_rejection_ranks(scores)
        out[name] = row
    return out


def format_report(res: dict) -> str:
    labels = [k for k in next(iter(res.values())) if k == "chain" or k.startswith("cast:")]
    lines = [f"{'domain':<10}" + "".join(f"{k:>9}" for k in labels) + f"{'ECE@d1':>8}"]
    for name, row in res.items():
        lines.append(f"{name:<10}" + "".join(f"{row[k]['R']:>9.3f}" for k in labels)
                     + f"{row['depth1_reliability']['ece']:>8.3f}")
    return "\n".join(lines)


@click.command("report")
@WORK
@THREADS
@CHECKPOINT
@click.option("--prompts", type=int, default=40, show_default=True, help="Held-out prompts per domain.")
@file_option("--json", "json_path", help="Also write the report as JSON here.")
@file_option("--plot", help="Also plot R per budget and depth-1 reliability (PNG).")
@file_option("--training-curve", help="Also plot the checkpoint's loss and validation tau against time (PNG).")
def report(work: Path, threads: int, checkpoint: Path, prompts: int, json_path: Path | None, plot: Path | None,
           training_curve: Path | None) -> None:
    """Greedy replay of held-out prompts: committed round length R per domain and method."""
    _, _, frozen, target_cfg = common.load_target(threads)
    drafter = load_drafter(checkpoint, target_cfg)
    heldout_recs = _heldout_records(work, list(drafter.config.target_layer_ids), target_cfg.hidden_size, prompts)
    start = time.monotonic()
    res = acceptance_report(drafter, frozen, heldout_recs)
    click.echo(format_report(res))
    click.echo(f"({time.monotonic() - start:.0f} s; R includes the bonus token; AR = 1)")
    record = checkpoint / "training.json"
    trained = json.loads(record.read_text()) if record.is_file() else {}
    if json_path is not None:
        json_path.write_text(json.dumps({"checkpoint": str(checkpoint), "block_size": drafter.config.block_size,
                                         "train_seconds": trained.get("train_seconds"), "steps": trained.get("steps"),
                                         "domains": res}, indent=2) + "\n")
    if plot is not None:
        from perf.plots import plot_acceptance_report

        plot_acceptance_report(res, plot)
    if training_curve is not None:
        from perf.plots import plot_training_curve

        plot_training_curve(trained, training_curve)


@click.command("fit")
@WORK
@THREADS
@CHECKPOINT
@click.option("--per-run", type=int, default=24, show_default=True, help="Sequences per data run and split.")
@VAL_SHARDS
@file_option("--json", "json_path", help="Also write the table as JSON here.")
def fit(work: Path, threads: int, checkpoint: Path, per_run: int, val_shards: int, json_path: Path | None) -> None:
    """Over- or under-fitting: teacher-forced tau per data run on sequences the head trained on
    beside held-out sequences of the same run. A wide gap means more data pays; none, a wider head."""
    _, _, frozen, target_cfg = common.load_target(threads)
    drafter = load_drafter(checkpoint, target_cfg)
    train_paths, val_paths = S.split_shards(work / "train", val_shards)
    stored, layer_ids = S.stored_layer_ids(work / "train"), list(drafter.config.target_layer_ids)
    rows = {}
    for run in sorted({p.parent for p in val_paths}):
        taus = {}
        for split, paths in (("train", train_paths), ("validation", val_paths)):
            mine = [p for p in paths if p.parent == run]
            recs = S.load_records(mine[:val_shards], stored, layer_ids, target_cfg.hidden_size)[:per_run]
            taus[split] = T.acceptance(drafter, frozen, recs)["tau"]
        rows[run.name] = {**taus, "ratio": round(taus["train"] / max(taus["validation"], 1e-9), 3)}
        click.echo(f"{run.name:>8}  train tau {taus['train']:.3f}  validation tau {taus['validation']:.3f}  "
                   f"ratio {rows[run.name]['ratio']:.2f}")
    if json_path is not None:
        json_path.write_text(json.dumps({"checkpoint": str(checkpoint), "per_run": per_run, "runs": rows}, indent=2) + "\n")


@click.command("curve")
@click.argument("reports", nargs=-1, required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path))
@file_option("--json", "json_path", required=True,
             help="Write the learning curve (R per domain against training minutes) here.")
@file_option("--plot", help="Also plot it (PNG).")
def curve(reports: tuple[Path, ...], json_path: Path, plot: Path | None) -> None:
    """Learning curve from `report --json` files of checkpoints taken at several training times."""
    points = []
    for path in reports:
        raw = json.loads(path.read_text())
        if raw.get("train_seconds") is None:
            raise click.ClickException(f"{path} records no train_seconds; rerun `train-drafter report --json` on a "
                                       "checkpoint with a training.json")
        points.append({"minutes": round(raw["train_seconds"] / 60, 1), "steps": raw.get("steps"), "report": str(path),
                       "domains": {k: {m: v for m, v in row.items() if m == "chain" or m.startswith("cast:")}
                                   for k, row in raw["domains"].items()}})
    points.sort(key=lambda p: p["minutes"])
    json_path.write_text(json.dumps({"chain_targets": CHAIN_TARGETS, "points": points}, indent=2) + "\n")
    for p in points:
        click.echo(f"{p['minutes']:>7.1f} min  " + "  ".join(
            f"{k} chain {row['chain']['R']:.3f} cast:15 {row['cast:15']['R']:.3f}" for k, row in p["domains"].items()))
    if plot is not None:
        from perf.plots import plot_learning_curve

        plot_learning_curve(points, plot, CHAIN_TARGETS)


def write_calibration(folders: list[Path], target_cfg, frozen, records: list) -> None:
    """Fit the mass calibration of the head in `folders[0]` on `records`; store it in the config.json
    (and the training.json copy of it) of every folder (an fp32 twin differs by rounding only)."""
    drafter = load_drafter(folders[0], target_cfg)
    fit = RP.fit_mass_exponent([RP.score_anchors(drafter, frozen, r) for r in records])
    fit = {**fit, "fitted_on": f"{len(records)} validation sequences (training pools, held out)"}
    for folder in folders:
        path = folder / "config.json"
        raw = json.loads(path.read_text())
        raw["cast_calibration"] = fit
        path.write_text(json.dumps(raw, indent=2) + "\n")
        info = folder / "training.json"
        if info.is_file():  # keep the training record's copy of the config in step
            record = json.loads(info.read_text())
            record["drafter_config"] = raw
            info.write_text(json.dumps(record, indent=2) + "\n")
        click.echo(f"{folder}: mass calibration {fit}")


@click.command("calibrate")
@WORK
@THREADS
@CHECKPOINT
@VAL_SHARDS
def calibrate(work: Path, threads: int, checkpoint: Path, val_shards: int) -> None:
    """Fit the plug-in mass calibration (acceptance ~= rho ** beta) on the validation split."""
    _, _, frozen, target_cfg = common.load_target(threads)
    layer_ids = list(load_drafter(checkpoint, target_cfg).config.target_layer_ids)
    _, val_paths = S.split_shards(work / "train", val_shards)
    records = S.load_records(val_paths, S.stored_layer_ids(work / "train"), layer_ids, target_cfg.hidden_size)
    write_calibration([checkpoint], target_cfg, frozen, records)
