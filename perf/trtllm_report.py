"""One throughput cell as trtllm-bench reports a run (`--report_json`): the same top-level keys
(`engine`, `world_info`, `request_info`, `performance`, `streaming_metrics`, `decoding_stats`,
`dataset`) and key names, from per-request records, so a CAST run can be set beside a
trtllm-bench report.

Terms (trtllm-bench's): output tokens include the first; request throughput = requests /
(last end - first start); per-user output TPS = the mean over requests of output tokens /
request latency; TPOT = (end - first token) / (output tokens - 1); token_output_speed = the
mean over requests of 1 / TPOT.

Decoding stats of a TREE, defined to compare with a chain's (stated in the report too):
  num_draft_tokens            tree nodes verified (what the target pass paid for; a chain's L)
  num_accepted_draft_tokens   draft tokens committed (each drafted round's R - 1)
  acceptance_length           committed tokens per drafted round (R, DFlash's tau)
  draft_acceptance_rate       accepted / drafted positions: per drafted POSITION, the share of
                              the tokens a round could accept that it did (L, or fewer in a
                              request's last rounds: no tree reaches past max_tokens); for a chain
                              this is trtllm-bench's accepted / draft tokens exactly
  node_acceptance_rate        accepted / tree nodes (trtllm-bench's formula applied to nodes:
                              falls as the tree widens, so it does not compare with a chain's)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

DEFINITION = ("draft_acceptance_rate = accepted draft tokens / drafted positions (L a drafted round, fewer where a "
              "request's max_tokens leaves less room: no tree reaches past it): for a chain "
              "this is trtllm-bench's accepted / draft tokens; for a CAST tree it counts positions, not nodes, so "
              "it compares with a chain's. num_draft_tokens counts tree nodes (node_acceptance_rate = accepted / "
              "nodes). acceptance_length = committed tokens per drafted round.")


@dataclass(frozen=True, slots=True)
class RequestRecord:
    input_tokens: int
    output_tokens: int
    start_s: float  # admission (arrival)
    first_token_s: float
    end_s: float
    accept_lengths: Sequence[int] = ()  # committed R per round
    budgets: Sequence[int] = ()  # tree nodes N per round
    drafted: Sequence[bool] = field(default_factory=tuple)
    max_new_tokens: int | None = None  # its cap: a round drafts min(L, tokens left - 1) positions (None: L)


def percentiles(values: Sequence[float], scale: float = 1.0) -> dict[str, float] | None:
    """trtllm-bench's percentile block (minimum, maximum, average, p50, p90, p95, p99)."""
    if not len(values):
        return None
    v = np.asarray(values, dtype=np.float64) * scale
    out = {"minimum": float(v.min()), "maximum": float(v.max()), "average": float(v.mean())}
    return out | {f"p{q}": float(np.percentile(v, q)) for q in (50, 90, 95, 99)}


def decoding_stats(records: Sequence[RequestRecord], mode: str, positions: int) -> dict[str, Any]:
    """Per-request draft counts and rates as percentiles (requests that never drafted left out)."""
    drafts, accepted, rates, node_rates, lengths = [], [], [], [], []
    for r in records:
        rounds = [(n, a) for n, a, d in zip(r.budgets, r.accept_lengths, r.drafted) if d]
        if not rounds:
            continue
        nodes, acc = sum(n for n, _ in rounds), sum(a - 1 for _, a in rounds)
        drafts.append(nodes)
        accepted.append(acc)
        rates.append(acc / drafted_positions(r, positions))
        node_rates.append(acc / nodes if nodes else 0.0)
        lengths.append((acc + len(rounds)) / len(rounds))
    return {"mode": mode, "num_draft_tokens_percentiles": percentiles(drafts),
            "num_accepted_draft_tokens_percentiles": percentiles(accepted),
            "draft_acceptance_rate_percentiles": percentiles(rates),
            "acceptance_length_percentiles": percentiles(lengths),
            "node_acceptance_rate_percentiles": percentiles(node_rates),
            "draft_positions_L": positions, "definition": DEFINITION}


def drafted_positions(r: RequestRecord, positions: int) -> int:
    """The positions its drafted rounds could accept: L each, fewer once max_tokens leaves less room (the
    prefill emits the first token; a round commits its accept length)."""
    if r.max_new_tokens is None:
        return positions * sum(map(bool, r.drafted))
    emitted = 1 + np.concatenate([[0], np.cumsum(r.accept_lengths)[:-1]])  # tokens out before each round
    room = r.max_new_tokens - emitted
    return int(sum(min(positions, int(left) - 1) for left, d in zip(room, r.drafted) if d))


def bench_report(records: Sequence[RequestRecord], engine: dict[str, Any], concurrency: int, method: str,
                 positions: int | None, dataset: str) -> dict[str, Any]:
    """A trtllm-bench `--report_json` document of one (concurrency, method) run."""
    start, end = min(r.start_s for r in records), max(r.end_s for r in records)
    total_s = max(end - start, 1e-9)
    out_tokens = [r.output_tokens for r in records]
    latency = [r.end_s - r.start_s for r in records]
    ttft = [r.first_token_s - r.start_s for r in records]
    tpot = [(r.end_s - r.first_token_s) / (r.output_tokens - 1) for r in records if r.output_tokens > 1]
    gen_tps = [1.0 / t for t in tpot if t > 0]
    in_tokens = [r.input_tokens for r in records]
    report = {
        "engine": {"model": engine.get("target"), "backend": engine.get("backend"), "dtype": engine.get("dtype"),
                   "method": method, "version": engine.get("version")},
        "world_info": {"tp_size": 1, "pp_size": 1, "ep_size": 1, "world_size": 1, "max_batch_size": concurrency,
                       "max_num_tokens": engine.get("max_num_tokens")},
        "request_info": {"num_requests": len(records), "avg_num_concurrent_requests": sum(latency) / total_s,
                         "avg_input_length": float(np.mean(in_tokens)), "avg_output_length": float(np.mean(out_tokens))},
        "performance": {
            "total_latency_ms": total_s * 1e3, "avg_request_latency_ms": float(np.mean(latency)) * 1e3,
            "request_throughput_req_s": len(records) / total_s,
            "system_output_throughput_tok_s": sum(out_tokens) / total_s,
            "system_total_throughput_tok_s": (sum(out_tokens) + sum(in_tokens)) / total_s,
            "output_throughput_per_user_tok_s": float(np.mean([o / max(t, 1e-9) for o, t in zip(out_tokens, latency)])),
            "output_throughput_per_gpu_tok_s": sum(out_tokens) / total_s,
            "request_latency_percentiles_ms": percentiles(latency, 1e3)},
        "streaming_metrics": {
            "token_output_speed_tok_s": float(np.mean(gen_tps)) if gen_tps else 0.0,
            "avg_ttft_ms": float(np.mean(ttft)) * 1e3, "avg_tpot_ms": float(np.mean(tpot)) * 1e3 if tpot else 0.0,
            "tpot_percentiles": percentiles(tpot, 1e3), "ttft_percentiles": percentiles(ttft, 1e3),
            "gen_tps_percentiles": percentiles(gen_tps)},
        "dataset": {"name": dataset, "num_requests": len(records), "avg_isl": float(np.mean(in_tokens)),
                    "avg_osl": float(np.mean(out_tokens))},
    }
    if positions is not None and any(any(r.drafted) for r in records):
        report["decoding_stats"] = decoding_stats(records, method, positions)
    return report
