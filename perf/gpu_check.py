"""One GPU check (perf/gpu_check.sh, <= 8 minutes on one H200; torch + triton, nothing to download).

Sections, each written to the report as soon as it finishes (a killed run keeps the rest):
  correctness  Triton tree-attention kernel vs the torch reference: fp32/bf16/fp16,
               ragged batches of real trees, GQA ratios 1/4/8, head dims 64/128.
  kernel       Triton kernel vs SDPA over a dense additive mask, Qwen3-8B attention
               shapes (32 q / 8 kv heads, d 128, bf16), n in {16..256} x prefix {1k, 8k};
               CUDA events, warm-ups, medians (the dense mask is built untimed).
  probe        verify latency l(n) of a randomly initialised Qwen3-8B-shaped model in
               bf16 (the runtime's own Llama with q/k norm) through the engine's own
               pass (torch backend, `runtime.engine.latency_probe`), paper Table 5
               protocol: 1k prefix (and 8k), n in {1,16,24,32,48,64,96,128,192,256},
               8 warm-ups, 30 timed iterations, random packed tokens over random trees.
               The curve becomes `width_profile` (cast_trtllm.profile format).
  round_loop   the whole round loop of the one engine with a controlled-acceptance
               drafter (`perf.gpu_round_loop`; not in the default sections).

    python -m perf.gpu_check --out $OUT/gpu_check.json
    python -m perf.gpu_check --sections round_loop --out $OUT/gpu_round_loop.json
    python -m perf.gpu_check --dry-run --out /tmp/gpu_check.json   # tiny shapes on CPU
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.nn import functional as F

from cast_trtllm.masks import additive_mask, batched_bitmask, bitmask, cu_seqlens
from cast_trtllm.profile import Provenance, build_profile
from engine_builder.skus import sku_for_device
from perf import gpu_round_loop
from perf.gpu_round_loop import SHAPES, random_target
from plugins.tree_attention import tree_attention_reference, tree_attention_triton, triton_available
from runtime.engine.backend import TorchTarget
from runtime.engine.latency_probe import probe_tree, verify_medians
from runtime.model.llama import TargetConfig

PAPER_PACKED = (1, 16, 24, 32, 48, 64, 96, 128, 192, 256)
SECTIONS = ("correctness", "kernel", "probe", "round_loop")
TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}  # max |kernel - reference|


def median_ms(fn: Callable[[], Any], device: torch.device, warmup: int, iters: int) -> float:
    """Median ms of one kernel call: CUDA events on a GPU (sub-ms calls), perf_counter on the CPU."""
    def once() -> float:
        if device.type != "cuda":
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    for _ in range(warmup):
        fn()
    return round(statistics.median(once() for _ in range(iters)), 4)


def kernel_or_reference(device: torch.device) -> tuple[Callable, str]:
    """The Triton kernel where it can run (CUDA, or the CPU interpreter), else the reference."""
    if triton_available():
        import triton

        from plugins.tree_attention.triton_kernel import tree_attention_fwd_kernel

        if device.type == "cuda" or not isinstance(tree_attention_fwd_kernel, triton.runtime.jit.JITFunction):
            return tree_attention_triton, "triton"
    return tree_attention_reference, "reference"


def check_correctness(device: torch.device, dry_run: bool, seed: int) -> dict[str, Any]:
    kernel, name = kernel_or_reference(device)
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    dtypes = (torch.float32,) if dry_run else (torch.float32, torch.bfloat16, torch.float16)
    cases = [((5, 3), (9, 0), 4, 1, 16)] if dry_run else [  # (packs, prefixes, Hq, Hkv, d)
        ((1,), (40,), 8, 8, 128), ((16, 65, 130), (100, 0, 37), 32, 8, 128),
        ((256,), (1024,), 32, 8, 128), ((7, 48, 33), (5, 300, 64), 24, 3, 64)]
    rows = []
    for dtype in dtypes:
        for packs, prefixes, hq, hkv, d in cases:
            trees = [probe_tree(n, "tree", rng, 1000) for n in packs]
            total, prefix_total = sum(packs), sum(prefixes)
            randn = lambda *s: torch.randn(*s, generator=gen).to(device=device, dtype=dtype)  # noqa: E731
            args = (randn(total, hq, d), randn(prefix_total, hkv, d), randn(prefix_total, hkv, d),
                    randn(total, hkv, d), randn(total, hkv, d),
                    torch.from_numpy(batched_bitmask(trees, num_words=max(packs) // 32 + 1)).to(device),
                    torch.from_numpy(cu_seqlens(trees)).to(device),
                    torch.tensor(np.cumsum([0, *prefixes]), dtype=torch.int32, device=device))
            err = (kernel(*args).float() - tree_attention_reference(*args).float()).abs().max().item()
            rows.append({"dtype": str(dtype).removeprefix("torch."), "packs": list(packs), "prefixes": list(prefixes),
                         "q_heads": hq, "kv_heads": hkv, "head_dim": d, "max_abs_err": err,
                         "tolerance": TOLERANCE[dtype], "ok": err <= TOLERANCE[dtype]})
    return {"kernel": name, "ok": all(r["ok"] for r in rows), "cases": rows}


def time_kernel(device: torch.device, cfg: TargetConfig, dtype: torch.dtype, ns, prefixes, warmup, iters, seed):
    """One request, one layer's attention: Triton kernel vs SDPA over a dense additive mask."""
    kernel, name = kernel_or_reference(device)
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed)
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    rows = []
    for p in prefixes:
        for n in ns:
            tree = probe_tree(n, "tree", rng, 1000)
            randn = lambda *s: torch.randn(*s, generator=gen).to(device=device, dtype=dtype)  # noqa: E731
            q, k, v = randn(n, hq, d), randn(p + n, hkv, d), randn(p + n, hkv, d)
            words = torch.from_numpy(bitmask(tree)).to(device)
            cu, cu_p = (torch.tensor([0, x], dtype=torch.int32, device=device) for x in (n, p))
            mask = additive_mask(tree, p, dtype=dtype, device=device)  # [1, 1, n, P+n], built untimed
            qh, kh, vh = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
            run_kernel = lambda: kernel(q, k[:p], v[:p], k[p:], v[p:], words, cu, cu_p)  # noqa: E731
            run_sdpa = lambda: F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=True)  # noqa: E731
            tk, ts = median_ms(run_kernel, device, warmup, iters), median_ms(run_sdpa, device, warmup, iters)
            rows.append({"n": n, "prefix": p, "kernel_ms": tk, "sdpa_ms": ts, "sdpa_over_kernel": round(ts / tk, 3)})
    return {"kernel": name, "dtype": str(dtype).removeprefix("torch."),
            "shape": {"q_heads": hq, "kv_heads": hkv, "head_dim": d}, "rows": rows}


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
    p.add_argument("--sections", default="correctness,kernel,probe", help=f"comma-separated subset of {SECTIONS}")
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
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        p.error(f"--sections: unknown {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    if args.warmup < 0 or args.iters < 1:
        p.error(f"need --warmup >= 0 and --iters >= 1, got {args.warmup} and {args.iters}")
    if args.dry_run:  # tiny everything, CPU
        args.packed, args.prefix, args.kernel_n, args.kernel_prefix = (1, 4, 8, 16), (32,), (16, 32), (32, 64)
        args.warmup, args.iters = min(args.warmup, 1), min(args.iters, 2)
    elif not torch.cuda.is_available():
        p.error("no CUDA device: run with --dry-run on a CPU machine")
    return args


def probe(model, prefixes, packed, warmup, iters, seed) -> dict[int, list[float]]:
    """{prefix: [median verify ms per packed count]}: the engine's B = 1 pass over best-first
    trees, never committed (the cache stays at P)."""
    backend = TorchTarget(model)
    return {p: list(verify_medians(backend, packed, p, iters, "tree", warmup, seed).values()) for p in prefixes}


def probe_section(args: argparse.Namespace, device: torch.device, device_name: str, sku: str,
                  cfg: TargetConfig, dtype: torch.dtype) -> dict[str, Any]:
    table = probe(random_target(cfg, device, dtype, args.seed), args.prefix, args.packed, args.warmup, args.iters,
                  args.seed)
    notes = (f"perf/gpu_check.py: random-init {'tiny' if args.dry_run else 'Qwen3-8B'}-shaped model "
             f"(runtime Llama, q/k norm), the engine's verify pass on the torch backend "
             f"(runtime.engine.latency_probe); random packed tokens over random trees, "
             f"{args.warmup} warm-ups, {args.iters} timed iterations, median")
    profile = build_profile(
        sku=sku, device=device_name, target="tiny" if args.dry_run else "Qwen3-8B-shaped (random init)",
        dtype=str(dtype).removeprefix("torch."), packed_counts=list(args.packed),
        latency_ms={p: {1: row} for p, row in table.items()},
        provenance=Provenance(source="measured", date=datetime.date.today().isoformat(),
                              torch_version=torch.__version__, host=platform.node(), notes=notes))
    return {"model": {k: getattr(cfg, k) for k in ("num_layers", "hidden_size", "num_heads", "num_kv_heads",
                                                    "head_dim", "intermediate_size", "vocab_size")},
            "packed_counts": list(args.packed), "warmup": args.warmup, "iters": args.iters,
            "latency_ms": {"torch": {str(p): r for p, r in table.items()}}, "width_profile": profile.to_dict()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device("cpu" if args.dry_run else "cuda")
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    spec = sku_for_device(device_name)
    sku = args.sku or (spec.name if spec else device_name.lower().replace(" ", "-"))
    shape, dtype = ("tiny", torch.float32) if args.dry_run else ("qwen3-8b", torch.bfloat16)
    triton = __import__("triton").__version__ if triton_available() else None
    report: dict[str, Any] = {
        "report": "cast-trtllm gpu_check", "schema_version": 1, "dry_run": args.dry_run, "device": device_name,
        "sku": sku, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "command": " ".join(sys.argv), "sections": {},
        "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton,
                     "python": platform.python_version()},
    }
    started = time.perf_counter()
    sections = {
        "correctness": lambda: check_correctness(device, args.dry_run, args.seed),
        "kernel": lambda: time_kernel(device, SHAPES[shape], dtype, args.kernel_n, args.kernel_prefix, args.warmup,
                                      args.iters, args.seed),
        "probe": lambda: probe_section(args, device, device_name, sku, SHAPES[shape], dtype),
        "round_loop": lambda: gpu_round_loop.run(shape, device, dtype, **gpu_round_loop.SIZES[shape]),
    }
    for name in (s for s in SECTIONS if s in args.sections):
        t0 = time.perf_counter()
        try:
            report["sections"][name] = {"ok": True, **sections[name]()}
        except Exception as err:  # keep the other sections' figures; say what broke
            report["sections"][name] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        report["sections"][name]["seconds"] = round(time.perf_counter() - t0, 1)
        report["elapsed_s"] = round(time.perf_counter() - started, 1)
        write(report, args.out)
        print(f"[gpu_check] {name}: {'ok' if report['sections'][name]['ok'] else 'FAILED'} "
              f"({report['sections'][name]['seconds']} s)", file=sys.stderr, flush=True)
    report["ok"] = all(s["ok"] for s in report["sections"].values())  # correctness: False if any case fails
    write(report, args.out)
    return report


def write(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")


def summary(report: dict[str, Any]) -> str:
    lines = [f"device {report['device']} (sku {report['sku']}), {report.get('elapsed_s', 0)} s, ok={report['ok']}"]
    for row in report["sections"].get("kernel", {}).get("rows", []):
        lines.append(f"  attn n={row['n']:>4} P={row['prefix']:>5}: kernel {row['kernel_ms']:.4f} ms, "
                     f"sdpa {row['sdpa_ms']:.4f} ms")
    probe_ = report["sections"].get("probe", {})
    for p, row in probe_.get("latency_ms", {}).get("torch", {}).items():
        lines.append(f"  verify P={p}: " + " ".join(f"{n}:{ms:.2f}" for n, ms in zip(probe_["packed_counts"], row)))
    lines += [f"  {json.dumps(row)}" for row in report["sections"].get("round_loop", {}).get("rows", [])]
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
