"""`cast-trtllm train-drafter`: train, ship and score the DFlash head of the embedded target.

Steps (each resumable; caches live under --work, never in the repository):
  data       target greedy continuations + taps of training prompts (fp16 shards)
  heldout    the same for the first prompts of GSM8K test, HumanEval and MT-Bench
  train      DFlash block training; writes the shipped checkpoint and resumes from --work
  calibrate  fit the plug-in mass calibration on the validation split
  report     greedy replay per domain: chain R, CAST R at budgets, depth-1 reliability
  fit        trained-on vs held-out tau per data run (more data, or a wider head?)
  curve      learning curve from report files of several checkpoints
  recipe     all of the above with the shipped head's recorded phases (recipe.json), one command

    cast-trtllm train-drafter recipe                 # reproduces runtime/drafter/default
    cast-trtllm train-drafter report --json r.json   # acceptance report of a checkpoint
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from drafter_builder import recipe as R
from drafter_builder.cli.common import DATA, THREADS, WORK
from drafter_builder.cli.data import data, heldout
from drafter_builder.cli.report import calibrate, curve, fit, report
from drafter_builder.cli.train import train


@click.group("train-drafter")
def train_drafter() -> None:
    """Train, ship and score the DFlash head of the embedded target (CPU)."""


def _invoke(ctx: click.Context, command: click.Command, **options: Any) -> None:
    """Run `command` with recipe options (JSON values cast to the options' types; unknown ones refused)."""
    params = {p.name: p for p in command.params}
    unknown = sorted(set(options) - set(params))
    if unknown:
        raise click.ClickException(f"{R.RECIPE}: `{command.name}` has no options {unknown}")
    ctx.invoke(command, **{k: params[k].type_cast_value(ctx, v) for k, v in options.items()})


@click.command("recipe")
@WORK
@DATA
@THREADS
@click.pass_context
def recipe(ctx: click.Context, work: Path, data_dir: Path, threads: int) -> None:
    """Rebuild the shipped head: data, held-out data, the ten training phases and the report."""
    for phase in R.phases():
        folder = work / phase.work
        for run in phase.data:
            _invoke(ctx, data, work=folder, data_dir=data_dir, threads=threads, **R.data_options(run))
        if phase.heldout:
            _invoke(ctx, heldout, work=folder, data_dir=data_dir, threads=threads)
        for run in phase.train:
            init_from = run.get("init_from")
            _invoke(ctx, train, work=folder, threads=threads,
                    **{**run, **({"init_from": R.ROOT / init_from} if init_from else {})})
    _invoke(ctx, report, work=work, threads=threads, **{k: work / v for k, v in R.report_options().items()})


for _command in (data, heldout, train, calibrate, report, fit, curve, recipe):
    train_drafter.add_command(_command)
