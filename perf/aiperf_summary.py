"""Summarize `perf/aiperf_run.sh OUT`: each (concurrency, method)'s best repeat of AIPerf's output
token throughput, over AR's at the same concurrency -> OUT/summary.json and OUT/summary.md.
AIPerf 0.13 writes `profile_export_aiperf.csv` with CR LF line ends (read here with newline="")."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path


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


def main(out: str) -> None:
    root, runs = Path(out), {}
    found = []  # (concurrency, method, repeat, value): repeats in number order (r10 after r9), so that
    for path in root.glob("c*-*-r*/**/profile_export_aiperf.csv"):  # the bar pairs each repeat's runs
        c, method, r = re.match(r"c(\d+)-(\w+)-r(\d+)", path.relative_to(root).parts[0]).groups()
        value = throughput(path)
        if value is not None:
            found.append((int(c), method, int(r), value))
    for c, method, _, value in sorted(found):
        runs.setdefault((c, method), []).append(value)
    rows = []
    for (c, method), values in sorted(runs.items()):
        ar = max(runs.get((c, "ar"), [float("nan")]))
        rows.append({"concurrency": c, "method": method, "tokens_per_s": max(values), "runs": values,
                     "vs_ar": max(values) / ar})
    (root / "summary.json").write_text(json.dumps(rows, indent=1))
    lines = ["| c | method | output tok/s (best repeat) | x AR | repeats |", "|---|---|---|---|---|"]
    lines += [f"| {r['concurrency']} | {r['method']} | {r['tokens_per_s']:.1f} | {r['vs_ar']:.2f} | "
              f"{', '.join(f'{v:.1f}' for v in r['runs'])} |" for r in rows]
    (root / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1])
