"""Throughput over concurrency on one engine, in process (the code path the servers run).

The engine (`build_engine` defaults: the execution autoconfig picks on this machine)
serves the same request pool for every (concurrency c, method): at most c requests live at
once, a queued request joins as soon as one leaves (continuous batching; `LLMEngine.step`
runs one round for every live request). Each request is greedy with `ignore_eos`, so every
run commits the same token count. Throughput = generated tokens / wall seconds of the whole
run (prefill included); decode throughput = tokens after each first one / seconds inside
`step` (paper App. D). Methods run one after another at each concurrency, in the order
given, after a warm-up run of each; every output is checked against AR at c = 1 token for token.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Sequence

from tqdm import tqdm

from perf.harness import MethodSpec
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


def requests_for(spec: MethodSpec, prompts: Sequence[Sequence[int]], max_new: int) -> list[Request]:
    """One greedy `ignore_eos` request per prompt, with the method's per-request overrides."""
    auto = spec.method == "cast" and spec.budget is None
    return [Request(tuple(p), max_new, method=spec.method, budget="auto" if auto else spec.budget,
                    draft_gate=spec.draft_gate if auto else None, ignore_eos=True) for p in prompts]


def run(engine: LLMEngine, prompts: list[list[int]], max_new: int, methods: Sequence[MethodSpec],
        levels: Sequence[int], progress: bool = True) -> list[dict]:
    """Every (concurrency, method) cell: throughput and how many outputs equal AR alone."""
    for m in methods:  # warm-up: graphs, caches, the cost model's first readings
        serve(engine, requests_for(m, prompts[:2], min(max_new, 16)), 2)
    reference = serve(engine, requests_for(MethodSpec("ar"), prompts, max_new), 1)[2]
    rows = []
    with tqdm(total=len(levels) * len(methods), desc="concurrency x method", disable=not progress) as bar:
        for c in levels:
            for m in methods:
                bar.set_postfix_str(f"c={c} {m.label}")
                wall, stepping, out, rounds = serve(engine, requests_for(m, prompts, max_new), c)
                tokens = sum(len(t) for t in out)
                rows.append({"concurrency": c, "method": m.label, "tokens": tokens, "wall_s": wall,
                             "tokens_per_s": tokens / wall, "decode_s": stepping,
                             "decode_tokens_per_s": (tokens - len(out)) / stepping, "rounds": rounds,
                             "requests": len(out), "equal_to_ar": sum(a == b for a, b in zip(out, reference))})
                bar.update()
    return rows


def table(rows: list[dict], labels: Sequence[str], levels: Sequence[int], key: str = "tokens_per_s") -> str:
    """Markdown: `key` per method (rows) and concurrency (columns), then each cell over AR's."""
    by = {(r["concurrency"], r["method"]): r for r in rows}
    head = "| method | " + " | ".join(f"c={c}" for c in levels) + " | x AR at each c | = AR |"
    lines = [head, "|" + "---|" * (len(levels) + 3)]
    for label in labels:
        cells = [f"{by[c, label][key]:.1f}" for c in levels]
        ratios = [by[c, label][key] / by[c, "ar"][key] for c in levels]
        equal = sum(by[c, label]["equal_to_ar"] for c in levels)
        total = sum(by[c, label]["requests"] for c in levels)
        lines.append(f"| {label} | " + " | ".join(cells) + " | " + " / ".join(f"{r:.2f}" for r in ratios)
                     + f" | {equal}/{total}{'' if equal == total else '!'} |")
    return "\n".join(lines)
