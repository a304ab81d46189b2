"""`cast-trtllm probe` (paper §3.1, App. D): the deployed target's verify latency ell(n) -> a width profile.

    cast-trtllm probe --sku cpu --target embedded --prefix 512 --threads 2 --out profile.json

The timing is `runtime.engine.latency_probe` (the engine's own round path); this module
holds the protocol and turns its tables into a width profile. Per (prefix P, batch B):
B requests prefill a real prompt of P tokens (this repo's README, tiled) through the
engine's target backend, then for each packed count n = N + 1 `warmup` untimed and
`iters` timed verify passes run (ONE batched pass over the B packs, interleaved over n),
each over fresh random best-first trees of N nodes carrying random packed tokens. A
verify never commits, so every slot stays at P (checked after every pass). Median, p10
and p90 per cell.

Also measured, so the profile's fixed costs are not assumed: the drafter's block pass
over the B requests, and the host work of a round outside both passes (top-K, sorted
prefix masses, tree build, greedy walk, KV commit).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

import click
import torch
from tqdm import tqdm

from cast_trtllm.profile import Provenance, WidthProfile, build_profile, save_profile
from engine_builder.skus import load_sku
from runtime.device import device_name
from runtime.drafter import DEFAULT_DRAFTER, load_drafter, random_drafter
from runtime.engine.autoconfig import make_backend, make_drafter
from runtime.engine.latency_probe import LatencyProbe, Stats
from runtime.model.llama import LlamaTarget

PREFIX_TEXT = Path(__file__).resolve().parents[1] / "README.md"
DEFAULT_PACKED = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # --dtype -> the SKU spec's dtype name
BACKENDS = ("torch", "onnxruntime")


@dataclasses.dataclass(frozen=True, slots=True)
class ProbeSettings:
    prefix_lengths: tuple[int, ...]
    batch_sizes: tuple[int, ...] = (1,)
    packed_counts: tuple[int, ...] = DEFAULT_PACKED  # n = N + 1
    warmup: int = 8
    iters: int = 30
    rank_cap: int = 8  # K of the random trees and the overhead's top-K
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("prefix_lengths", "batch_sizes", "packed_counts"):
            v = getattr(self, name)
            if not v or v[0] < 1 or any(b <= a for a, b in zip(v, v[1:])):
                raise ValueError(f"--{name.split('_')[0]}: expected strictly ascending integers >= 1, got {list(v)}")
        if len(self.packed_counts) < 2:
            raise ValueError("--packed: the affine fit needs at least 2 packed counts")
        if self.warmup < 0 or self.iters < 1:
            raise ValueError(f"need --warmup >= 0 and --iters >= 1, got {self.warmup} and {self.iters}")
        if self.rank_cap < 1:
            raise ValueError(f"--rank-cap must be >= 1, got {self.rank_cap}")


def prefix_ids(tokenizer: Any, length: int) -> torch.Tensor:
    """[length] int64 ids of real text (the README, tiled)."""
    ids = list(tokenizer(PREFIX_TEXT.read_text()).input_ids)
    return torch.tensor((ids * (length // len(ids) + 1))[:length], dtype=torch.int64)


@torch.inference_mode()
def measure(model: LlamaTarget, tokenizer: Any, drafter, settings: ProbeSettings, progress: bool = False,
            backend: str = "torch") -> dict:
    """The probe's tables: verify / overhead Stats per [prefix][batch][n], drafter per [prefix][batch],
    timed on the engine's `backend` ("torch" or "onnxruntime") over `model` and `drafter`."""
    window, n_max = model.config.context_window, settings.packed_counts[-1]
    if settings.prefix_lengths[-1] + n_max + drafter.config.block_size > window:
        raise ValueError(f"prefix {settings.prefix_lengths[-1]} + {n_max} packed tokens exceed the target's "
                         f"context window of {window}")
    if backend not in BACKENDS:
        raise ValueError(f"--backend must be one of {BACKENDS}, got {backend!r}")
    threads = torch.get_num_threads()
    target = make_backend(backend, model, drafter.config.target_layer_ids, threads)
    draft = make_drafter(backend, drafter, model, threads)
    cells = [(p, b) for p in settings.prefix_lengths for b in settings.batch_sizes]
    passes = len(cells) * len(settings.packed_counts) * (settings.warmup + settings.iters)
    bar = tqdm(total=passes, desc="probe", unit="pass", disable=not progress, file=sys.stderr)
    verify, overhead, drafts = {}, {}, {}
    for p, b in cells:
        bar.set_postfix(prefix=p, batch=b)
        with LatencyProbe(target, prefix_ids(tokenizer, p), b, n_max, draft, settings.seed,
                          depth=draft.num_draft_positions, rank_cap=settings.rank_cap) as probe:
            roots = probe.rng.integers(model.config.vocab_size, size=b).tolist()
            times = [probe.time_draft(roots) for _ in range(settings.warmup + settings.iters)]
            drafts.setdefault(p, {})[b] = Stats.of([ms for ms, _ in times[settings.warmup:]])
            draft_logits = times[-1][1].full()  # [B, L, V]
            host: dict[int, list[float]] = {n: [] for n in settings.packed_counts}
            samples = probe.verify_curve(
                settings.packed_counts, settings.warmup, settings.iters, "tree",
                host=lambda n, trees, logits: host[n].append(probe.time_host(draft_logits, logits, trees)),
                on_pass=lambda n: bar.update())
        verify.setdefault(p, {})[b] = {n: Stats.of(v) for n, v in samples.items()}
        overhead.setdefault(p, {})[b] = {n: Stats.of(v) for n, v in host.items()}
    bar.close()
    return {"verify": verify, "overhead": overhead, "drafter": drafts}


def to_profile(tables: dict, settings: ProbeSettings, *, sku: str, device: str, target: str, dtype: str,
               max_buckets: int, host: str, notes: str) -> WidthProfile:
    """Width profile of the median table. Fixed costs per batch come from the smallest
    prefix: the drafter forward, and the host overhead at the smallest packed count (its
    width-independent part; the rest is reported next to the profile, not folded in,
    so the rules' slope is the forward-only c1_fw of paper §3.3)."""
    import transformers

    p0, n0 = settings.prefix_lengths[0], settings.packed_counts[0]
    verify = tables["verify"]
    return build_profile(
        sku=sku, device=device, target=target, dtype=dtype, packed_counts=list(settings.packed_counts),
        latency_ms={p: {b: [verify[p][b][n].median for n in settings.packed_counts] for b in row}
                    for p, row in verify.items()},
        provenance=Provenance(source="measured", date=datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"), torch_version=torch.__version__, transformers_version=transformers.__version__,
            host=host, notes=notes),
        max_buckets=max_buckets,
        drafter_ms={b: tables["drafter"][p0][b].median for b in settings.batch_sizes},
        overhead_ms={b: tables["overhead"][p0][b][n0].median for b in settings.batch_sizes})


def load_probe_drafter(spec: str | None, model: LlamaTarget):
    """(drafter, description): a checkpoint dir, else the shipped default, else an untrained
    drafter of the default shape (1 layer, block 16): its forward costs the same."""
    path = Path(spec) if spec else DEFAULT_DRAFTER
    if spec or path.is_dir():
        return load_drafter(path, model.config), str(path)
    return random_drafter(model.config, num_layers=1, block_size=16), "untrained 1-layer drafter, block 16"


def _ints(ctx: click.Context, param: click.Parameter, text: str | None) -> tuple[int, ...] | None:
    """Click callback: a comma list of integers."""
    try:
        return None if text is None else tuple(int(v) for v in text.split(","))
    except ValueError:
        raise click.BadParameter(f"expected a comma list of integers, got {text!r}") from None


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


def stats_json(tables: dict | Stats) -> dict:
    """The tables with string keys and {median, p10, p90} leaves."""
    if isinstance(tables, Stats):
        return dataclasses.asdict(tables)
    return {str(k): stats_json(v) for k, v in tables.items()}


@click.command()
@click.option("--sku", required=True, help="Build spec name (engine_builder/skus/NAME.yaml); picks device and dtype.")
@click.option("--target", "target_spec", default="embedded", show_default=True,
              help="'embedded' (SmolLM2-135M) or a Hugging Face model directory.")
@click.option("--drafter", default=None, help="DFlash checkpoint dir (default: runtime/drafter/default, else an "
                                              "untrained drafter of the default shape).")
@click.option("--prefix", default=None, callback=_ints,
              help="Comma list of KV-prefix lengths (default: the SKU's prefix_buckets).")
@click.option("--batch", default="1", show_default=True, callback=_ints,
              help="Comma list of batch sizes (B requests verified in ONE batched pass, as the engine runs them).")
@click.option("--backend", type=click.Choice(BACKENDS), default="torch", show_default=True,
              help="The engine's target + drafter backend to time (onnxruntime: fp32 CPU only).")
@click.option("--packed", default=",".join(map(str, DEFAULT_PACKED)), show_default=True, callback=_ints,
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
    from runtime.loader import load_models

    try:
        spec = load_sku(sku)
        settings = ProbeSettings(prefix or spec.prefix_buckets, batch, packed, warmup, iters, rank_cap, seed)
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
        dtype = DTYPES[dtype] if dtype else spec.dtype
        loaded = load_models(target_spec, "none", device, getattr(torch, dtype))
        draft_model, draft_desc = load_probe_drafter(drafter, loaded.target)
        tables = measure(loaded.target, loaded.tokenizer, draft_model, settings, progress=not no_progress,
                         backend=backend)
        # provenance: the command line (less --note), protocol, p10-p90, fixed-cost sources
        host = (f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs, "
                f"{torch.get_num_threads()} torch threads")
        p0, b0 = settings.prefix_lengths[0], settings.batch_sizes[0]
        n0, n_max = settings.packed_counts[0], settings.packed_counts[-1]
        spread = ", ".join(f"{n}: {s.p10:g}-{s.p90:g}" for n, s in tables["verify"][p0][b0].items())
        argv = [a for i, a in enumerate(sys.argv) if a != "--note" and sys.argv[i - 1] != "--note"]
        notes = (f"{shlex.join([Path(argv[0]).name, *argv[1:]])}. The engine's verify pass on the {backend} backend "
                 f"(runtime.engine.latency_probe; one batched pass over B requests), random packed tokens in random "
                 f"best-first trees, {warmup} warmups, {iters} timed iterations, median; "
                 f"{'CUDA-synchronized ' if gpu else ''}perf_counter. p10-p90 ms at prefix {p0} batch {b0}: {spread}. "
                 f"Drafter: {draft_desc}. overhead_ms = host work at n={n0} "
                 f"(n={n_max}: {tables['overhead'][p0][b0][n_max].median:g} ms). {note}").strip()
        if max_buckets is None:
            max_buckets = 8 if spec.cuda_graphs else len(settings.packed_counts)
        profile = to_profile(tables, settings, sku=spec.name, device=name, target=loaded.name, dtype=dtype,
                             max_buckets=max_buckets, host=host, notes=notes)
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    save_profile(profile, out)
    if as_json:
        click.echo(json.dumps({"profile": profile.to_dict(), "stats_ms": stats_json(tables)}, indent=2))
        return
    click.echo(summary_table(tables, profile))
    click.echo(f"wrote {out}")
