"""Two methods' decode rounds side by side, one process, runs alternating (issue 40's where-does-it-pay check).

    python -m perf.round_compare --methods cast:3,cast:auto --concurrency 4 --mode continuous --repeats 8

The never_slower cell's prompts (synthetic + GSM8K, 48 new tokens, `perf.never_slower_aa.prompts`), each method
run once untimed, then `--repeats` runs each, the order alternating. Per run: tokens/s, rounds, committed tokens
per request-round (R), and over the full-batch rounds the median round ms (draft to commit) and its host parts:
the draft gates' choice (`_drafts`), tree building, and the bookkeeping after the commit (`account`). Then the
means over runs and the paired tokens/s ratio (second method over first). Methods: ar, chain, cast:N, cast:auto.

    python -m perf.round_compare --methods ar,cast:auto --concurrency 16 --temperature 1 \
        --aiperf-inputs OUT/c1-ar-r0/inputs.json --max-new-tokens 24 --repeats 8

replays a `perf/aiperf_run.sh` run's load in process: its chat prompts as the server renders them, sampled at
T = 1 (what the server does for AIPerf, which sends no temperature), max(16, 8 x c) requests joining as others finish.
Through the server, AIPerf shares the 2 cores and one run moves 5-10%; here the engine's own cost shows.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import runtime.engine.engine as engine_module
from perf.harness import MethodSpec
from perf.never_slower import METHODS
from perf.never_slower_bar import paired
from perf.never_slower_aa import prompts as cell_prompts
from perf.throughput import serve_method

PARTS = ("round", "drafts", "trees", "account")


def method(name: str) -> MethodSpec:
    """`ar`, `chain`, `cast:N` or `cast:auto` (the server's default, gated)."""
    if name == "cast:auto":
        return METHODS[2]
    if name in ("ar", "chain"):
        return MethodSpec(name)
    kind, _, budget = name.partition(":")
    if kind != "cast" or not budget.isdigit():
        raise SystemExit(f"method {name!r}: use ar, chain, cast:N or cast:auto")
    return MethodSpec("cast", int(budget))


class Timed:
    """Times the engine's round parts while installed (`install` / `remove`): `rows` per round, and `host_ms`,
    the gates' choice and the bookkeeping of every round (`perf/gate_overhead.py` reads it)."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.host_ms = 0.0  # every `_drafts` and `account` call's ms since installed (or since reset)
        self._drafts_ms = 0.0

    def install(self) -> None:
        self._account, self._drafts = engine_module.account, engine_module.LLMEngine._drafts
        timed = self

        def drafts(engine, batch):
            t = time.perf_counter()
            out = timed._drafts(engine, batch)
            timed._drafts_ms = (time.perf_counter() - t) * 1e3
            timed.host_ms += timed._drafts_ms
            return out

        def account(engine, batch, trees, masses, drafting, marks):
            t = time.perf_counter()
            timed._account(engine, batch, trees, masses, drafting, marks)
            t0, t1, t2, _, t4 = marks
            account_ms = (time.perf_counter() - t) * 1e3
            timed.host_ms += account_ms
            if batch:
                timed.rows.append((len(batch), len(drafting), sum(s.accept_lengths[-1] for s in batch),
                                   (t4 - t0) * 1e3, timed._drafts_ms, (t2 - t1) * 1e3, account_ms))
        engine_module.account, engine_module.LLMEngine._drafts = account, drafts

    def remove(self) -> None:
        engine_module.account, engine_module.LLMEngine._drafts = self._account, self._drafts


def compare(engine, batch: list, c: int, specs: list[MethodSpec], repeats: int, max_new: int, say=print,
            temperature: float = 0.0) -> dict:
    """Runs alternating; -> {label: [per-run dict]} and the paired tokens/s ratio of specs[1] over specs[0].
    temperature > 0: sampled, both methods of repeat r with the same seeds."""
    for spec in specs:
        serve_method(engine, spec, batch, max_new, c, temperature, seed=10**6)
    timed, runs = Timed(), {s.label: [] for s in specs}
    timed.install()
    try:
        for r in range(repeats):
            for spec in specs if r % 2 == 0 else specs[::-1]:
                timed.rows.clear()
                wall, _, seqs, *_ = serve_method(engine, spec, batch, max_new, c, temperature, seed=1000 * r)
                a = np.array(timed.rows, np.float64).reshape(-1, 7)
                full = a[a[:, 0] == c]
                run = {"tokens_per_s": sum(len(s.tokens) for s in seqs) / wall, "rounds": len(a),
                       "R": float(a[:, 2].sum() / a[:, 0].sum()) if len(a) else 0.0, "full_rounds": len(full),
                       "drafted_request_rounds": int(a[:, 1].sum())}
                run |= {p: float(np.median(full[:, 3 + i])) if len(full) else 0.0 for i, p in enumerate(PARTS)}
                runs[spec.label].append(run)
                say(f"{spec.label:10s} " + " ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                    for k, v in run.items()))
    finally:
        timed.remove()
    first, second = ([x["tokens_per_s"] for x in runs[s.label]] for s in specs)
    return {"runs": runs, "paired": paired(second, first)}


def aiperf_prompts(tokenizer, path: str, n: int) -> list[list[int]]:
    """n prompts (repeated in order) from an AIPerf artifact's inputs.json: each session's first chat
    payload, rendered with the chat template and tokenized as `serve --api openai` does."""
    from runtime.llm.requests import tokenize
    from runtime.serving.openai.app import render_chat

    try:
        sessions = json.loads(Path(path).read_text())["data"]
        chats = [s["payloads"][0]["messages"] for s in sessions]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        raise SystemExit(f"--aiperf-inputs {path}: not an AIPerf inputs.json ({err}); pass the inputs.json "
                         "of a run's artifact folder (perf/aiperf_run.sh OUT/c1-ar-r0/inputs.json)") from err
    if not chats:
        raise SystemExit(f"--aiperf-inputs {path} holds no sessions")
    ids = [tokenize(tokenizer, render_chat(tokenizer, m), add_special_tokens=False) for m in chats]
    return [ids[i % len(ids)] for i in range(n)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="cast:3,cast:auto", help="two methods: ar, chain, cast:N, cast:auto")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--mode", default="continuous", choices=("continuous", "all-at-once"))
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.0, help="sample at this temperature (0: greedy)")
    ap.add_argument("--aiperf-inputs", metavar="JSON", help="instead of the cell's prompts: the chat prompts of an "
                    "AIPerf run (its artifact folder's inputs.json), rendered and tokenized as the server does; "
                    "max(16, --per-slot x --concurrency) requests (as perf/aiperf_run.sh sends), joining as others "
                    "finish (with --temperature 1: the server's load without HTTP)")
    ap.add_argument("--per-slot", type=int, default=8, help="with --aiperf-inputs: requests per concurrency slot "
                    "(perf/aiperf_run.sh's PER_SLOT)")
    args = ap.parse_args(argv)
    specs = [method(m) for m in args.methods.split(",")]
    if len(specs) != 2 or args.repeats < 2:
        raise SystemExit("--methods names two methods and --repeats is >= 2 (the ratio is paired by repeat)")
    if args.per_slot < 1:
        raise SystemExit(f"--per-slot is >= 1 request per concurrency slot, got {args.per_slot}")
    from runtime.engine.build import build_engine

    built = build_engine()
    if args.aiperf_inputs:
        n = max(16, args.per_slot * args.concurrency)
        batch, c = aiperf_prompts(built.models.tokenizer, args.aiperf_inputs, n), args.concurrency
    else:
        batch, c = cell_prompts(built.encode, f"c{args.concurrency}:{args.mode}", 8)
    out = compare(built.engine, batch, c, specs, args.repeats, args.max_new_tokens, temperature=args.temperature)
    for label, runs in out["runs"].items():
        print(f"{label:10s} mean " + " ".join(f"{k} {np.mean([r[k] for r in runs]):.2f}" for k in runs[0]))
    ratio = out["paired"]
    print(f"{specs[1].label} / {specs[0].label} tokens/s, paired: {ratio[0]:.3f} (95% upper bound {ratio[1]:.3f})")


if __name__ == "__main__":
    main()
