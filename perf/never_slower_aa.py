"""How far apart the never-slower report reads one method against itself (an A/A run).

    python -m perf.never_slower_aa --out perf/results/never_slower_aa [--cells b1:humaneval,c4:continuous]

Each cell is `perf.never_slower.cell` with the bar's reference run twice, the second time in
cast:auto's place: cast:3 where a width pays (`b1:humaneval`), AR where none does
(`c16:all-at-once=ar`): the same work, interleaved and rotated as the report runs it. Whatever the
bar reads between the two is measurement, so a bar that calls it `MISS` judges noise. Per cell:
- `verdict` (the report's bar) on the reference against itself: where cast:3 beats AR, best runs,
  then the paired mean within `AA_MARGIN`; where it does not, the twin of AR against the 0.98 x AR floor;
- the rule it replaced (width cells): the best-run ratio within the largest best / next-best gap;
- its power: AR in cast:auto's place, against cast:3 where cast:3 beats AR (it must read `MISS`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from perf.datasets import load_dataset
from perf.harness import MethodSpec
from perf.never_slower import code_version, cell, synthetic
from perf.never_slower_bar import no_width, paired, verdict
from perf.report import machine_info, run_line, write_report
from perf.throughput import serve_method

TWINS = {"cast:3": MethodSpec("cast", 3), "ar": MethodSpec("ar")}
LABELS = ("ar", "cast:3", "cast:auto")  # the bar's keys: the twin stands where auto would
CELLS = "b1:gsm8k,b1:humaneval,b1:mt_bench,c4:all-at-once,c4:continuous,c16:all-at-once=ar,c32:continuous=ar"


def methods(name: str) -> tuple:
    """ar, cast:3 and the cell's twin (`=ar` after the cell's name; cast:3 by default)."""
    twin = name.partition("=")[2] or "cast:3"
    if twin not in TWINS:
        raise SystemExit(f"cell {name!r}: the twin after '=' is one of {sorted(TWINS)}")
    return MethodSpec("ar"), MethodSpec("cast", 3), TWINS[twin]


def prompts(encode, name: str, n: int) -> tuple[list[list[int]], int]:
    """A cell's prompts and concurrency: `b1:<domain>` (n prompts one after another) or
    `c<C>:all-at-once|continuous` (the report's synthetic + GSM8K pool)."""
    where, _, what = name.partition("=")[0].partition(":")
    if where == "b1":
        return [encode(r.prompt) for r in load_dataset(what, n)], 1
    if not (where.startswith("c") and where[1:].isdigit() and what in ("all-at-once", "continuous")):
        raise SystemExit(f"cell {name!r}: use b1:<domain> or c<C>:all-at-once / c<C>:continuous")
    c = int(where[1:])
    pool = synthetic(encode, c, seed=c) + [encode(r.prompt) for r in load_dataset("gsm8k", c)]
    return (pool[:c] if what == "all-at-once" else pool[:2 * c]), c


def gap_rule(rows: dict) -> str:
    """The bar's width-cell rule before this file: auto's best run within the largest best /
    next-best gap of any method's runs (over its best) of cast:3's best run."""
    gaps = [(a - b) / a for a, b in (sorted(r["runs_tokens_per_s"], reverse=True)[:2] for r in rows.values())]
    auto, static = rows["cast:auto"]["vs_ar"], rows["cast:3"]["vs_ar"]
    return "meets" if auto >= static else "within noise" if auto >= static * (1 - max(gaps)) else "MISS"


def judged(rows: dict) -> dict:
    """The A/A cell's readings under the bar, under the rule it replaced, and the bar's power."""
    ref = "ar" if no_width(rows) else "cast:3"  # what the bar holds auto to
    twin = paired(rows["cast:auto"]["runs_tokens_per_s"], rows[ref]["runs_tokens_per_s"])
    out = {"reference": ref, "best_run_ratio": rows["cast:auto"]["vs_ar"] / rows[ref]["vs_ar"], "paired": twin,
           "bar": verdict(rows), "gap_rule": gap_rule(rows) if ref == "cast:3" else "-",
           "cast3_vs_ar": rows["cast:3"]["vs_ar"]}
    if not no_width(rows):  # AR where auto stands: a method cast:3 beats must read MISS
        out["bar_on_ar"] = verdict({"cast:3": rows["cast:3"], "cast:auto": rows["ar"]})
    return out


def rows_of(runs: dict) -> dict:
    """A cell's rows as `perf.never_slower.cell` gives them, from its runs by label (best runs over AR's)."""
    return {k: {"vs_ar": max(v) / max(runs["ar"]), "runs_tokens_per_s": v} for k, v in runs.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="writes OUT.json and OUT.md")
    ap.add_argument("--cells", default=CELLS)
    ap.add_argument("--num-prompts", type=int, default=6, help="prompts per B = 1 cell")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--min-seconds", type=float, default=30.0)
    ap.add_argument("--page-only", action="store_true", help="judge OUT.json's runs again, write OUT.md; run nothing")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.page_only:
        report = json.loads(out.with_suffix(".json").read_text())
        report["cells"] = [e | judged(rows_of(e["runs"])) for e in report["cells"]]
        write_report(out, report, page)
        return
    from runtime.engine.build import build_engine

    started, built = time.time(), build_engine()
    report = {"command": "python -m perf.never_slower_aa " + " ".join(argv or sys.argv[1:]),
              "code": code_version(), "machine": machine_info(), "cells": []}
    for m in TWINS.values():  # warm-up, as the report's
        serve_method(built.engine, m, synthetic(built.encode, 2, seed=99), 16, 2)
    for name in args.cells.split(","):
        ids, c = prompts(built.encode, name, args.num_prompts)
        rows, _ = cell(built.engine, ids, args.max_new_tokens, c, 3, None, args.min_seconds, methods=methods(name),
                       labels=LABELS)
        entry = {"cell": name, "runs": {k: r["runs_tokens_per_s"] for k, r in rows.items()}} | judged(rows)
        report["cells"].append(entry)
        print(f"{name}: twin / reference best {entry['best_run_ratio']:.3f}, bar {entry['bar']}, "
              f"gap rule {entry['gap_rule']}, AR in auto's place {entry.get('bar_on_ar', '-')}", flush=True)
    report["wall_minutes"] = (time.time() - started) / 60
    write_report(out, report, page)


def page(report: dict) -> str:
    lines = ["# A/A: the never-slower bar on its reference against itself", "",
             run_line(report), "",
             "The bar's reference (cast:3 where it beats AR, else AR; `=ar` after a cell's name) runs twice per "
             "cell, the second time in cast:auto's place (`perf/never_slower_aa.py`). bar: the report's "
             "(`perf.never_slower_bar.verdict`; where no width pays, the twin of AR against 0.98x AR); gap rule: the "
             "one it replaced (best runs within the largest best / next-best gap); AR in auto's place: the bar's "
             "power, where cast:3 beats AR.", "",
             "| cell | cast:3 x AR | best-run ratio (twin / reference) | paired (95% bound) | bar | gap rule | "
             "AR in auto's place | runs (reference; twin) |", "|---|---|---|---|---|---|---|---|"]
    for e in report["cells"]:
        p = f"{e['paired'][0]:.3f} (<= {e['paired'][1]:.3f})" if e["paired"] else "-"
        runs = "; ".join(", ".join(f"{v:.1f}" for v in e["runs"][k]) for k in (e["reference"], "cast:auto"))
        lines.append(f"| {e['cell']} | {e['cast3_vs_ar']:.2f} | {e['best_run_ratio']:.3f} | {p} | {e['bar']} | "
                     f"{e['gap_rule']} | {e.get('bar_on_ar', '-')} | {runs} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
