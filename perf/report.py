"""Aggregate a bench run into a trtllm-bench-shaped JSON report and a summary table.

Report layout (TensorRT-LLM `trtllm-bench --report_json` keys, one block per method):
    engine, machine, dataset, settings,
    runs: [{label, method, request_info, performance, decoding_stats, requests}], summary
Headline number: decode ms/token t = sum of decode windows / sum of emitted tokens over
all requests (paper App. D); speedup over AR = t_AR / t; gain over chain = t_chain / t - 1.
R is the committed round length (accepted + 1) of every verify round.
"""

from __future__ import annotations

import json
import os
import platform
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from perf.harness import BenchRun, MethodSpec, RequestRun

DECODING_MODE = {"ar": "AR", "chain": "DFlash", "cast": "CAST", "hf": "AR (transformers generate)",
                 "dflash": "DFlash (z-lab reference)"}


def percentiles(values: Sequence[float]) -> dict[str, float] | None:
    """trtllm-bench's PercentileStats keys; None for no samples."""
    if len(values) == 0:
        return None
    v = np.asarray(values, dtype=np.float64)
    q = np.percentile(v, [50, 90, 95, 99])
    return {"p50": float(q[0]), "p90": float(q[1]), "p95": float(q[2]), "p99": float(q[3]),
            "minimum": float(v.min()), "maximum": float(v.max()), "average": float(v.mean())}


def package_version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def machine_info() -> dict[str, Any]:
    """What the numbers depend on: CPU model, cores and the ISA flags that decide bf16 vs fp32 speed
    on a CPU, versions, torch threads, the GPU."""
    import torch

    from runtime.device import device_name

    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = ""
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_model": device_name(torch.device("cpu")), "cpu_count": os.cpu_count(),
            "isa": [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags.split()],
            "python": platform.python_version(), "torch": torch.__version__,
            "onnxruntime": package_version("onnxruntime"), "torch_threads": torch.get_num_threads(),
            "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def run_line(report: dict[str, Any]) -> str:
    """A results page's first line: the command, the code it ran at, how long it took, the machine."""
    return (f"`{report['command']}` at code {report.get('code', 'unknown')} — {report['wall_minutes']:.1f} min. "
            f"Machine: {json.dumps(report['machine'])}.")


def write_report(out: Path, report: dict[str, Any], page: Callable[[dict[str, Any]], str]) -> None:
    """OUT.json (the runs, every repeat) and OUT.md (`page` of it), the folder made as needed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=float))
    out.with_suffix(".md").write_text(page(report))


def dataset_info(name: str, runs: Sequence[RequestRun], output_tokens: Sequence[int]) -> dict[str, Any]:
    isl = [r.prompt_tokens for r in runs]
    return {"name": name, "num_requests": len(runs), "isl_stats": percentiles(isl),
            "osl_stats": percentiles(output_tokens), "seq_len_stats": percentiles(
                [a + b for a, b in zip(isl, output_tokens)])}


def method_block(spec: MethodSpec, runs: Sequence[RequestRun], ar: Sequence[RequestRun] | None = None
                 ) -> dict[str, Any]:
    """request_info / performance / decoding_stats of one method over all requests; with `ar`
    (AR's runs of the same requests) each request says whether its tokens equal AR's."""
    results = [r.result for r in runs]
    tokens = [len(g.token_ids) for g in results]
    total_tokens = sum(tokens)
    t = [g.timings for g in results]
    decode_ms = sum(x.decode_ms for x in t)
    latency_ms = [x.prefill_ms + x.first_draft_ms + x.decode_ms for x in t]
    ms_per_token = decode_ms / total_tokens if total_tokens else 0.0
    rounds = [R for g in results for R in g.accept_lengths]
    budgets = [N for g in results for N in g.budgets]
    drafted = [d for g in results for d in g.drafted]
    split = {name: sum(getattr(x, f"{name}_ms") for x in t) for name in ("draft", "verify", "overhead")}
    performance = {
        "decode_ms_per_token": ms_per_token,
        "decode_tokens_per_s": 1000.0 / ms_per_token if ms_per_token else 0.0,
        "total_latency_ms": sum(latency_ms),
        "avg_request_latency_ms": float(np.mean(latency_ms)),
        "request_throughput_req_s": 1000.0 * len(runs) / sum(latency_ms),
        "system_output_throughput_tok_s": 1000.0 * total_tokens / sum(latency_ms),
        "avg_time_to_first_token_ms": float(np.mean([x.ttft_ms for x in t])),
        "ttft_percentiles_ms": percentiles([x.ttft_ms for x in t]),
        "tpot_percentiles_ms": percentiles([g.decode_ms_per_token for g in results if g.token_ids]),
        "request_latency_percentiles_ms": percentiles(latency_ms),
        "decode_ms": decode_ms,
        "time_split_ms": split,
        "time_split_fraction": {k: (v / decode_ms if decode_ms else 0.0) for k, v in split.items()},
    }
    decoding_stats = {
        "mode": DECODING_MODE[spec.method],
        "num_rounds": len(rounds),
        "acceptance_length_percentiles": percentiles(rounds),
        "acceptance_length_histogram": {str(k): v for k, v in sorted(Counter(rounds).items())},
        "num_draft_tokens_percentiles": percentiles(budgets),
        "draft_acceptance_rate_percentiles": percentiles(
            [(R - 1) / N for R, N in zip(rounds, budgets) if N > 0]),
        "drafted_round_share": float(np.mean(drafted)) if drafted and spec.method != "ar" else None,
    }
    return {
        "label": spec.label,
        "method": spec.method,
        "budget": "auto" if spec.method == "cast" and spec.budget is None else spec.budget,
        "request_info": {"num_requests": len(runs), "avg_input_length": float(np.mean([r.prompt_tokens for r in runs])),
                         "avg_output_length": total_tokens / len(runs), "total_output_tokens": total_tokens,
                         "finish_reasons": dict(Counter(g.finish_reason for g in results))},
        "performance": performance,
        "decoding_stats": decoding_stats,
        "lossless": spec.relaxed is None,  # every method here but a relaxed twin: greedy output must equal AR's
        "equal_to_ar": None if ar is None else sum(r.result.token_ids == a.result.token_ids for r, a in zip(runs, ar)),
        "requests": [request_row(r, a) for r, a in zip(runs, ar or [None] * len(runs))],
    }


def request_row(run: RequestRun, ar: RequestRun | None = None) -> dict[str, Any]:
    """Per-request figures, enough to re-pool a method's summary over prompt shards."""
    g, t = run.result, run.result.timings
    return {"task_id": run.task_id, "equal_to_ar": None if ar is None else g.token_ids == ar.result.token_ids,
            "input_length": run.prompt_tokens, "output_length": len(g.token_ids),
            "decode_ms_per_token": g.decode_ms_per_token, "mean_R": g.mean_accept_length, "ttft_ms": t.ttft_ms,
            "decode_ms": t.decode_ms, "num_rounds": g.num_rounds, "sum_budget": sum(g.budgets),
            "drafted_rounds": sum(g.drafted),
            "time_split_ms": {"draft": t.draft_ms, "verify": t.verify_ms, "overhead": t.overhead_ms}}


def summarize(blocks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per method: t, tokens/s, speedup over AR, gain over chain, mean R, TTFT, split, = AR."""
    t = {b["label"]: b["performance"]["decode_ms_per_token"] for b in blocks}
    rows = []
    for b in blocks:
        p, d, mine = b["performance"], b["decoding_stats"], t[b["label"]]
        al = d["acceptance_length_percentiles"] or {}
        nd = d["num_draft_tokens_percentiles"] or {}
        rows.append({
            "method": b["label"],
            "ms_per_token": mine,
            "tokens_per_s": p["decode_tokens_per_s"],
            "speedup_over_ar": t["ar"] / mine if "ar" in t and mine else None,
            "gain_over_chain": t["chain"] / mine - 1.0 if "chain" in t and mine else None,
            "mean_R": al.get("average"),
            "mean_budget": nd.get("average"),
            "drafted_share": d.get("drafted_round_share"),
            "ttft_ms": p["avg_time_to_first_token_ms"],
            **{f"{k}_share": v for k, v in p["time_split_fraction"].items()},
            "lossless": b.get("lossless"),
            "equal_to_ar": b.get("equal_to_ar"),
            "requests": b["request_info"]["num_requests"],
        })
    return rows


def build_report(bench: BenchRun, dataset: str, output_tokens: Sequence[int], engine: dict[str, Any],
                 settings: dict[str, Any]) -> dict[str, Any]:
    ar = bench.runs.get("ar") if not settings.get("temperature") else None  # greedy: lossless means equal
    blocks = [method_block(s, bench.runs[s.label], ar) for s in bench.specs]
    first = bench.runs[bench.specs[0].label]
    return {
        "engine": engine,
        "machine": machine_info(),
        "dataset": dataset_info(dataset, first, output_tokens),
        "settings": {**settings, "timer": "decode-only window, prefill and first draft excluded (paper App. D)",
                     "date": datetime.now(timezone.utc).isoformat(timespec="seconds")},
        "runs": blocks,
        "summary": summarize(blocks),
    }


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _agreement(row: dict[str, Any]) -> str:
    """`k/n` requests whose greedy tokens equal AR's; `!` marks a lossless method that differs."""
    if row.get("equal_to_ar") is None:
        return "-"
    flag = "!" if row.get("lossless") and row["equal_to_ar"] != row["requests"] else ""
    return f"{row['equal_to_ar']}/{row['requests']}{flag}"


def md_table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table: the header, its rule, then one line per row."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The summary as a markdown table."""
    head = ["method", "ms/tok", "tok/s", "vs AR", "vs chain", "mean R", "mean N", "TTFT ms",
            "draft", "verify", "overhead", "= AR"]
    return md_table(head, ([r["method"], _fmt(r["ms_per_token"], ".2f"), _fmt(r["tokens_per_s"], ".1f"),
                            _fmt(r["speedup_over_ar"], ".2f") + ("x" if r["speedup_over_ar"] is not None else ""),
                            _fmt(None if r["gain_over_chain"] is None else 100 * r["gain_over_chain"], "+.1f")
                            + ("%" if r["gain_over_chain"] is not None else ""),
                            _fmt(r["mean_R"], ".2f"), _fmt(r["mean_budget"], ".1f"), _fmt(r["ttft_ms"], ".1f"),
                            *(f"{100 * r[k]:.0f}%" for k in ("draft_share", "verify_share", "overhead_share")),
                            _agreement(r)] for r in rows))
