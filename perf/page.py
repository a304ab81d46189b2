"""The markdown page (and its plots) of a `perf.bench` report: what ran, on what machine,
the command that reproduces it, and the figures as ratios measured side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from perf.report import format_table, md_table


def _plot_path(out: str | None, suffix: str) -> Path | None:
    """OUT<suffix>.png, or None without --out."""
    if not out:
        return None
    stem = Path(out).with_suffix("")
    return stem.with_name(f"{stem.name}{suffix}.png")


def _header(title: str, report: dict[str, Any]) -> list[str]:
    first = next(iter(report["domains"].values()))  # a latency report keeps them per domain
    machine, engine = report.get("machine") or first["machine"], report.get("engine") or first["engine"]
    lines = [f"# {title}", "", "Reproduce:", "", "```bash", report["command"], "```", "",
             f"Machine: {machine.get('cpu_model')}, {machine.get('cpu_count')} cores, {machine.get('torch_threads')} "
             f"torch thread(s); {machine.get('platform')}; torch {machine.get('torch')}."]
    if "server" in engine:
        return lines + [f"Server: `{engine['server']}` (`build_engine` defaults unless the flags say otherwise).", ""]
    return lines + [f"Engine (`build_engine` defaults unless the command says otherwise): target "
                    f"{engine.get('target')}, drafter `{engine.get('drafter')}`, {engine.get('backend')} "
                    f"{engine.get('dtype')}, {engine.get('threads')} thread(s) ({engine.get('execution')}); `auto` "
                    f"prices trees with: {engine.get('width_profile')}.", ""]


def speedup_rows(report: dict[str, Any]) -> tuple[list[str], dict[str, dict[str, float | None]]]:
    """Methods (run order) and {method: {domain: t_AR / t}} over every domain of a latency report."""
    methods = [r["method"] for r in next(iter(report["domains"].values()))["summary"]]
    cells = {m: {d: next((r["speedup_over_ar"] for r in rep["summary"] if r["method"] == m), None)
                 for d, rep in report["domains"].items()} for m in methods}
    return methods, cells


def speedup_table(report: dict[str, Any]) -> str:
    """Speedup over AR (decode ms/token ratio, same run) per method and domain, with the mean,
    and how many greedy outputs equal AR's."""
    methods, cells = speedup_rows(report)
    names, body = list(report["domains"]), []
    for m in methods:
        values = [cells[m][d] for d in names]
        mean = sum(v for v in values if v) / max(1, sum(1 for v in values if v))
        rows = [next(r for r in rep["summary"] if r["method"] == m) for rep in report["domains"].values()]
        equal = [r.get("equal_to_ar") for r in rows]
        agree = "-" if None in equal else f"{sum(equal)}/{sum(r['requests'] for r in rows)}"
        body.append([m, *("-" if v is None else f"{v:.2f}x" for v in values), f"{mean:.2f}x", agree])
    return md_table(["method", *names, "mean", "= AR"], body)


def plot_speedups(report: dict[str, Any], out: Path) -> Path:
    """Bars: speedup over AR per method (colour) and domain (group), 1.0 marked."""
    import numpy as np

    from perf.plots import plt, save_figure

    methods, cells = speedup_rows(report)
    names = list(report["domains"])
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(names) + 2), 4))
    width = 0.8 / len(methods)
    for i, m in enumerate(methods):
        ax.bar(np.arange(len(names)) + i * width, [cells[m][d] or 0 for d in names], width, label=m)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names)
    ax.set_ylabel("decode speedup over AR (same run, B = 1)")
    ax.legend(ncol=min(len(methods), 6), fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    return save_figure(fig, out)


ROUND_PARTS = ("feature cache", "draft", "trees (host)", "verify", "commit (host)", "round")


def latency_page(report: dict[str, Any], out: str | None) -> str:
    """The latency (or sweep) page; with `out`, OUT.png (speedups), OUT_R_<domain>.png (round
    lengths) and, for a sweep, OUT_sweep.png (gain over the chain vs N per domain) beside it."""
    from perf.plots import plot_accept_histograms, plot_width_sweep
    from perf.sweep import ceiling_rows, ceiling_table, format_sweep

    first = next(iter(report["domains"].values()))
    s, eos = first["settings"], "ignored" if first["engine"].get("ignore_eos") else "honoured"
    sweep = report.get("sweep")
    lines = _header("Width sweep: CAST at each budget N against the predicted width" if sweep else
                    "Latency (B = 1): one engine and outside peers, side by side", report)
    lines += [f"{first['dataset']['num_requests']} prompts per domain x {s.get('max_new_tokens') or 'each row’s'} "
              f"new tokens, temperature {s.get('temperature', 0.0)}, EOS {eos}; "
              f"every method interleaved per prompt (order rotated), warmed up first; run {s['date']}. "
              f"Timer: {s['timer']}.", ""]
    for name, what in report.get("peers", {}).items():
        lines.append(f"- peer `{name}`: {what}")
    for name, why in report.get("peer_gaps", {}).items():
        lines.append(f"- peer `{name}`: **not run here** — {why}")
    if sweep:
        lines += ["", format_sweep(sweep), "", "## What this machine allows", "",
                  "The most any width rule, gate or faster drafter could reach here: each fixed N's measured R(N) "
                  "over its verify time alone (`perf/sweep.py`; best N shown).", "",
                  ceiling_table(ceiling_rows(report["domains"]))]
        png = _plot_path(out, "_sweep")
        if png is not None:
            plot_width_sweep({d: t["gain_over_chain"] for d, t in sweep.items()}, png,
                             {d: t["predicted_gain"] for d, t in sweep.items() if t["predicted_gain"] is not None})
            lines += ["", f"![gain over the chain vs N]({png.name})"]
    lines += ["", "## Speedup over AR (decode ms/token of AR / of the method, same run)", "", speedup_table(report)]
    png = _plot_path(out, "")
    if png is not None:
        plot_speedups(report, png)
        lines += ["", f"![speedup over AR]({png.name})"]
    lines += ["", "Columns below: decode ms/token t, tokens/s, speedup t_AR / t, gain t_chain / t - 1, mean committed "
              "round length R, mean tree size N, TTFT, share of decode time in draft / verify / overhead (peers: not "
              "split), and requests whose greedy tokens equal AR's (`!`: a lossless method that differs)."]
    for name, rep in report["domains"].items():
        lines += ["", f"## {name}", "", format_table(rep["summary"])]
        if rep.get("round_parts_ms"):
            lines += ["", "Where a decode round's time goes (`--round-parts`, timed in place), ms per round:", "",
                      md_table(["method", "rounds", *ROUND_PARTS],
                               ([m, f"{p['rounds']:.0f}", *(f"{p.get(k, 0.0):.2f}" for k in ROUND_PARTS)]
                                for m, p in rep["round_parts_ms"].items()))]
        for r in rep.get("relaxed", []):
            lines += ["", f"LOSSY {r['label']}: R {r['mean_R']:.2f} (lossless {r['lossless_mean_R']:.2f}), "
                      f"per-step TV {r['mean_step_tv']:.4f}, "
                      f"response length {100 * r['response_length_change']:+.1f}%, "
                      f"Eq. 4 proxy {r['eq4_speedup_proxy']:.2f}x (lossless {r['lossless_eq4_speedup_proxy']:.2f}x)"]
        hist = _plot_path(out, f"_R_{name}")
        if hist is not None and rep.get("accept_lengths"):
            plot_accept_histograms(rep["accept_lengths"], hist)
            lines += ["", f"![R histogram]({hist.name})"]
    return "\n".join(lines) + "\n"


def throughput_table(rows: list[dict], labels: list[str], levels: list[int], key: str) -> str:
    """`key` per method (rows) and concurrency (columns), then each cell over AR's, and = AR."""
    by, body = {(r["concurrency"], r["method"]): r for r in rows}, []
    for label in labels:
        cells = [by[c, label][key] for c in levels]
        ratios = [None if v is None or not by[c, "ar"][key] else v / by[c, "ar"][key] for c, v in zip(levels, cells)]
        equal = sum(by[c, label]["equal_to_ar"] for c in levels)
        total = sum(by[c, label]["requests"] for c in levels)
        body.append([label, *("-" if v is None else f"{v:.1f}" for v in cells),
                     " / ".join("-" if r is None else f"{r:.2f}" for r in ratios),
                     f"{equal}/{total}{'' if equal == total else '!'}"])
    return md_table(["method", *(f"c={c}" for c in levels), "x AR at each c", "= AR"], body)


THROUGHPUT_TABLES = {
    "engine": [("tokens_per_s", "End to end (prefill included), tokens/s"),
               ("decode_tokens_per_s", "Goodput: tokens after each first one / seconds inside the rounds "
                                       "(`LLMEngine.step`; prompt chunks ride the rounds), tokens/s"),
               ("mean_R", "Mean committed round length R"), ("mean_N", "Mean tree size N per request-round")],
    "openai": [("tokens_per_s", "All requests' tokens / wall seconds, tokens/s"), ("p50_ttft_ms", "TTFT p50, ms"),
               ("p99_ttft_ms", "TTFT p99, ms"), ("p50_itl_ms", "Inter-token latency p50, ms"),
               ("p99_latency_ms", "Request latency p99, ms"), ("lost", "Requests lost")],
}


def throughput_page(report: dict[str, Any], out: str | None) -> str:
    """The throughput page; with `out`, OUT.png (tokens/s vs concurrency per method and domain)."""
    via = report.get("via", "engine")
    first = next(iter(report["domains"].values()))[0]
    lines = _header(f"Throughput over concurrency: one engine, continuous batching"
                    f"{' behind the OpenAI server' if via == 'openai' else ''}", report)
    runs = len(first.get("runs_tokens_per_s", [0]))
    order = (f"each cell is the median of {runs} runs (of an even count, the slower middle one), the method order "
             "rotated from run to run" if runs > 1 else "methods run one after another at each concurrency")
    lines += [f"{first['requests']} prompts x {first['tokens'] // first['requests']} new tokens per domain, greedy, "
              f"EOS ignored; {order}; every output checked against AR alone.", ""]
    for name, rows in report["domains"].items():
        lines += [f"## {name}", ""]
        for key, what in THROUGHPUT_TABLES[via]:
            lines += [f"{what}:", "", throughput_table(rows, report["methods"], report["concurrency"], key), ""]
    png = _plot_path(out, "")
    if png is not None:
        from perf.plots import plt, save_figure

        fig, axes = plt.subplots(1, len(report["domains"]), figsize=(5 * len(report["domains"]), 4), squeeze=False)
        for ax, (name, rows) in zip(axes[0], report["domains"].items()):
            for m in report["methods"]:
                mine = [r for r in rows if r["method"] == m]
                ax.plot([r["concurrency"] for r in mine], [r["tokens_per_s"] for r in mine], marker="o", label=m)
            ax.set_xscale("log", base=2)
            ax.set(title=name, xlabel="concurrency (live requests)", ylabel="tokens/s (end to end)")
            ax.legend(fontsize=7)
        save_figure(fig, png)
        lines += [f"![tokens/s vs concurrency]({png.name})"]
    return "\n".join(lines) + "\n"


PAGES = {"latency": latency_page, "throughput": throughput_page, "sweep": latency_page}


@click.command()
@click.argument("report", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def main(report: Path) -> None:
    """Rewrite REPORT's page (REPORT with .md) and plots from a `perf.bench` JSON report; runs nothing."""
    data = json.loads(report.read_text())
    page = report.with_suffix(".md")
    page.write_text(PAGES[data["mode"]](data, str(report)))
    click.echo(f"wrote {page}")


if __name__ == "__main__":
    main()
