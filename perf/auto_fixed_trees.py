"""Where cast:auto's gap to cast:3 comes from where both draft (issue 40): an ablation in ONE run.

    python -m perf.auto_fixed_trees --out OUT [--repeats 12 --concurrency 4 --waves 4]

Three variants, interleaved with the order rotated per repeat, on the never_slower report's in-process
pool (synthetic + GSM8K, 48 tokens, `perf.never_slower.serve_waves`):
- `cast:3`: three nodes a request, no gate, no width rule;
- `cast:auto`: the default (gates, load probe, guard, width rule, shared-budget split);
- `auto+3`: cast:auto with every round of c drafting requests packed as cast:3 packs it (three nodes a
  request): `runtime.engine.trees._split` still runs (its host work is paid), then its sizes are replaced.
  A measurement-only swap of the engine's function for this process, nothing the runtime ships.
auto+3 / cast:3 is what auto's host work and its drafting choices cost with cast:3's trees; auto / auto+3
what its width choices (narrower or wider rounds) win or lose. Paired by repeat (`never_slower_bar.paired`).
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np

from perf.datasets import load_dataset
from perf.never_slower import METHODS, code_version, serve_waves, synthetic
from perf.never_slower_bar import paired
from perf.report import machine_info, run_line, write_report
from perf.throughput import serve_method

STATIC = 3  # nodes a request: cast:3's


@contextmanager
def packed_as_static(full: int):
    """Within it, a round whose `full` (or more) auto requests share a budget packs STATIC nodes each."""
    import runtime.engine.trees as trees
    split = trees._split

    def fixed(auto, score, depth, rule, spec, scaled, limit, sizes, batch):
        split(auto, score, depth, rule, spec, scaled, limit, sizes, batch)  # its host work, as auto pays it
        if len(auto) >= full:
            for j, b in enumerate(auto):
                sizes[b] = min(STATIC, int(np.isfinite(score[j]).sum()))
    trees._split = fixed
    try:
        yield
    finally:
        trees._split = split


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="writes OUT.json and OUT.md")
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--waves", type=int, default=4, help="1: continuous arrivals; else all at once in waves")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    args = ap.parse_args(argv)
    if args.repeats < 2 or args.concurrency < 2 or args.waves < 1:
        ap.error("need --repeats >= 2 (paired), --concurrency >= 2 (a shared budget) and --waves >= 1")
    from runtime.engine.build import build_engine

    started = time.time()
    built = build_engine()
    engine, encode, c = built.engine, built.encode, args.concurrency
    half = 2 * c  # 4c prompts, half synthetic: at c = 4 the report's pool
    pool = synthetic(encode, half, seed=c) + [encode(r.prompt) for r in load_dataset("gsm8k", half)]
    methods = {m.label: m for m in METHODS}
    variants = [("cast:3", methods["cast:3"], False), ("cast:auto", methods["cast:auto"], False),
                ("auto+3", methods["cast:auto"], True)]
    for m in METHODS:  # warm-up, as the report's cell
        serve_method(engine, m, synthetic(encode, 2, seed=99), 16, 2)
        serve_waves(engine, m, pool, args.max_new_tokens, c, args.waves)
    runs: dict[str, list[float]] = {name: [] for name, *_ in variants}
    drafted: dict[str, list[float]] = {name: [] for name, *_ in variants}
    for r in range(args.repeats):
        for name, m, fixed in variants[r % 3:] + variants[:r % 3]:
            with packed_as_static(c) if fixed else nullcontext():
                wall, seqs = serve_waves(engine, m, pool, args.max_new_tokens, c, args.waves)
            runs[name].append(sum(len(s.tokens) for s in seqs) / wall)
            drafted[name].append(float(np.mean([d for s in seqs for d in s.drafted])))
        print(f"repeat {r + 1}/{args.repeats}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in runs.items()), flush=True)
    pairs = {"cast:auto / cast:3": paired(runs["cast:auto"], runs["cast:3"]),
             "auto+3 / cast:3": paired(runs["auto+3"], runs["cast:3"]),
             "cast:auto / auto+3": paired(runs["cast:auto"], runs["auto+3"])}
    report = {"command": "python -m perf.auto_fixed_trees " + " ".join(argv or sys.argv[1:]),
              "code": code_version(), "machine": machine_info(), "wall_minutes": (time.time() - started) / 60,
              "runs_tokens_per_s": runs, "runs_drafted_share": drafted, "paired": pairs}
    write_report(Path(args.out), report, page)


def page(report: dict) -> str:
    lines = ["# cast:auto against cast:3, and auto with cast:3's trees (issue 40)", "",
             run_line(report), "", __doc__.split("\n\n", 2)[2].strip(), "",
             "| ratio | paired geometric mean | one-sided 95% upper bound |", "|---|---|---|"]
    lines += [f"| {k} | {v[0]:.3f} | {v[1]:.3f} |" for k, v in report["paired"].items()]
    lines += ["", "| variant | tokens/s by repeat | drafted share by repeat |", "|---|---|---|"]
    lines += [f"| {k} | {', '.join(f'{x:.1f}' for x in v)} | "
              f"{', '.join(f'{x:.2f}' for x in report['runs_drafted_share'][k])} |"
              for k, v in report["runs_tokens_per_s"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
