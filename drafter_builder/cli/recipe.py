"""`train-drafter recipe`: rebuild the shipped head by walking `recipe.json`'s phases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from drafter_builder import recipe as R
from drafter_builder.cli.common import DATA, WORK
from drafter_builder.cli.data import data, heldout
from drafter_builder.cli.report import report
from drafter_builder.cli.train import train


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
@click.option("--threads", type=int, default=2, show_default=True, help="torch CPU threads.")
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
