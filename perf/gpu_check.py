"""One GPU check (perf/gpu_check.sh, <= 7 minutes on one H200; torch + triton + numpy only,
nothing downloaded; `yaml` and `safetensors` are never imported).

A random-weight Qwen3-8B-shaped target in bf16 (`perf.gpu_round_loop.SHAPES`), built once.
Sections, in this order, each in its own `try` and written to the report as it finishes
(a killed run keeps the rest):
  correctness  Triton tree-attention kernel vs the torch reference (bf16 first)   perf/gpu_attention.py
  attention    one layer's verify attention: Triton kernel / slot_attention / SDPA  perf/gpu_attention.py
  launches     kernel launches and stream drains per steady round, B = 1 and 32   perf/gpu_launches.py
  latency      verify l(n), B in {1, 32}, n in {1,16,32,64,128}, prefix 1k, per   perf/gpu_launches.py
               target backend (eager; captured where built); the B = 1 curve of
               the fastest backend becomes a width profile
  rounds       AR / chain / CAST@15 / auto at B = 1 and 32 (calibrated oracle)     perf/gpu_round_loop.py

    python -m perf.gpu_check --out $OUT/gpu_check.json
    python -m perf.gpu_check --dry-run --out /tmp/gpu_check.json   # tiny shapes on CPU
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from perf import gpu_attention, gpu_launches, gpu_round_loop
from perf.gpu_round_loop import SHAPES, SIZES, random_target
from plugins.tree_attention import triton_available

PAPER_PACKED = (1, 16, 32, 64, 128)
SECTIONS = ("correctness", "attention", "launches", "latency", "rounds")


def ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or values[0] < 1 or any(b <= a for a, b in zip(values, values[1:])):
        raise argparse.ArgumentTypeError(f"expected strictly ascending integers >= 1, got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "perf/results")) / "gpu_check.json",
                   help="report path (default: $OUT/gpu_check.json)")
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU: exercises every section and the report")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}")
    p.add_argument("--sku", default=None, help="profile SKU name (default: detected from the device name)")
    p.add_argument("--packed", type=ints, default=PAPER_PACKED, help="latency packed counts n = N + 1")
    p.add_argument("--batches", type=ints, default=(1, 32), help="batch sizes of latency, launches and rounds")
    p.add_argument("--prefix", type=int, default=1024, help="latency KV prefix length (paper Table 5: 1024)")
    p.add_argument("--latency-backends", default="eager,graph", help="target backends timed by `latency`")
    p.add_argument("--round-backends", default="eager,graph", help="target backends of `launches` and `rounds` "
                   "(eager: the torch backend; graph: the model runner, captured on CUDA, eager on the CPU)")
    p.add_argument("--warmup", type=int, default=5, help="untimed passes per cell")
    p.add_argument("--iters", type=int, default=15, help="timed passes per cell")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, trees and tokens")
    args = p.parse_args(argv)
    args.sections = tuple(s for s in args.sections.split(",") if s)
    args.latency_backends = tuple(b for b in args.latency_backends.split(",") if b)
    args.round_backends = tuple(b for b in args.round_backends.split(",") if b)
    bad = set(args.latency_backends + args.round_backends) - {"eager", "graph", "runner"}
    if bad:
        p.error(f"unknown backends {sorted(bad)}; choose from eager, graph (= runner)")
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        p.error(f"--sections: unknown {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    if args.warmup < 0 or args.iters < 1:
        p.error(f"need --warmup >= 0 and --iters >= 1, got {args.warmup} and {args.iters}")
    if args.dry_run:  # tiny everything, CPU
        args.packed, args.batches, args.prefix = (1, 4, 8), (1, 3), 32
        args.warmup, args.iters = min(args.warmup, 1), min(args.iters, 2)
    elif not torch.cuda.is_available():
        p.error("no CUDA device: run with --dry-run on a CPU machine")
    return args


def sku_name(device_name: str) -> str:
    """The SKU spec's name for this device; the spec files need yaml, which the check may lack."""
    try:
        from engine_builder.skus import sku_for_device
        spec = sku_for_device(device_name)
    except ImportError:
        spec = None
    return spec.name if spec else device_name.lower().replace(" ", "-")


def target_backends(target, cuda: bool, names: Sequence[str], max_slots: int) -> dict[str, Any]:
    """name -> target backend over `target`: `eager` is the torch backend (today's eager round);
    `runner` the model runner over a preallocated pool, captured per bucket on CUDA (`graph`)
    and eager on the CPU (the dry run). Both tap layer 1, as the oracle drafter asks."""
    from runtime.engine.backend import TorchTarget
    from runtime.engine.runner_target import RunnerTarget

    made = {}
    for name in names:
        if name == "eager":
            made[name] = TorchTarget(target, (1,))
        elif name in ("runner", "graph"):
            made["graph" if cuda else "runner"] = RunnerTarget(target, (1,), graphs=cuda, max_slots=max_slots)
        else:
            raise ValueError(f"unknown backend {name!r}; use eager, runner or graph")
    return made


def width_profile(latency: dict[str, Any], device_name: str, sku: str, dtype: torch.dtype, args) -> dict | None:
    """The B = 1 curve of the fastest backend as a `cast_trtllm.profile` width profile."""
    from cast_trtllm.profile import Provenance, build_profile

    curves = {name: table.get("1", {}) for name, table in latency["latency_ms"].items()}
    curves = {n: c for n, c in curves.items() if "error" not in c and c}
    if not curves:
        return None
    name = min(curves, key=lambda n: sum(curves[n].values()))
    notes = (f"perf/gpu_check.py: random-init {'tiny' if args.dry_run else 'Qwen3-8B'}-shaped model, "
             f"backend {name}, verify pass over random trees, {args.warmup} warm-ups, {args.iters} iterations, median")
    return build_profile(
        sku=sku, device=device_name, target="tiny" if args.dry_run else "Qwen3-8B-shaped (random init)",
        dtype=str(dtype).removeprefix("torch."), packed_counts=list(args.packed),
        latency_ms={args.prefix: {1: [curves[name][str(n)] for n in args.packed]}},
        provenance=Provenance(source="measured", date=datetime.date.today().isoformat(),
                              torch_version=torch.__version__, host=platform.node(), notes=notes)).to_dict()


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cpu" if args.dry_run else "cuda")
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    sku = args.sku or sku_name(device_name)
    shape, dtype = ("tiny", torch.float32) if args.dry_run else ("qwen3-8b", torch.bfloat16)
    cfg, sizes = SHAPES[shape], SIZES[shape]
    triton = __import__("triton").__version__ if triton_available() else None
    report: dict[str, Any] = {
        "report": "cast-trtllm gpu_check", "schema_version": 2, "dry_run": args.dry_run, "device": device_name,
        "sku": sku, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "command": " ".join(sys.argv), "sections": {},
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton,
                     "python": platform.python_version()},
    }
    started = time.perf_counter()
    model: dict[str, Any] = {}

    def target():
        if "target" not in model:
            model["target"] = random_target(cfg, device, dtype, args.seed)
        return model["target"]

    heads = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    cells = [(b, n, args.prefix) for b in args.batches for n in (args.packed[1], args.packed[-1])]
    cells += [(1, args.packed[-1], 8 * args.prefix)]
    L = sizes["block_positions"]

    cuda, slots = device.type == "cuda", max(args.batches)
    backends: dict[str, Any] = {}

    def made(names) -> dict[str, Any]:  # backends are built once and shared by the sections
        wanted = {("graph" if cuda else "runner") if n in ("runner", "graph") else n for n in names}
        for name in wanted - set(backends):
            backends.update(target_backends(target(), cuda, [name], slots))
        return {name: backends[name] for name in sorted(wanted)}

    def latency_section():
        out = gpu_launches.latency(made(args.latency_backends), args.batches, args.packed, args.prefix,
                                   args.warmup, args.iters, args.seed)
        out["width_profile"] = width_profile(out, device_name, sku, dtype, args)
        return out

    sections = {
        "correctness": lambda: gpu_attention.check_correctness(device, args.dry_run, args.seed),
        "attention": lambda: gpu_attention.attention_ab(device, heads, dtype, cells, args.warmup, args.iters,
                                                        args.seed),
        "launches": lambda: gpu_launches.launches(target(), cfg, device, args.batches, sizes["prompt_len"], L,
                                                  made(args.round_backends)),
        "latency": latency_section,
        "rounds": lambda: gpu_round_loop.run(shape, device, dtype, args.batches, sizes["prompt_len"],
                                             sizes["new_tokens"], sizes["corruption"], L, target=target(),
                                             backends=made(args.round_backends)),
    }
    for name in (s for s in SECTIONS if s in args.sections):
        t0 = time.perf_counter()
        try:
            report["sections"][name] = {"ok": True, **sections[name]()}
        except Exception as err:  # keep the other sections' figures; say what broke
            report["sections"][name] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        if name == "correctness":
            report["sections"][name]["ok"] = report["sections"][name].get("ok", False) and all(
                c.get("ok") for c in report["sections"][name].get("cases", []))
        report["sections"][name]["seconds"] = round(time.perf_counter() - t0, 1)
        report["elapsed_s"] = round(time.perf_counter() - started, 1)
        write(report, args.out)
        print(f"[gpu_check] {name}: {'ok' if report['sections'][name]['ok'] else 'FAILED'} "
              f"({report['sections'][name]['seconds']} s)", file=sys.stderr, flush=True)
    report["ok"] = all(s["ok"] for s in report["sections"].values())
    write(report, args.out)
    return report


def write(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def summary(report: dict[str, Any]) -> str:
    lines = [f"device {report['device']} (sku {report['sku']}), {report.get('elapsed_s', 0)} s, ok={report['ok']}"]
    sections = report["sections"]
    for name, section in sections.items():
        if not section.get("ok"):
            lines.append(f"  {name}: FAILED {section.get('error', '')}")
    for row in sections.get("attention", {}).get("rows", []) + sections.get("launches", {}).get("rows", []):
        lines.append(f"  {json.dumps(row)}")
    for backend, table in sections.get("latency", {}).get("latency_ms", {}).items():
        lines.append(f"  latency {backend}: {json.dumps(table)}")
    lines += [f"  {json.dumps(row)}" for row in sections.get("rounds", {}).get("rows", [])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    report = run(args)
    print(summary(report))
    print(f"report: {args.out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
