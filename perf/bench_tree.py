"""`python -m perf.bench tree`: tree-construction speed, `build_tree` / `allocate_shared_budget`
against a plain heapq best-first (paper App. C written the obvious way).

The reference is a max-heap on the path score, seeded with the root's top-K children; each
pop emits a node and pushes its K children at the next depth (zero-mass children are never
pushed); stop after N pops. Ties follow Theorem 1's order (shorter prefix first, then
lexicographic in rank), as `cast_trtllm.tree` does, so both must return the same node set;
the run checks that before timing. The process is pinned to one core, torch to one thread.
(A round's whole host work on a real engine is timed by `cast-trtllm probe`.)

Drafter marginals are synthetic but shaped like a DFlash head's (paper Fig. 4c): at block
position j the top-1 probability is drawn from Beta(8 m_j, 8 (1 - m_j)) with
m_j = 0.85 * 0.92^(j-1); the rest of the mass is spread over a 49,152-token vocabulary by a
Zipf(1.1) law; the top-K are kept. Seeded (numpy default_rng).

Requirement (issue 23): build_tree at N = 127, K = 8, L = 15 runs >= 5x the heapq reference;
the report's `build_tree.meets_required_speedup` says whether this run did.
"""

from __future__ import annotations

import heapq
import json
import os
import statistics
import time
from pathlib import Path

import click
import numpy as np

from cast_trtllm.tree import Tree, allocate_shared_budget, build_tree

VOCAB = 49152  # the embedded target's vocabulary
REQUIRED_SPEEDUP = 5.0  # build_tree vs heapq at the default shape (issue 23)


def synthetic_marginals(L: int, K: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(topk_ids [L, K] int64, topk_logprobs [L, K] float64) of peaked, depth-decaying marginals."""
    zipf = 1.0 / np.arange(1, VOCAB, dtype=np.float64) ** 1.1  # tail ranks 2..V
    zipf /= zipf.sum()
    ids = np.empty((L, K), np.int64)
    lp = np.empty((L, K), np.float64)
    for j in range(L):
        m = 0.85 * 0.92 ** j
        top1 = rng.beta(8 * m, 8 * (1 - m))
        probs = np.sort(np.concatenate([[top1], (1 - top1) * zipf]))[::-1]  # a peaked tail can outrank a weak top-1
        lp[j] = np.log(probs[:K])
        ids[j] = rng.choice(VOCAB, size=K, replace=False)
    return ids, lp


def heap_best_first(per_request: list[tuple[np.ndarray, np.ndarray]], total: int,
                    cap: int | None = None) -> list[Tree]:
    """Reference App. C: global best-first over B disjoint universes, one Tree per request.

    cap: a request that holds `cap` nodes takes no more; the budget goes on down the order.
    """
    # entry: (-score, depth, request, rank path, parent node index within its request)
    heap: list[tuple[float, int, int, tuple[int, ...], int]] = []
    for r, (_, lp) in enumerate(per_request):
        for k in range(lp.shape[1]):
            if lp[0, k] > -np.inf:
                heapq.heappush(heap, (-lp[0, k], 1, r, (k,), -1))
    nodes: list[list[tuple[int, int, int, float]]] = [[] for _ in per_request]  # (token, depth, parent, score)
    while heap and sum(map(len, nodes)) < total:
        neg, depth, r, ranks, parent = heapq.heappop(heap)
        if cap is not None and len(nodes[r]) >= cap:
            continue
        ids, lp = per_request[r]
        nodes[r].append((int(ids[depth - 1, ranks[-1]]), depth, parent, -neg))
        if depth < lp.shape[0]:
            me = len(nodes[r]) - 1
            for k in range(lp.shape[1]):
                if lp[depth, k] > -np.inf:
                    heapq.heappush(heap, (neg - lp[depth, k], depth + 1, r, ranks + (k,), me))
    return [Tree(np.array([n[0] for n in ns], np.int64), np.array([n[1] for n in ns], np.int32),
                 np.array([n[2] for n in ns], np.int32), np.array([n[3] for n in ns], np.float64))
            for ns in nodes]


def token_paths(tree: Tree) -> set[tuple[int, ...]]:
    paths: list[tuple[int, ...]] = []
    for i in range(tree.size):
        parent = int(tree.parent[i])
        paths.append((paths[parent] if parent >= 0 else ()) + (int(tree.tokens[i]),))
    return set(paths)


def median_us(fn, repeats: int) -> float:
    for _ in range(max(3, repeats // 10)):  # warm-up
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def run(N: int, K: int, L: int, batch: int, total: int, repeats: int, seed: int) -> dict:
    """Both constructions at one shape each, checked against the reference, then timed against it."""
    rng = np.random.default_rng(seed)
    single = synthetic_marginals(L, K, rng)
    many = [synthetic_marginals(L, K, rng) for _ in range(batch)]
    if token_paths(build_tree(*single, N)) != token_paths(heap_best_first([single], N)[0]):
        raise AssertionError("build_tree and the heapq reference chose different node sets")
    trees = allocate_shared_budget(many, total)
    if [token_paths(t) for t in trees] != [token_paths(t) for t in heap_best_first(many, total)]:
        raise AssertionError("allocate_shared_budget and the heapq reference chose different node sets")
    cases = {
        "build_tree": (lambda: build_tree(*single, N), lambda: heap_best_first([single], N),
                       {"budget_N": N, "rank_cap_K": K, "block_L": L}),
        "allocate_shared_budget": (lambda: allocate_shared_budget(many, total), lambda: heap_best_first(many, total),
                                   {"batch_B": batch, "total_budget_M": total, "rank_cap_K": K, "block_L": L,
                                    "widths": sorted((t.size for t in trees), reverse=True)}),
    }
    results = {}
    for name, (ours, reference, shape) in cases.items():
        ours_us, ref_us = median_us(ours, repeats), median_us(reference, repeats)
        results[name] = {**shape, "cast_trtllm_median_us": round(ours_us, 1), "heapq_median_us": round(ref_us, 1),
                         "speedup_vs_heapq": round(ref_us / ours_us, 2), "same_node_set": True}
    results["build_tree"]["required_speedup"] = REQUIRED_SPEEDUP
    results["build_tree"]["meets_required_speedup"] = results["build_tree"]["speedup_vs_heapq"] >= REQUIRED_SPEEDUP
    return results


@click.command()
@click.option("--out", type=click.Path(dir_okay=False), default="perf/results/tree_bench.json",
              show_default=True, help="Where to write the JSON result.")
@click.option("--budget", "N", type=int, default=127, show_default=True, help="Budget N for build_tree.")
@click.option("--rank-cap", "K", type=int, default=8, show_default=True, help="Rank cap K per position.")
@click.option("--block", "L", type=int, default=15, show_default=True, help="Drafted positions L.")
@click.option("--batch", type=int, default=32, show_default=True, help="Requests B for allocate_shared_budget.")
@click.option("--total", type=int, default=512, show_default=True, help="Shared budget M over the batch.")
@click.option("--repeats", type=int, default=200, show_default=True, help="Timed calls per case (median reported).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic marginals.")
@click.pass_context
def tree(ctx: click.Context, out: str, N: int, K: int, L: int, batch: int, total: int, repeats: int, seed: int
         ) -> None:
    """Tree construction against a heapq best-first reference (same node sets, then timed); JSON."""
    import torch

    from perf.report import machine_info
    from perf.run import command_line

    cores, threads = getattr(os, "sched_getaffinity", lambda _: None)(0), torch.get_num_threads()
    core = None if cores is None else min(cores)
    try:  # one core, one thread: a second thread would only spin against the first
        if cores is not None:
            os.sched_setaffinity(0, {core})
        torch.set_num_threads(1)
        results = run(N, K, L, batch, total, repeats, seed)
    finally:
        torch.set_num_threads(threads)
        if cores is not None:
            os.sched_setaffinity(0, cores)
    report = {"benchmark": "cast_trtllm.tree vs heapq best-first (paper App. C)", "command": command_line(ctx),
              "marginals": f"synthetic peaked DFlash-like (perf/bench_tree.py), seed {seed}", "repeats": repeats,
              "pinned_core": core, "machine": {**machine_info(), "numpy": np.__version__}, "results": results}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report, indent=2) + "\n")
    for name, r in results.items():
        click.echo(f"{name:24s} cast_trtllm {r['cast_trtllm_median_us']:9.1f} us   heapq {r['heapq_median_us']:9.1f} us"
                   f"   ratio {r['speedup_vs_heapq']:.2f}x   same node set: {r['same_node_set']}")
    click.echo(f"build_tree >= {REQUIRED_SPEEDUP:.0f}x heapq: {results['build_tree']['meets_required_speedup']}")
    click.echo(f"wrote {out}")
