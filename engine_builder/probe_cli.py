"""`cast-trtllm probe`: measure the deployed target's verify cost and write a width profile.

The measurement itself is `engine_builder.probe`; this module loads the models (the one
loader), runs it for the SKU's settings and writes the profile.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

import click
import torch

from cast_trtllm.profile import WidthProfile, save_profile
from engine_builder.probe import BACKENDS, DEFAULT_PACKED, DTYPES, SKU_DTYPE, ProbeSettings, measure, to_profile
from engine_builder.skus import SkuSpec, load_sku
from runtime.device import device_name
from runtime.drafter import DEFAULT_DRAFTER, load_drafter, random_drafter
from runtime.engine.latency_probe import Stats
from runtime.model.llama import LlamaTarget


# ------------------------------------------------------------------------------ loading
def load_target(spec: str, device: torch.device, dtype: torch.dtype) -> tuple[LlamaTarget, Any, str]:
    """(target, tokenizer, name) for --target, through the one loader (`runtime.loader`)."""
    from runtime.loader import load_models

    loaded = load_models(spec, "none", device, dtype)
    return loaded.target, loaded.tokenizer, loaded.name


def load_probe_drafter(spec: str | None, model: LlamaTarget):
    """(drafter, description): a checkpoint dir, else the shipped default, else an untrained
    drafter of the default shape (1 layer, block 16): its forward costs the same."""
    path = Path(spec) if spec else DEFAULT_DRAFTER
    if spec or path.is_dir():
        return load_drafter(path, model.config), str(path)
    return random_drafter(model.config, num_layers=1, block_size=16), "untrained 1-layer drafter, block 16"


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise click.BadParameter(f"expected a comma list of integers, got {text!r}", param_hint=flag) from None


def summary_table(tables: dict, profile: WidthProfile) -> str:
    lines = ["| prefix | batch | n | verify ms (p10-p90) | host overhead ms |", "|---|---|---|---|---|"]
    for p, row in tables["verify"].items():
        for b, cells in row.items():
            for n, s in cells.items():
                oh = tables["overhead"][p][b][n].median
                lines.append(f"| {p} | {b} | {n} | {s.median:.1f} ({s.p10:.1f}-{s.p90:.1f}) | {oh:.2f} |")
            fit, d = profile.fits[p][b], tables["drafter"][p][b]
            lines.append(f"prefix {p} batch {b}: slope {fit.slope_ms:.3f} ms/token, intercept {fit.intercept_ms:.1f} "
                         f"ms, cliffs {list(profile.cliffs[p][b])}, drafter {d.median:.1f} ms")
    lines.append(f"buckets {list(profile.buckets)}")
    return "\n".join(lines)


@click.command()
@click.option("--sku", required=True, help="Build spec name (engine_builder/skus/NAME.yaml); picks device and dtype.")
@click.option("--target", "target_spec", default="embedded", show_default=True,
              help="'embedded' (SmolLM2-135M) or a Hugging Face model directory.")
@click.option("--drafter", default=None, help="DFlash checkpoint dir (default: runtime/drafter/default, else an "
                                              "untrained drafter of the default shape).")
@click.option("--prefix", default=None, help="Comma list of KV-prefix lengths (default: the SKU's prefix_buckets).")
@click.option("--batch", default="1", show_default=True,
              help="Comma list of batch sizes (B requests verified in ONE batched pass, as the engine runs them).")
@click.option("--backend", type=click.Choice(BACKENDS), default="torch", show_default=True,
              help="The engine's target + drafter backend to time (onnxruntime: fp32 CPU only).")
@click.option("--packed", default=",".join(map(str, DEFAULT_PACKED)), show_default=True,
              help="Comma list of packed counts n = N + 1 per request.")
@click.option("--warmup", type=int, default=8, show_default=True, help="Untimed passes per cell.")
@click.option("--iters", type=int, default=30, show_default=True, help="Timed passes per cell.")
@click.option("--dtype", type=click.Choice(sorted(DTYPES)), default=None, help="Default: the SKU's dtype.")
@click.option("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice).")
@click.option("--rank-cap", type=int, default=8, show_default=True, help="K of the random trees and the top-K.")
@click.option("--max-buckets", type=int, default=None,
              help="Buckets to choose from the grid (default: 8 where the SKU captures CUDA graphs, else every "
                   "measured count: nothing is compiled ahead).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random trees and tokens.")
@click.option("--note", default="", help="Free text for provenance.notes (e.g. 'machine shared with other jobs').")
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="Width profile JSON to write.")
@click.option("--json", "as_json", is_flag=True, help="Print profile + p10/p50/p90 tables as JSON, not the table.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
def probe(sku, target_spec, drafter, prefix, batch, backend, packed, warmup, iters, dtype, threads, rank_cap,
          max_buckets, seed, note, out, as_json, no_progress) -> None:
    """Time one verify forward per packed count over a real prefix cache; write a width profile."""
    try:
        spec: SkuSpec = load_sku(sku)
        settings = ProbeSettings(_ints(prefix, "--prefix") if prefix else spec.prefix_buckets, _ints(batch, "--batch"),
                                 _ints(packed, "--packed"), warmup, iters, rank_cap, seed)
        if settings.batch_sizes[-1] > spec.max_batch:
            raise ValueError(f"--batch {settings.batch_sizes[-1]} exceeds SKU {sku}'s max_batch {spec.max_batch}")
        gpu = spec.compute_capability is not None
        if gpu and not torch.cuda.is_available():
            raise ValueError(f"SKU {sku} is a GPU but no CUDA device is visible; probe it on that GPU (or --sku cpu)")
        device = torch.device("cuda" if gpu else "cpu")
        name = device_name(device)
        if not any(d.lower() in name.lower() for d in spec.device_names):
            raise ValueError(f"this device is {name!r}, which is none of SKU {sku}'s device_names "
                             f"{list(spec.device_names)}")
        if threads is not None:
            if threads < 1:
                raise ValueError(f"--threads must be >= 1, got {threads}")
            torch.set_num_threads(threads)
        dtype = dtype or SKU_DTYPE[spec.dtype]
        model, tokenizer, target_name = load_target(target_spec, device, DTYPES[dtype])
        draft_model, draft_desc = load_probe_drafter(drafter, model)
        tables = measure(model, tokenizer, draft_model, settings, progress=not no_progress, backend=backend)
        profile = _profile_of(tables, settings, spec, name, target_name, dtype, max_buckets, draft_desc, note, backend)
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    save_profile(profile, out)
    if as_json:
        click.echo(json.dumps({"profile": profile.to_dict(), "stats_ms": stats_json(tables)}, indent=2))
        return
    click.echo(summary_table(tables, profile))
    click.echo(f"wrote {out}")


def _profile_of(tables: dict, settings: ProbeSettings, spec: SkuSpec, device: str, target: str, dtype: str,
                max_buckets: int | None, draft_desc: str, note: str, backend: str = "torch") -> WidthProfile:
    """The profile with provenance: the command line (less --note), protocol, p10-p90, fixed-cost sources."""
    gpu = spec.compute_capability is not None
    host = f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads"
    p0, b0 = settings.prefix_lengths[0], settings.batch_sizes[0]
    spread = ", ".join(f"{n}: {s.p10:g}-{s.p90:g}" for n, s in tables["verify"][p0][b0].items())
    oh = tables["overhead"][p0][b0]
    argv = [a for i, a in enumerate(sys.argv) if a != "--note" and sys.argv[i - 1] != "--note"]
    notes = (f"{shlex.join([Path(argv[0]).name, *argv[1:]])}. The engine's verify pass on the {backend} backend "
             f"(runtime.engine.latency_probe; one batched pass over B requests), random packed tokens in random "
             f"best-first trees, {settings.warmup} warmups, {settings.iters} timed iterations, median; "
             f"{'CUDA-synchronized ' if gpu else ''}perf_counter. p10-p90 ms at prefix {p0} batch {b0}: {spread}. "
             f"Drafter: {draft_desc}. overhead_ms = host work at n={settings.packed_counts[0]} "
             f"(n={settings.packed_counts[-1]}: {oh[settings.packed_counts[-1]].median:g} ms). {note}").strip()
    if max_buckets is None:
        max_buckets = 8 if spec.cuda_graphs else len(settings.packed_counts)
    return to_profile(tables, settings, sku=spec.name, device=device, target=target, dtype=spec_dtype(dtype),
                      max_buckets=max_buckets, host=host, notes=notes)


def spec_dtype(short: str) -> str:
    return {v: k for k, v in SKU_DTYPE.items()}[short]


def stats_json(tables: dict) -> dict:
    """The tables with string keys and {median, p10, p90} leaves."""
    if isinstance(tables, Stats):
        return {"median": tables.median, "p10": tables.p10, "p90": tables.p90}
    return {str(k): stats_json(v) for k, v in tables.items()}
