"""The width sweep's tables (paper Table 2): AR, chain and CAST at each budget N, the sweep
oracle next to the width `auto` predicts, per domain, from `perf.bench sweep` (a `latency` run
over those methods); and the ceiling the verify pass leaves on this machine (`ceiling_rows`).

    python -m perf.bench sweep --dataset gsm8k,humaneval,mt_bench --budgets 1,3,7,15,31,63 \
        --num-prompts 20 --max-new-tokens 128 --out perf/results/width_sweep_cpu
"""

from __future__ import annotations

from typing import Any, Mapping

from perf.report import md_table


def sweep_table(summary: list[dict[str, Any]], budgets: list[int]) -> dict[str, Any]:
    """Paper Table 2 row for one domain: predicted (auto) vs sweep-oracle width.

    `auto` is the product's width (policy + draft gate); `ungated` the width policy alone.
    gap_pp = 100 * (gain of auto - gain of the best swept budget), both over the chain.
    """
    rows = {r["method"]: r for r in summary}
    gains = {n: rows[f"cast:{n}"]["gain_over_chain"] for n in budgets}
    oracle = max(budgets, key=lambda n: gains[n])
    out = {"ms_per_token": {n: rows[f"cast:{n}"]["ms_per_token"] for n in budgets},
           "chain_ms_per_token": rows["chain"]["ms_per_token"],
           "ar_ms_per_token": rows["ar"]["ms_per_token"] if "ar" in rows else None,
           "gain_over_chain": gains, "oracle_width": oracle, "oracle_gain": gains[oracle],
           "gain_at_widest": gains[budgets[-1]]}
    for key, label in (("", "cast:auto"), ("ungated_", "cast:auto-ungated")):
        row = rows.get(label)
        out |= {f"{key}predicted_width": None if row is None else row["mean_budget"],
                f"{key}predicted_gain": None if row is None else row["gain_over_chain"],
                f"{key}gap_pp": None if row is None else 100 * (row["gain_over_chain"] - gains[oracle]),
                f"{key}drafted_share": None if row is None else row.get("drafted_share")}
    return out


def format_sweep(sweep: dict[str, dict[str, Any]]) -> str:
    def pct(value: float | None, spec: str = "+.1f") -> str:
        return "-" if value is None else format(100 * value, spec)

    body = []
    for domain, s in sweep.items():
        cells = []
        for key in ("", "ungated_"):
            width, share = s.get(f"{key}predicted_width"), s.get(f"{key}drafted_share")
            head = "-" if width is None else f"{width:.1f}"
            head += "" if width is None or key or share is None else f" ({pct(share, '.0f')}%)"
            gap, gain = s.get(f"{key}gap_pp"), s.get(f"{key}predicted_gain")
            cells += [head, pct(gain) + ("%" if gain is not None else ""), "-" if gap is None else f"{gap:+.1f}"]
        body.append([domain, *cells, f"{s['oracle_width']} ({pct(s['oracle_gain'])}%)",
                     f"{pct(s['gain_at_widest'])}%"])
    return md_table(["domain", "auto: mean N (drafted rounds)", "gain", "gap (pp)", "ungated: mean N", "gain",
                     "gap (pp)", "oracle width (gain)", "gain at widest N"], body)


# The speedup ceiling left by the verify pass alone. Per domain and fixed N, the measured
# committed length R(N) and verify ms per round c(N) give the speedup over AR if drafting
# and host work cost nothing: ceiling(N) = t_AR / (c(N) / R(N)) = t_AR / (t(N) * verify_share(N));
# with only drafting free, t_AR / (t(N) * (verify + overhead share)). The best N of each is
# the most any width rule, draft gate or faster drafter could reach on this target, head and
# machine: below a speedup goal, the goal needs a better drafter (higher R) or a flatter
# verify curve, not more tuning.
def _fixed_n(method: str) -> int | None:
    name = method.split(":", 1)[1] if method.startswith("cast:") else ""
    return int(name) if name.isdigit() else None


def ceiling_rows(reports: Mapping[str, Mapping]) -> list[dict[str, Any]]:
    """Per domain: the best fixed N's ceilings next to what cast:auto measured."""
    rows = []
    for domain, rep in reports.items():
        summary = {r["method"]: r for r in rep["summary"]}
        if "ar" not in summary:  # a run without AR has nothing to compare with
            continue
        ar = summary["ar"]["ms_per_token"]
        free_draft, free_all = {}, {}
        for method, r in summary.items():
            n = _fixed_n(method)
            if n is None or not r.get("verify_share"):
                continue
            free_all[n] = ar / (r["ms_per_token"] * r["verify_share"])
            free_draft[n] = ar / (r["ms_per_token"] * (r["verify_share"] + r["overhead_share"]))
        if not free_all:
            continue
        best = max(free_all, key=free_all.get)
        auto = summary.get("cast:auto")
        rows.append({
            "domain": domain, "ar_ms": ar, "best_N": best, "R_at_best_N": summary[f"cast:{best}"]["mean_R"],
            "ceiling_draft_and_host_free": free_all[best], "ceiling_draft_free": max(free_draft.values()),
            "measured_auto": None if auto is None else ar / auto["ms_per_token"],
            "per_N_draft_and_host_free": dict(sorted(free_all.items())),
        })
    return rows


def ceiling_table(rows: list[dict[str, Any]]) -> str:
    def mean(values: list) -> str:
        values = [v for v in values if v is not None]
        return f"{sum(values) / len(values):.2f}x" if values else "-"

    body = [[r["domain"], f"{r['ar_ms']:.1f}", r["best_N"], f"{r['R_at_best_N']:.2f}",
             f"{r['ceiling_draft_and_host_free']:.2f}x", f"{r['ceiling_draft_free']:.2f}x",
             "-" if r["measured_auto"] is None else f"{r['measured_auto']:.2f}x"] for r in rows]
    if rows:
        keys = ("ceiling_draft_and_host_free", "ceiling_draft_free", "measured_auto")
        body.append(["**mean**", "", "", "", *(mean([r[k] for r in rows]) for k in keys)])
    return md_table(["domain", "AR ms/tok", "best N", "R at that N", "ceiling, draft + host free",
                     "ceiling, draft free", "cast:auto measured"], body)
