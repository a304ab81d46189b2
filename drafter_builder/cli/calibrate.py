"""`train-drafter calibrate`: fit the plug-in mass calibration of a head (acceptance ~= rho ** beta).

The width rule's g(N) is only as good as the drafter's path masses are calibrated (paper
Prop. 1); the fitted exponent goes into the head's config.json (`cast_calibration`).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from drafter_builder import replay as RP
from drafter_builder import shards as S
from drafter_builder.cli import common
from drafter_builder.cli.common import CHECKPOINT, THREADS, VAL_SHARDS, WORK


def store_calibration(folder: Path, fit: dict) -> None:
    """Put a fitted mass calibration into the config.json (and training.json copy) of `folder`."""
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


def write_calibration(folder: Path, target_cfg, frozen, records: list) -> dict:
    """Fit the mass calibration of the head in `folder` on `records`; store it in its config.json."""
    from runtime.drafter import load_drafter

    drafter = load_drafter(folder, target_cfg)
    fit = RP.fit_mass_exponent([RP.score_anchors(drafter, frozen, r) for r in records])
    fit = {**fit, "fitted_on": f"{len(records)} validation sequences (training pools, held out)"}
    store_calibration(folder, fit)
    return fit


@click.command("calibrate")
@WORK
@THREADS
@CHECKPOINT
@VAL_SHARDS
def calibrate(work: Path, threads: int, checkpoint: Path, val_shards: int) -> None:
    """Fit the plug-in mass calibration (acceptance ~= rho ** beta) on the validation split."""
    from runtime.drafter import load_drafter

    common.setup(threads, 0)
    _, _, frozen, target_cfg = common.load_target()
    layer_ids = list(load_drafter(checkpoint, target_cfg).config.target_layer_ids)
    _, val_paths = S.split_shards(work / "train", val_shards)
    records = S.load_records(val_paths, S.stored_layer_ids(work / "train"), layer_ids, target_cfg.hidden_size)
    write_calibration(checkpoint, target_cfg, frozen, records)
