"""Merge width-sweep reports (one `cast-trtllm sweep` per core or machine) into one report,
its Table 2 markdown and its plot.

A domain found in one report is taken as is. A domain found in several is a set sharded by
prompt (`--num-prompts 20 --skip-prompts 6` on one core, `--num-prompts 6` on the other):
its requests are pooled and each method's summary is recomputed from the per-request
figures (ms/token = summed decode windows over summed tokens, R and N per round).
Shards must share methods and budgets and hold disjoint prompts.

    python -m perf.sweep_merge a.json b.json --out sweep.json --plot sweep.png
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from perf.cli import format_sweep, sweep_table

SPLIT = ("draft", "verify", "overhead")


def pool_method(label: str, requests: list[dict[str, Any]], ar_ms: float | None, chain_ms: float | None) -> dict:
    """One summary row (perf.report.summarize layout) from per-request rows of one method."""
    tokens = sum(r["output_length"] for r in requests)
    rounds = sum(r["num_rounds"] for r in requests)
    decode_ms = sum(r["decode_ms"] for r in requests)
    ms = decode_ms / tokens
    split = {k: sum(r["time_split_ms"][k] for r in requests) for k in SPLIT}
    return {
        "method": label, "ms_per_token": ms, "tokens_per_s": 1000.0 / ms,
        "speedup_over_ar": ar_ms / ms if ar_ms else None,
        "gain_over_chain": chain_ms / ms - 1.0 if chain_ms else None,
        "mean_R": sum(r["mean_R"] * r["num_rounds"] for r in requests) / rounds,
        "mean_budget": sum(r["sum_budget"] for r in requests) / rounds,
        "drafted_share": None if label == "ar" else sum(r["drafted_rounds"] for r in requests) / rounds,
        "ttft_ms": sum(r["ttft_ms"] for r in requests) / len(requests),
        **{f"{k}_share": split[k] / decode_ms for k in SPLIT},
    }


def pool_shards(name: str, shards: list[dict]) -> dict:
    """One domain report from prompt shards of the same sweep settings."""
    keys = ("methods", "budgets", "temperature")
    first = shards[0]["settings"]
    for shard in shards[1:]:
        if any(shard["settings"].get(k) != first.get(k) for k in keys):
            raise ValueError(f"{name}: shards differ in {keys}; rerun them with the same sweep settings")
    runs = []
    for i, label in enumerate(first["methods"]):
        requests = [r for shard in shards for r in shard["runs"][i]["requests"]]
        ids = [r["task_id"] for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{name}: prompts {sorted({t for t in ids if ids.count(t) > 1})} are in more "
                             f"than one shard; shard with disjoint --skip-prompts/--num-prompts ranges")
        if any("decode_ms" not in r for r in requests):
            raise ValueError(f"{name}: a shard report lacks per-request decode_ms; rerun it with this version")
        runs.append({"label": label, "method": shards[0]["runs"][i]["method"],
                     "budget": shards[0]["runs"][i]["budget"], "requests": requests})
    pooled = {r["label"]: r["requests"] for r in runs}
    ms = {label: sum(q["decode_ms"] for q in reqs) / sum(q["output_length"] for q in reqs)
          for label, reqs in pooled.items()}
    summary = [pool_method(label, reqs, ms.get("ar"), ms.get("chain")) for label, reqs in pooled.items()]
    return {"engine": shards[0]["engine"], "machine": shards[0]["machine"],
            "dataset": {"name": name, "num_requests": len(runs[0]["requests"])},
            "settings": {**first, "num_prompts": len(runs[0]["requests"]), "skip_prompts": None,
                         "shards": [{"skip_prompts": s["settings"].get("skip_prompts"),
                                     "num_prompts": s["settings"]["num_prompts"]} for s in shards],
                         "pooled": "summary recomputed from the shards' per-request rows; percentiles are per shard"},
            "runs": runs, "summary": summary}


def merge_sweeps(reports: list[dict]) -> dict:
    """One {"sweep", "domains"} report from several; a domain in several is pooled as prompt shards."""
    by_domain: dict[str, list[dict]] = {}
    for report in reports:
        for name, domain in report["domains"].items():
            by_domain.setdefault(name, []).append((report, domain))
    merged: dict = {"sweep": {}, "domains": {}}
    for name, found in by_domain.items():
        if len(found) == 1:
            report, domain = found[0]
            merged["sweep"][name], merged["domains"][name] = report["sweep"][name], domain
        else:
            domain = pool_shards(name, [d for _, d in found])
            merged["domains"][name] = domain
            merged["sweep"][name] = sweep_table(domain["summary"], domain["settings"]["budgets"])
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
                         {d: t["predicted_gain"] for d, t in table.items() if t["predicted_gain"] is not None})
    click.echo(format_sweep(merged["sweep"]))


if __name__ == "__main__":
    main()
