"""Merge width-sweep reports of disjoint domain sets (one `cast-trtllm sweep` per core or
machine) into one report, its Table 2 markdown and its plot.

    python -m perf.sweep_merge a.json b.json --out sweep.json --plot sweep.png
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from perf.cli import format_sweep


def merge_sweeps(reports: list[dict]) -> dict:
    """One {"sweep", "domains"} report from several; a domain in two of them is an error."""
    merged: dict = {"sweep": {}, "domains": {}}
    for report in reports:
        for key in ("sweep", "domains"):
            twice = set(merged[key]) & set(report[key])
            if twice:
                raise ValueError(f"domains {sorted(twice)} appear in more than one sweep report; shard by domain")
            merged[key].update(report[key])
    return merged


@click.command()
@click.argument("reports", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="Merged JSON report.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Gain vs N plot (PNG).")
def main(reports: tuple[Path, ...], out: Path, plot: Path | None) -> None:
    try:
        merged = merge_sweeps([json.loads(p.read_text()) for p in reports])
    except (ValueError, KeyError, json.JSONDecodeError) as err:
        raise click.ClickException(f"cannot merge: {err}") from None
    out.write_text(json.dumps(merged, indent=2) + "\n")
    if plot is not None:
        from perf.plots import plot_width_sweep

        table = merged["sweep"]
        plot_width_sweep({d: {int(n): g for n, g in t["gain_over_chain"].items()} for d, t in table.items()}, plot,
                         {d: t["predicted_width"] for d, t in table.items() if t["predicted_width"] is not None})
    click.echo(format_sweep(merged["sweep"]))


if __name__ == "__main__":
    main()
