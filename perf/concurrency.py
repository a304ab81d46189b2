"""Throughput over concurrency on the default engine, in process (the code path the servers run).

    python -m perf.concurrency --dataset gsm8k --num-prompts 16 --max-new-tokens 32 \
        --concurrency 1,4,16,32 --methods ar,chain,cast:3,cast:15,cast:auto \
        --out perf/results/concurrency_cpu.json

One engine (`build_engine` defaults: the execution autoconfig picks on this machine) serves
the same request pool for every (concurrency c, method): at most c requests live at once,
a queued request joins as soon as one leaves (continuous batching; `LLMEngine.step` runs
one round for every live request). Each request is greedy with `ignore_eos`, so every run
commits the same token count. Throughput = generated tokens / wall seconds of the whole run
(prefill included), and decode throughput = tokens after each first one / seconds inside
`step` (paper App. D). Methods run one after another at each concurrency, in the order given,
after a warm-up run of each; every output is checked against AR at c = 1 token for token.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections import deque
from datetime import datetime, timezone
from pathlib import Path

import click
import torch
from tqdm import tqdm

from perf.datasets import load_dataset
from perf.harness import parse_methods
from runtime.device import device_name
from runtime.engine import LLMEngine, Request


def serve(engine: LLMEngine, requests: list[Request], concurrency: int) -> tuple[float, float, list[list[int]], int]:
    """Run `requests` with at most `concurrency` live -> (wall s, s inside step, tokens per request, rounds)."""
    queue, live, rounds, stepping = deque(enumerate(requests)), {}, 0, 0.0
    out: list[list[int]] = [[] for _ in requests]
    start = time.perf_counter()
    while queue or engine.active:
        while queue and len(engine.active) < concurrency:
            i, req = queue.popleft()
            seq = engine.add_request(req)
            live[id(seq)] = (i, seq)
            if seq.done:
                out[i] = list(seq.tokens)
        began = time.perf_counter()
        for seq in engine.step():
            i, _ = live.pop(id(seq))
            out[i] = list(seq.tokens)
        stepping += time.perf_counter() - began
        rounds += 1
    return time.perf_counter() - start, stepping, out, rounds


def run(engine: LLMEngine, prompts: list[list[int]], max_new: int, methods, levels: list[int]) -> list[dict]:
    """Every (concurrency, method) cell: throughput and whether outputs equal AR alone."""
    def requests(m) -> list[Request]:
        auto = m.method == "cast" and m.budget is None
        return [Request(p, max_new, method=m.method, budget="auto" if auto else m.budget,
                        draft_gate=m.draft_gate if auto else None, ignore_eos=True) for p in prompts]

    for m in methods:  # warm-up: graphs, caches, the cost model's first readings
        serve(engine, requests(m)[:2], 2)
    reference = serve(engine, [Request(p, max_new, method="ar", ignore_eos=True) for p in prompts], 1)[2]
    rows = []
    with tqdm(total=len(levels) * len(methods), desc="concurrency x method") as bar:
        for c in levels:
            for m in methods:
                wall, stepping, out, rounds = serve(engine, requests(m), c)
                tokens = sum(len(t) for t in out)
                rows.append({"concurrency": c, "method": m.label, "tokens": tokens, "wall_s": wall,
                             "tokens_per_s": tokens / wall, "decode_s": stepping,
                             "decode_tokens_per_s": (tokens - len(out)) / stepping, "rounds": rounds,
                             "requests": len(out), "equal_to_ar": sum(a == b for a, b in zip(out, reference))})
                bar.update()
    return rows


def table(rows: list[dict], methods, levels: list[int], key: str = "tokens_per_s") -> str:
    """Markdown: `key` per method (rows) and concurrency (columns), then each cell over AR's."""
    by = {(r["concurrency"], r["method"]): r for r in rows}
    head = "| method | " + " | ".join(f"c={c}" for c in levels) + " | x AR at each c |"
    lines = [head, "|" + "---|" * (len(levels) + 2)]
    for m in methods:
        cells = [f"{by[c, m.label][key]:.1f}" for c in levels]
        ratios = [by[c, m.label][key] / by[c, "ar"][key] for c in levels]
        equal = all(by[c, m.label]["equal_to_ar"] == by[c, m.label]["requests"] for c in levels)
        lines.append(f"| {m.label}{'' if equal else ' (differs from AR!)'} | " + " | ".join(cells) + " | "
                     + " / ".join(f"{r:.2f}" for r in ratios) + " |")
    return "\n".join(lines)


@click.command()
@click.option("--dataset", default="gsm8k", show_default=True, help="named set or trtllm-bench JSONL")
@click.option("--num-prompts", default=16, show_default=True, type=click.IntRange(1), help="requests in the pool")
@click.option("--max-new-tokens", default=32, show_default=True, type=click.IntRange(1), help="tokens per request")
@click.option("--concurrency", default="1,4,16,32", show_default=True, help="comma-separated live-request limits")
@click.option("--methods", default="ar,chain,cast:3,cast:15,cast:auto", show_default=True,
              help="comma-separated methods (ar first: ratios are to it)")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="report JSON (a .md table beside it)")
def main(dataset: str, num_prompts: int, max_new_tokens: int, concurrency: str, methods: str, out: str | None):
    """Throughput of each method at each concurrency on the default engine, in process."""
    from runtime.engine.build import build_engine

    levels = [int(c) for c in concurrency.split(",")]
    if any(c < 1 for c in levels):
        raise click.BadParameter("concurrency levels must be >= 1", param_hint="--concurrency")
    specs = parse_methods(methods)
    if specs[0].label != "ar":
        raise click.BadParameter("list ar first: every ratio is to it", param_hint="--methods")
    built = build_engine()
    prompts = [built.encode(r.prompt) for r in load_dataset(dataset, num_prompts)]
    rows = run(built.engine, prompts, max_new_tokens, specs, levels)
    text = (f"End to end (prefill included), tokens/s:\n\n{table(rows, specs, levels)}\n\n"
            f"Decode rounds only (paper App. D: prefill excluded), tokens/s:\n\n"
            f"{table(rows, specs, levels, 'decode_tokens_per_s')}")
    click.echo(text)
    if out:
        report = {"command": "python -m perf.concurrency " + " ".join(
                      f"--{k} {v}" for k, v in (("dataset", dataset), ("num-prompts", num_prompts),
                                                ("max-new-tokens", max_new_tokens), ("concurrency", concurrency),
                                                ("methods", methods))),
                  "machine": {"cpu": device_name(torch.device("cpu")), "cores": os.cpu_count(),
                              "threads": built.describe()["threads"], "arch": platform.machine()},
                  "engine": built.describe(), "date": datetime.now(timezone.utc).isoformat(), "rows": rows}
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=2))
        Path(out).with_suffix(".md").write_text(text + "\n")


if __name__ == "__main__":
    main()
