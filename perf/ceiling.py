"""How fast CAST could be on this machine: the speedup ceiling left by the verify pass alone.

From a width sweep (`perf.bench sweep`, whose page shows this table), per domain and fixed
N: the measured committed length R(N) and the verify ms per round c(N) give the speedup
over AR if drafting and host work cost nothing:

    ceiling(N) = t_AR / (c(N) / R(N)) = t_AR / (t(N) * verify_share(N))

and, with only drafting free (host work as measured), t_AR / (t(N) * (verify + overhead
share)). The best N of each is the most any width rule, draft gate or faster drafter
could reach on this target, drafter head and machine: when it sits below a speedup goal,
the goal needs a better drafter (higher R) or a flatter verify curve, not more tuning.
"""

from __future__ import annotations

from typing import Any, Mapping


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
    lines = ["| domain | AR ms/tok | best N | R at that N | ceiling, draft + host free "
             "| ceiling, draft free | cast:auto measured |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        auto = "-" if r["measured_auto"] is None else f"{r['measured_auto']:.2f}x"
        lines.append(f"| {r['domain']} | {r['ar_ms']:.1f} | {r['best_N']} | {r['R_at_best_N']:.2f} "
                     f"| {r['ceiling_draft_and_host_free']:.2f}x | {r['ceiling_draft_free']:.2f}x | {auto} |")
    if rows:
        def mean(values: list) -> str:
            values = [v for v in values if v is not None]
            return f"{sum(values) / len(values):.2f}x" if values else "-"

        lines.append(f"| **mean** | | | | {mean([r['ceiling_draft_and_host_free'] for r in rows])} "
                     f"| {mean([r['ceiling_draft_free'] for r in rows])} | {mean([r['measured_auto'] for r in rows])} |")
    return "\n".join(lines)
