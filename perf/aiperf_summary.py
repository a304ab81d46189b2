"""Summarize `perf/aiperf_run.sh OUT`: each (concurrency, method)'s best repeat of AIPerf's output
token throughput, over AR's at the same concurrency; its runs over AR's paired by repeat; and from the
server's /metrics kept after each run, how many of the method's rounds drafted -> OUT/summary.json and
OUT/summary.md. AIPerf 0.13 writes `profile_export_aiperf.csv` with CR LF line ends (read here with
newline="")."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

from perf.never_slower_bar import paired

COUNTERS = ("cast_rounds_total", "cast_drafted_rounds_total", "cast_committed_tokens_total")


def throughput(csv_path: Path) -> float | None:
    """Output token throughput (tokens/s) from one AIPerf CSV export."""
    with csv_path.open(newline="") as f:
        for row in csv.reader(f):
            if row and row[0].strip().lower() == "output token throughput (tokens/sec)":  # not its "per user" row
                for cell in row[1:]:
                    try:
                        return float(cell.replace(",", ""))
                    except ValueError:
                        continue
    return None


def counters(metrics: Path) -> dict[str, float]:
    """The server's round counters from one /metrics text (Prometheus exposition format)."""
    out = {}
    for line in metrics.read_text().splitlines():
        name, _, value = line.partition(" ")
        if name in COUNTERS:
            out[name] = float(value)
    return out


def run_rounds(root: Path) -> dict[str, dict[str, float]]:
    """Each run's rounds, drafted rounds and committed tokens: the steps of the server's counters between
    the /metrics kept after the run before it (`order.txt`: the runs in the order they ran) and its own.
    Empty for a run folder without them (a run from before they were kept)."""
    order = root / "order.txt"
    names = order.read_text().split() if order.is_file() else []
    steps, last = {}, dict.fromkeys(COUNTERS, 0.0)
    for name in names:
        path = root / name / "server_metrics.txt"
        if not path.is_file():
            raise SystemExit(f"{path} is missing: the run {name} did not finish; run perf/aiperf_run.sh again")
        now = counters(path)
        steps[name] = {k: now.get(k, 0.0) - last[k] for k in COUNTERS}
        last = {k: now.get(k, 0.0) for k in COUNTERS}
    return steps


def main(out: str) -> None:
    root, runs, rounds = Path(out), {}, {}
    found = []  # (concurrency, method, repeat, value): repeats in number order (r10 after r9), so that
    for path in root.glob("c*-*-r*/**/profile_export_aiperf.csv"):  # the bar pairs each repeat's runs
        c, method, r = re.match(r"c(\d+)-(\w+)-r(\d+)", path.relative_to(root).parts[0]).groups()
        value = throughput(path)
        if value is not None:
            found.append((int(c), method, int(r), value))
    steps = run_rounds(root)
    for c, method, r, value in sorted(found):
        runs.setdefault((c, method), []).append(value)
        if f"c{c}-{method}-r{r}" in steps:
            rounds.setdefault((c, method), []).append(steps[f"c{c}-{method}-r{r}"])
    rows = []
    for (c, method), values in sorted(runs.items()):
        ar = runs.get((c, "ar"), [float("nan")])
        row = {"concurrency": c, "method": method, "tokens_per_s": max(values), "runs": values,
               "vs_ar": max(values) / max(ar), "paired_vs_ar": paired(values, ar)}
        seen = rounds.get((c, method), [])
        total = sum(s["cast_rounds_total"] for s in seen)
        if total > 0:
            row["drafted_share"] = sum(s["cast_drafted_rounds_total"] for s in seen) / total
            row["committed_per_round"] = sum(s["cast_committed_tokens_total"] for s in seen) / total
        rows.append(row)
    (root / "summary.json").write_text(json.dumps(rows, indent=1))
    lines = ["| c | method | output tok/s (best repeat) | x AR | paired x AR (95% bound) | drafted | tokens / round | "
             "repeats |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['concurrency']} | {r['method']} | {r['tokens_per_s']:.1f} | {r['vs_ar']:.2f} | "
              f"{pair_text(r)} | {share_text(r)} | {r.get('committed_per_round', float('nan')):.2f} | "
              f"{', '.join(f'{v:.1f}' for v in r['runs'])} |" for r in rows]
    (root / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def pair_text(row: dict) -> str:
    """A row's runs over AR's paired by repeat, '-' for AR itself or fewer than two pairs."""
    pair = row.get("paired_vs_ar")
    return "-" if not pair or row["method"] == "ar" else f"{pair[0]:.3f} (<= {pair[1]:.3f})"


def share_text(row: dict) -> str:
    return f"{row['drafted_share']:.1%}" if "drafted_share" in row else "-"


if __name__ == "__main__":
    main(sys.argv[1])
