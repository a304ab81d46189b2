"""Verify latency by target backend: torch fp32, torch bf16 and onnxruntime fp32
(`runtime.backends.ort_target.OrtTarget`), at 1 and 2 threads, by packed count n.

    python -m perf.bench backends [--prefix 256] [--widths 1,2,4,8,16,32,64] [--threads 1,2]
                                  [--out perf/results/backends_cpu]

Protocol (`runtime.engine.latency_probe`, the engine's own pass): prefill P random tokens
once per column (backend × threads), then time ONE verify pass (B = 1, through the
backend's `verify`, as the engine calls it) over the same best-first tree of n - 1 nodes
on random marginals in every column, `warmup` untimed rounds, then
`repeats` timed ones; each round visits every (n, column) pair in turn (interleaved, so
load drift on a shared machine hits every column alike) with a short pause before each
call so the previous column's spinning worker threads park. A verify never commits: the
prefix stays P. Median, p10 and p90 per cell. No taps (a concat, ~free on every backend).
Writes <out>.json (with the machine: CPU model, cores, ISA flags, torch/onnxruntime
versions), <out>.md (the table) and <out>.png (ms vs n).
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import click
import numpy as np
import torch
from tqdm import tqdm

from perf.plots import plt, save_figure
from perf.report import machine_info, md_table
from perf.run import command_line, ints, write_outputs
from runtime.backends.ort_target import OrtTarget
from runtime.engine.backend import TorchTarget
from runtime.engine.latency_probe import LatencyProbe, Stats, probe_tree, random_prompt
from runtime.model.llama import LlamaTarget

BACKENDS = ("torch-fp32", "torch-bf16", "ort-fp32")
WIDTHS = (1, 2, 4, 8, 16, 32, 64)
PAUSE_S = 0.02  # before each timed call: lets spinning intra-op threads of the last column park


@dataclass(frozen=True, slots=True)
class Column:
    backend: str  # one of BACKENDS
    threads: int

    @property
    def label(self) -> str:
        return f"{self.backend} t{self.threads}"


def make_backends(model: LlamaTarget, columns: Sequence[Column], cache_dir: str | Path | None) -> dict[str, Any]:
    """One backend per column; the bf16 weights are one copy shared by its thread counts."""
    if unknown := {c.backend for c in columns} - set(BACKENDS):
        raise ValueError(f"backends must be among {BACKENDS}, got {sorted(unknown)}")
    bf16 = copy.deepcopy(model).to(torch.bfloat16) if any(c.backend == "torch-bf16" for c in columns) else None
    return {c.label: OrtTarget(model, (), threads=c.threads, cache_dir=cache_dir) if c.backend == "ort-fp32"
            else TorchTarget(bf16 if c.backend == "torch-bf16" else model) for c in columns}


def run(model: LlamaTarget, columns: Sequence[Column], widths: Sequence[int] = WIDTHS, prefix: int = 256,
        repeats: int = 7, warmup: int = 1, cache_dir: str | Path | None = None, seed: int = 0,
        progress: bool = True) -> dict[str, dict[int, list[float]]]:
    """Timed verify ms per column label and packed count n (`repeats` samples each)."""
    if prefix < 1 or repeats < 1 or warmup < 0 or not widths or min(widths) < 1:
        raise ValueError("need prefix >= 1, repeats >= 1, warmup >= 0 and packed counts >= 1")
    threads_before = torch.get_num_threads()
    vocab, rng = model.config.vocab_size, np.random.default_rng(seed)
    prompt = random_prompt(vocab, prefix, seed)
    trees = {n: probe_tree(n, "tree", rng, vocab) for n in widths}  # the same pass in every column
    packs = {n: np.concatenate([[1], trees[n].tokens]).astype(np.int64) for n in widths}
    backends = make_backends(model, columns, cache_dir)
    probes: dict[str, LatencyProbe] = {}
    try:
        for col in columns:
            torch.set_num_threads(col.threads)
            probes[col.label] = LatencyProbe(backends[col.label], prompt, 1, max(widths), seed=seed)
        samples: dict[str, dict[int, list[float]]] = {c.label: {n: [] for n in widths} for c in columns}
        bar = tqdm(total=(warmup + repeats) * len(widths) * len(columns), desc="verify", unit="pass",
                   disable=not progress)
        for round_ in range(warmup + repeats):
            for n in widths:
                for col in columns:
                    torch.set_num_threads(col.threads)
                    time.sleep(PAUSE_S)
                    elapsed, _ = probes[col.label].time_verify([trees[n]], [packs[n]])  # pending rows only: P stays
                    if round_ >= warmup:
                        samples[col.label][n].append(elapsed)
                    bar.update()
        bar.close()
    finally:
        torch.set_num_threads(threads_before)
        for p in probes.values():
            p.close()
    return samples


def markdown_table(stats: dict[str, dict[str, dict[str, float]]], columns: Sequence[Column],
                   stat: str = "median") -> str:
    """`stat` ms per n and column, then onnxruntime's speed-up over torch fp32 per thread count."""
    labels = [c.label for c in columns]
    ratios = [t for t in sorted({c.threads for c in columns})
              if f"ort-fp32 t{t}" in stats and f"torch-fp32 t{t}" in stats]
    body = [[n, *(f"{stats[lab][n][stat]:.1f}" for lab in labels),
             *(f"{stats[f'torch-fp32 t{t}'][n][stat] / stats[f'ort-fp32 t{t}'][n][stat]:.2f}x" for t in ratios)]
            for n in next(iter(stats.values()))]
    return md_table(["n", *(f"{lab} ms" for lab in labels), *(f"torch-fp32/ort t{t}" for t in ratios)], body) + "\n"


def plot(stats: dict[str, dict[str, dict[str, float]]], out: str | Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = {b: f"C{i}" for i, b in enumerate(BACKENDS)}
    for label, by_n in stats.items():
        backend, threads = label.rsplit(" t", 1)
        n = [int(k) for k in by_n]
        ax.plot(n, [by_n[k]["median"] for k in by_n], marker="o", markersize=3, color=colors[backend],
                linestyle="-" if threads == "1" else "--", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")  # bf16 without AVX512-BF16 is 10x the rest at n = 64
    ax.set_xlabel("packed tokens n = N + 1 (solid: 1 thread, dashed: 2)")
    ax.set_ylabel("verify ms (median, log scale)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return save_figure(fig, out)


def write_report(samples: dict[str, dict[int, list[float]]], columns: Sequence[Column], out: str | Path,
                 meta: dict[str, Any]) -> dict[str, Any]:
    """<out>.json, <out>.md, <out>.png; returns the JSON report."""
    stats = {label: {str(n): asdict(Stats.of(v)) for n, v in by_n.items()} for label, by_n in samples.items()}
    m, target = machine_info(), meta.get("target", "target")
    report = {"benchmark": "target verify latency by backend (perf/bench_backends.py)", **meta, "machine": m,
              "ms": stats, "samples_ms": {k: {str(n): [round(x, 2) for x in v] for n, v in by_n.items()}
                                          for k, by_n in samples.items()}}
    reproduce = f"Reproduce: `{meta['command']}`\n\n" if meta.get("command") else ""
    page = (f"# Verify latency by backend\n\n{reproduce}{target}, prefix P = {meta['prefix']}, B = 1, median of "
            f"{meta['repeats']} interleaved passes, ms. Machine: {m['cpu_model']}, {m['cpu_count']} cores, ISA "
            f"{', '.join(m['isa']) or 'baseline'}; torch {m['torch']}, onnxruntime {m['onnxruntime']}.\n"
            f"{meta.get('note', '')}\n\n{markdown_table(stats, columns)}\nFastest decile (p10 ms; load spikes "
            f"removed):\n\n{markdown_table(stats, columns, 'p10')}")
    write_outputs(str(out), report, page)
    plot(stats, Path(out).with_suffix(".png"), f"{target}: verify ms at P = {meta['prefix']}")
    return report


@click.command()
@click.option("--target", default="embedded", show_default=True, help="--target of the one loader (fp32).")
@click.option("--prefix", type=int, default=256, show_default=True, help="Committed prefix P of the KV cache.")
@click.option("--widths", default=",".join(map(str, WIDTHS)), show_default=True,
              help="Packed counts n, comma-separated.")
@click.option("--threads", default="1,2", show_default=True, help="Thread counts, comma-separated.")
@click.option("--backends", default=",".join(BACKENDS), show_default=True, help="Backends, comma-separated.")
@click.option("--repeats", type=int, default=7, show_default=True, help="Timed passes per cell (median reported).")
@click.option("--warmup", type=int, default=1, show_default=True, help="Untimed rounds over every cell first.")
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="Exported-graph cache (default $CAST_CACHE_DIR/onnx).")
@click.option("--note", default="", help="A line for the report (e.g. what else loaded the machine).")
@click.option("--out", default="perf/results/backends_cpu", show_default=True, help="Output stem: .json, .md, .png.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report on stdout.")
@click.pass_context
def backends(ctx: click.Context, target: str, prefix: int, widths: str, threads: str, backends: str, repeats: int,
             warmup: int, cache_dir: str | None, note: str, out: str, as_json: bool) -> None:
    """Time one verify pass per backend x threads x packed count; write JSON, markdown and PNG."""
    from runtime.loader import load_models

    try:
        columns = [Column(b, t) for t in ints(threads, "--threads") for b in backends.split(",")]
        models = load_models(target, "none", dtype=torch.float32)
        samples = run(models.target, columns, ints(widths, "--widths"), prefix, repeats, warmup, cache_dir)
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    meta = {"target": models.name, "prefix": prefix, "repeats": repeats, "warmup": warmup, "batch": 1,
            "note": note, "command": command_line(ctx)}
    report = write_report(samples, columns, out, meta)
    click.echo(json.dumps(report, indent=2) if as_json else Path(out).with_suffix(".md").read_text())
