"""One GPU check (perf/gpu_check.sh, <= 8 minutes on one H200; torch + triton, nothing to download).

Sections, each written to the report as soon as it finishes (a killed run keeps the rest):
  1. correctness  Triton tree-attention kernel vs the torch reference: fp32/bf16/fp16,
                  ragged batches of real trees, GQA ratios 1/4/8, head dims 64/128.
  2. kernel       Triton kernel vs SDPA over a dense additive mask, Qwen3-8B attention
                  shapes (32 q / 8 kv heads, d 128, bf16), n in {16..256} x prefix {1k, 8k};
                  CUDA events, warm-ups, medians (the dense mask is built untimed).
  3. probe        verify latency l(n) of a randomly initialised Qwen3-8B-shaped model in
                  bf16 (the runtime's own Llama with q/k norm) through the engine's own
                  pass (torch backend, `runtime.engine.latency_probe`), paper Table 5
                  protocol: 1k prefix (and 8k), n in {1,16,24,32,48,64,96,128,192,256},
                  8 warm-ups, 30 timed iterations, random packed tokens over random trees.
                  The curve becomes `width_profile` (cast_trtllm.profile format).

    python -m perf.gpu_check --out $OUT/gpu_check.json
    python -m perf.gpu_check --dry-run --out /tmp/gpu_check.json   # tiny shapes on CPU

This file is the command and the report; the sections live in perf/gpu_kernel.py (1, 2)
and perf/gpu_probe.py (3).
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
from typing import Any, Callable

import torch

from cast_trtllm.profile import Provenance, build_profile
from engine_builder.skus import sku_for_device
from perf.gpu_kernel import check_correctness, time_kernel
from perf.gpu_probe import PAPER_PACKED, QWEN3_8B, TINY, probe
from perf.gpu_round_loop import random_target
from plugins.tree_attention import triton_available


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
    p.add_argument("--sections", default="correctness,kernel,probe", help="comma-separated subset to run")
    p.add_argument("--sku", default=None, help="profile SKU name (default: detected from the device name)")
    p.add_argument("--packed", type=ints, default=PAPER_PACKED, help="probe packed counts n = N + 1")
    p.add_argument("--prefix", type=ints, default=(1024, 8192), help="probe KV prefix lengths (paper Table 5: 1024)")
    p.add_argument("--kernel-n", type=ints, default=(16, 32, 64, 128, 256), help="kernel timing pack sizes")
    p.add_argument("--kernel-prefix", type=ints, default=(1024, 8192), help="kernel timing prefix lengths")
    p.add_argument("--warmup", type=int, default=8, help="untimed passes per cell (paper: 8)")
    p.add_argument("--iters", type=int, default=30, help="timed passes per cell (paper: 30)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, trees and tokens")
    args = p.parse_args(argv)
    args.sections = tuple(s for s in args.sections.split(",") if s)
    unknown = set(args.sections) - {"correctness", "kernel", "probe"}
    if unknown:
        p.error(f"--sections: unknown {sorted(unknown)}; choose from correctness, kernel, probe")
    if args.warmup < 0 or args.iters < 1:
        p.error(f"need --warmup >= 0 and --iters >= 1, got {args.warmup} and {args.iters}")
    if args.dry_run:  # tiny everything, CPU
        args.packed, args.prefix, args.kernel_n, args.kernel_prefix = (1, 4, 8, 16), (32,), (16, 32), (32, 64)
        args.warmup, args.iters = min(args.warmup, 1), min(args.iters, 2)
    elif not torch.cuda.is_available():
        p.error("no CUDA device: run with --dry-run on a CPU machine")
    return args


def versions() -> dict[str, str | None]:
    triton_version = None
    if triton_available():
        import triton

        triton_version = triton.__version__
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton_version,
            "python": platform.python_version()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cpu" if args.dry_run else "cuda")
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    spec = sku_for_device(device_name)
    sku = args.sku or (spec.name if spec else device_name.lower().replace(" ", "-"))
    cfg, dtype = (TINY, torch.float32) if args.dry_run else (QWEN3_8B, torch.bfloat16)
    report: dict[str, Any] = {
        "report": "cast-trtllm gpu_check", "schema_version": 1, "dry_run": args.dry_run, "device": device_name,
        "sku": sku, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "versions": versions(), "command": " ".join(sys.argv), "sections": {},
    }
    started = time.perf_counter()

    def section(name: str, fn: Callable[[], Any]) -> None:
        if name not in args.sections:
            return
        t0 = time.perf_counter()
        try:
            report["sections"][name] = {"ok": True, **fn()}
        except Exception as err:  # keep the other sections' figures; say what broke
            report["sections"][name] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        report["sections"][name]["seconds"] = round(time.perf_counter() - t0, 1)
        report["elapsed_s"] = round(time.perf_counter() - started, 1)
        write(report, args.out)
        print(f"[gpu_check] {name}: {'ok' if report['sections'][name]['ok'] else 'FAILED'} "
              f"({report['sections'][name]['seconds']} s)", file=sys.stderr, flush=True)

    section("correctness", lambda: check_correctness(device, args.dry_run, args.seed))
    section("kernel", lambda: time_kernel(device, cfg, dtype, args.kernel_n, args.kernel_prefix, args.warmup,
                                          args.iters, args.seed))

    def probe_section() -> dict[str, Any]:
        model = random_target(cfg, device, dtype, args.seed)
        table = probe(model, args.prefix, args.packed, args.warmup, args.iters, args.seed)
        notes = (f"perf/gpu_check.py: random-init {'tiny' if args.dry_run else 'Qwen3-8B'}-shaped model "
                 f"(runtime Llama, q/k norm), the engine's verify pass on the torch backend "
                 f"(runtime.engine.latency_probe); random packed tokens over random trees, "
                 f"{args.warmup} warm-ups, {args.iters} timed iterations, median")
        profile = build_profile(
            sku=sku, device=device_name, target="Qwen3-8B-shaped (random init)" if not args.dry_run else "tiny",
            dtype=str(dtype).removeprefix("torch."), packed_counts=list(args.packed),
            latency_ms={p: {1: row} for p, row in table.items()},
            provenance=Provenance(source="measured", date=datetime.date.today().isoformat(),
                                  torch_version=torch.__version__, host=platform.node(), notes=notes))
        return {"model": {k: getattr(cfg, k) for k in ("num_layers", "hidden_size", "num_heads", "num_kv_heads",
                                                        "head_dim", "intermediate_size", "vocab_size")},
                "packed_counts": list(args.packed), "warmup": args.warmup, "iters": args.iters,
                "latency_ms": {"torch": {str(p): r for p, r in table.items()}},
                "width_profile": profile.to_dict()}

    section("probe", probe_section)
    report["ok"] = all(s["ok"] for s in report["sections"].values())  # correctness: False if any case fails
    write(report, args.out)
    return report


def write(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def summary(report: dict[str, Any]) -> str:
    lines = [f"device {report['device']} (sku {report['sku']}), {report.get('elapsed_s', 0)} s, ok={report['ok']}"]
    kernel = report["sections"].get("kernel", {})
    for row in kernel.get("rows", []):
        lines.append(f"  attn n={row['n']:>4} P={row['prefix']:>5}: kernel {row['kernel_ms']:.4f} ms, "
                     f"sdpa {row['sdpa_ms']:.4f} ms")
    probe_ = report["sections"].get("probe", {})
    for backend, table in probe_.get("latency_ms", {}).items():
        for p, row in table.items():
            cells = " ".join(f"{n}:{ms:.2f}" for n, ms in zip(probe_["packed_counts"], row))
            lines.append(f"  verify {backend} P={p}: {cells}")
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
