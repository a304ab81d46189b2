"""auto's trees sized before the round (`trees._ahead`) against sized on the round's own masses, both on device trees.

    python -m perf.auto_ahead --out perf/results/auto_ahead_cpu [--cells b1:gsm8k,c4:continuous]

On a GPU the trees are built on the device. Sized on this round's masses, auto reads its candidates'
scores back mid-round: the GPU waits while the host runs the width rule, and the round reads the device
twice. Sized on each request's predicted masses (its gate's typical masses), the round reads once. The
table rule's best budget always fills its bucket, so the two can differ only in which bucket; this
measures what that costs. Per cell, one engine on device trees (forced on this CPU) runs cast:auto
greedy both ways, in the order own / ahead / ahead / own, after untimed runs that let the gates and
the cost table learn; then the table is frozen, so both see the same prices and differ only in sizing.
Per way: request-rounds, committed tokens per request-round (R), nodes per drafted request-round,
device reads per decode round, tokens per priced ms (committed tokens over the frozen table's price of
every round run: what the width rule maximizes), and greedy outputs equal to AR's. Wall time is not
read: on this CPU the device path's tree search runs as torch ops, slower than the host search the
CPU engine uses.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from perf.datasets import load_dataset
from perf.harness import MethodSpec
from perf.never_slower import METHODS, code_version
from perf.never_slower_aa import prompts as cell_prompts
from perf.report import machine_info
from perf.throughput import serve_method

CELLS = "b1:gsm8k,b1:math500,b1:humaneval,b1:mbpp,b1:mt_bench,c4:all-at-once,c4:continuous"
AUTO = METHODS[2]  # cast:auto, gated: the default
OWN, AHEAD = "on the round's masses (read mid-round)", "ahead (on predicted masses)"


def run_cell(engine, encode, name: str, max_new: int, num_prompts: int) -> dict:
    """Both sizings of one cell, and AR's outputs to compare them with."""
    import runtime.engine.engine as engine_module

    if name.startswith("b1:"):
        prompts, c = [encode(r.prompt) for r in load_dataset(name[3:], num_prompts)], 1
    else:
        prompts, c = cell_prompts(encode, name, num_prompts)
    ar = serve_method(engine, MethodSpec("ar"), prompts, max_new, c)[2]
    engine.device_trees, cost, sizing = True, engine.cost, engine_module.device_trees
    for _ in range(2):  # the gates' evidence and the table, as a running server has them
        serve_method(engine, AUTO, prompts, max_new, c)
    priced, account = [0.0, 0], engine_module.account  # the table's ms of the rounds run, decode rounds

    def priced_account(e, batch, trees, masses, drafting, marks):
        if batch:
            padded = max(t.num_packed for t in trees)
            priced[0] += cost.round_ms(padded, len(batch), drafted=bool(drafting))
            priced[1] += 1
        return account(e, batch, trees, masses, drafting, marks)

    row: dict = {}
    table = type(cost)  # a slots dataclass: its readers are frozen on the class, for these runs only
    frozen = (table.observe_verify, table.observe_draft)
    table.observe_verify = table.observe_draft = lambda *a, **k: None
    engine_module.account = priced_account
    try:
        for way in (OWN, AHEAD, AHEAD, OWN):
            engine_module.device_trees = sizing if way == AHEAD else (
                lambda *a, **k: sizing(*a, **{**k, "predicted": None}))
            reads, priced[:] = engine.host_reads.count, [0.0, 0]
            seqs = serve_method(engine, AUTO, prompts, max_new, c)[2]
            rounds = sum(len(s.accept_lengths) for s in seqs)
            drafted = [n for s in seqs for n, d in zip(s.budgets, s.drafted) if d]
            run = {"request_rounds": rounds, "R": sum(sum(s.accept_lengths) for s in seqs) / rounds,
                   "nodes_per_drafted_round": float(np.mean(drafted)) if drafted else 0.0,
                   "drafted_share": len(drafted) / rounds, "device_reads": engine.host_reads.count - reads,
                   "decode_rounds": priced[1],
                   "tokens_per_priced_ms": sum(len(s.tokens) for s in seqs) / priced[0],
                   "equal_to_ar": sum(a.tokens == b.tokens for a, b in zip(seqs, ar)), "requests": len(seqs)}
            row.setdefault(way, []).append(run)
    finally:
        engine_module.device_trees, engine_module.account = sizing, account
        table.observe_verify, table.observe_draft = frozen
        engine.device_trees = False
    return row


def page(report: dict) -> str:
    both = lambda runs, key, f: " / ".join(format(r[key], f) for r in runs)  # noqa: E731
    lines = ["# auto sized ahead vs on the round's own masses (device trees)\n",
             f"`{report['command']}` at code {report['code']} ({report['minutes']:.1f} min). "
             f"Machine: {json.dumps(report['machine'])}.\n", __doc__.split("\n\n", 2)[2].strip() + "\n",
             "Each cell gives the way's two runs (own / ahead / ahead / own order).\n",
             "| cell | sizing | tokens / priced ms | R | request-rounds | nodes / drafted round | drafted "
             "| device reads / decode rounds | = AR |", "|---|---|---|---|---|---|---|---|---|"]
    for name, row in report["cells"].items():
        for way, runs in row.items():
            lines.append(f"| {name} | {way} | {both(runs, 'tokens_per_priced_ms', '.4f')} | {both(runs, 'R', '.2f')} "
                         f"| {both(runs, 'request_rounds', 'd')} | {both(runs, 'nodes_per_drafted_round', '.1f')} "
                         f"| {both(runs, 'drafted_share', '.0%')} | "
                         + " / ".join(f"{r['device_reads']} / {r['decode_rounds']}" for r in runs)
                         + f" | {min(r['equal_to_ar'] for r in runs)} / {runs[0]['requests']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="writes OUT.json and OUT.md")
    ap.add_argument("--cells", default=CELLS, help="b1:<domain> or c<C>:all-at-once / c<C>:continuous, comma-separated")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--num-prompts", type=int, default=6)
    args = ap.parse_args(argv)
    from runtime.engine.build import build_engine

    began, built = time.time(), build_engine()
    cells = {}
    for name in args.cells.split(","):
        cells[name] = run_cell(built.engine, built.encode, name, args.max_new_tokens, args.num_prompts)
        print(name, json.dumps(cells[name]), flush=True)
    report = {"command": f"python -m perf.auto_ahead --out {args.out} --cells {args.cells}", "code": code_version(),
              "minutes": (time.time() - began) / 60, "machine": machine_info(), "cells": cells}
    Path(args.out + ".json").write_text(json.dumps(report, indent=1))
    Path(args.out + ".md").write_text(page(report))


if __name__ == "__main__":
    main()
