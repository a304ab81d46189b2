"""`cast-trtllm prepare-dataset | bench | sweep`: trtllm-bench-style runs of AR, chain, CAST.

    cast-trtllm prepare-dataset gsm8k --out gsm8k.jsonl --num-prompts 20 --output-tokens 128
    cast-trtllm bench --dataset gsm8k --methods ar,chain,cast:15,cast:auto --num-prompts 20 \
        [--target DIR --drafter DIR] --report-json report.json
    cast-trtllm sweep --dataset gsm8k,humaneval --budgets 1,3,7,15,31,63 ...

Both run the one engine (`runtime.engine`) that `generate` and the servers run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from cast_trtllm.sampling import SamplingParams
from perf.datasets import DEFAULT_OUTPUT_TOKENS, NAMED_SETS, DatasetError, load_dataset, named_requests, write_requests
from perf.harness import MethodSpec, parse_methods, run_bench
from perf.report import build_report, format_table
from runtime.options import engine_options, model_options, spec_options

_DATA_DIR = click.option("--data-dir", type=click.Path(file_okay=False), default=None,
                         help="Evaluation data directory (default: ../shared/data next to the repo).")
_NUM = click.option("--num-prompts", type=int, default=None, help="Use the first N prompts (default: all).")
_SKIP = click.option("--skip-prompts", type=click.IntRange(min=0), default=0, show_default=True,
                     help="Drop the first K of those prompts (shard one set across cores: "
                          "--num-prompts 20 --skip-prompts 14 runs prompts 14..19).")
_MAX_NEW = click.option("--max-new-tokens", type=int, default=None,
                        help="Token budget for every request and method (default: each row's output_tokens).")
_COMMON = [
    click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy."),
    click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed (request i uses seed + i)."),
    click.option("--ignore-eos", is_flag=True, help="Always generate the full token budget."),
    click.option("--no-chat", is_flag=True, help="Feed prompts raw instead of as one chat-template user turn."),
    click.option("--no-progress", is_flag=True, help="Hide the progress bar."),
]


def _common(fn):
    for option in reversed(_COMMON):
        fn = option(fn)
    return fn


def _fail(err: Exception) -> click.ClickException:
    return click.ClickException(str(err))


@click.command("prepare-dataset")
@click.argument("name", type=click.Choice(sorted(NAMED_SETS)))
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="Output JSONL (trtllm-bench format).")
@_NUM
@click.option("--output-tokens", type=int, default=DEFAULT_OUTPUT_TOKENS, show_default=True,
              help="output_tokens of every row.")
@_DATA_DIR
def prepare_dataset(name: str, out: str, num_prompts: int | None, output_tokens: int, data_dir: str | None) -> None:
    """Write a named prompt set as a trtllm-bench dataset JSONL."""
    try:
        requests = named_requests(name, num_prompts, output_tokens, data_dir)
    except DatasetError as err:
        raise _fail(err) from None
    write_requests(requests, out)
    click.echo(f"wrote {len(requests)} requests of {name} to {out}")


def _session(options: dict[str, Any], ignore_eos: bool, no_chat: bool, relaxed: bool = False):
    from perf.session import load_session

    return load_session(engine_options(**options), ignore_eos, not no_chat, relaxed)


def _run(dataset: str, specs: list[MethodSpec], session, num_prompts, max_new_tokens, data_dir, temperature,
         seed, no_progress, settings: dict[str, Any], skip_prompts: int = 0) -> dict[str, Any]:
    requests = load_dataset(dataset, num_prompts, max_new_tokens, data_dir)
    if skip_prompts >= len(requests):
        raise ValueError(f"--skip-prompts {skip_prompts} leaves none of the {len(requests)} prompts of {dataset}")
    requests = requests[skip_prompts:]
    bench = run_bench(requests, specs, session, session.encode, SamplingParams(temperature, seed=seed),
                      progress=not no_progress)
    report = build_report(bench, dataset, [r.output_tokens for r in requests], session.engine,
                          {**settings, "temperature": temperature, "seed": seed,
                           "methods": [s.label for s in specs], "num_prompts": len(requests),
                           "skip_prompts": skip_prompts})
    report["_bench"] = bench  # popped by callers that need per-request data
    return report


@click.command()
@click.option("--dataset", required=True, help=f"trtllm-bench JSONL file or a named set {sorted(NAMED_SETS)}.")
@click.option("--methods", default="ar,chain,cast", show_default=True,
              help="Comma list of ar, chain, cast[:N|auto]; bare cast takes the options' budget, else auto.")
@_NUM
@_MAX_NEW
@click.option("--report-json", type=click.Path(dir_okay=False), default=None, help="Write the JSON report here.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report on stdout instead of the table.")
@click.option("--histogram-png", type=click.Path(dir_okay=False), default=None,
              help="Write committed-round-length histograms (PNG).")
@click.option("--relaxed", default=None, metavar="NAME:ALPHA",
              help="LOSSY: also run every speculative method under this relaxed rule (needs --temperature > 0).")
@model_options
@spec_options
@_DATA_DIR
@_common
def bench(dataset, methods, num_prompts, max_new_tokens, report_json, as_json, histogram_png, relaxed,
          data_dir, temperature, seed, ignore_eos, no_chat, no_progress, **options) -> None:
    """Decode-only ms/token, speedup over AR, gain over chain, R, TTFT and time split per method."""
    try:
        base = engine_options(**options, quiet=True).spec
        if base.method == "cast" and base.budget != "auto":
            methods = ",".join(f"cast:{base.budget}" if m.strip() == "cast" else m for m in methods.split(","))
        specs = parse_methods(methods)
        rule = None
        if relaxed is not None:
            from perf.relaxed_eval import parse_relaxed

            rule = parse_relaxed(relaxed)
            if temperature <= 0:
                raise ValueError("--relaxed rules are sampling rules: pass --temperature > 0")
            specs += [MethodSpec(s.method, s.budget, rule) for s in specs if s.method != "ar"]
        session = _session(options, ignore_eos, no_chat, relaxed=rule is not None)
        report = _run(dataset, specs, session, num_prompts, max_new_tokens, data_dir, temperature, seed,
                      no_progress, {"command": "bench"})
    except (ValueError, DatasetError) as err:
        raise _fail(err) from None
    bench_run = report.pop("_bench")
    if rule is not None:
        from perf.relaxed_eval import relaxed_block

        blocks = {b["label"]: b for b in report["runs"]}
        report["relaxed"] = [
            relaxed_block(s.label, rule, blocks[s.label], blocks[s.base_label],
                          [tv for r in bench_run.runs[s.label] for tv in (r.step_tvs or [])])
            for s in specs if s.relaxed is not None]
    if histogram_png:
        from perf.plots import plot_accept_histograms

        plot_accept_histograms({s.label: [R for r in bench_run.runs[s.label] for R in r.result.accept_lengths]
                                for s in specs}, histogram_png)
    _emit(report, report_json, as_json)


def _emit(report: dict[str, Any], report_json: str | None, as_json: bool) -> None:
    text = json.dumps(report, indent=2)
    if report_json:
        Path(report_json).parent.mkdir(parents=True, exist_ok=True)
        Path(report_json).write_text(text + "\n")
    if as_json:
        click.echo(text)
        return
    click.echo(format_table(report["summary"]))
    for r in report.get("relaxed", []):
        click.echo(f"LOSSY {r['label']}: R {r['mean_R']:.2f} (lossless {r['lossless_mean_R']:.2f}), "
                   f"per-step TV {r['mean_step_tv']:.4f}, response length {100 * r['response_length_change']:+.1f}%, "
                   f"Eq.4 proxy {r['eq4_speedup_proxy']:.2f}x (lossless {r['lossless_eq4_speedup_proxy']:.2f}x)")
    if report_json:
        click.echo(f"wrote {report_json}")


# ------------------------------------------------------------------------------ sweep
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

    lines = ["| domain | auto: mean N (drafted rounds) | gain | gap (pp) | ungated: mean N | gain | gap (pp) "
             "| oracle width (gain) | gain at widest N |", "|---|---|---|---|---|---|---|---|---|"]
    for domain, s in sweep.items():
        cells = []
        for key in ("", "ungated_"):
            width, share = s.get(f"{key}predicted_width"), s.get(f"{key}drafted_share")
            head = "-" if width is None else f"{width:.1f}" + ("" if key or share is None else f" ({pct(share, '.0f')}%)")
            gap = s.get(f"{key}gap_pp")
            cells += [head, pct(s.get(f"{key}predicted_gain")) + ("%" if s.get(f"{key}predicted_gain") is not None else ""),
                      "-" if gap is None else f"{gap:+.1f}"]
        lines.append(f"| {domain} | " + " | ".join(cells) + f" | {s['oracle_width']} ({pct(s['oracle_gain'])}%) "
                     f"| {pct(s['gain_at_widest'])}% |")
    return "\n".join(lines)


@click.command()
@click.option("--dataset", required=True, help="Comma list of named sets or JSONL files (one domain each).")
@click.option("--budgets", default="1,3,7,15,31,63", show_default=True, help="Comma list of CAST budgets N.")
@click.option("--no-auto", is_flag=True, help="Skip cast:auto and cast:auto-ungated (no width profile needed).")
@click.option("--no-ar", is_flag=True, help="Skip the autoregressive reference row.")
@click.option("--no-ungated", is_flag=True, help="Skip cast:auto-ungated (the width policy without the draft gate).")
@_NUM
@_SKIP
@_MAX_NEW
@click.option("--report-json", type=click.Path(dir_okay=False), default=None, help="Write the JSON report here.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report on stdout instead of the tables.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write gain vs N per domain (PNG).")
@model_options
@spec_options
@_DATA_DIR
@_common
def sweep(dataset, budgets, no_auto, no_ar, no_ungated, num_prompts, skip_prompts, max_new_tokens, report_json,
          as_json, plot, data_dir, temperature, seed, ignore_eos, no_chat, no_progress, **options) -> None:
    """Width sweep: ms/token of AR, chain and CAST at each budget N, sweep oracle vs predicted auto width."""
    try:
        ns = sorted({int(b) for b in budgets.split(",")})
        if not ns or ns[0] < 1:
            raise ValueError(f"--budgets {budgets!r}: expected positive integers")
        specs = ([] if no_ar else [MethodSpec("ar")]) + [MethodSpec("chain")] + [MethodSpec("cast", n) for n in ns]
        specs += [] if no_auto else [MethodSpec("cast", draft_gate=True)] + ([] if no_ungated else [MethodSpec("cast")])
        session = _session(options, ignore_eos, no_chat)
        domains = {}
        for name in (d.strip() for d in dataset.split(",")):
            domains[name] = _run(name, specs, session, num_prompts, max_new_tokens, data_dir, temperature, seed,
                                 no_progress, {"command": "sweep", "budgets": ns}, skip_prompts)
            domains[name].pop("_bench")
    except (ValueError, DatasetError) as err:
        raise _fail(err) from None
    table = {name: sweep_table(r["summary"], ns) for name, r in domains.items()}
    report = {"sweep": table, "domains": domains}
    if plot:
        from perf.plots import plot_width_sweep

        plot_width_sweep({d: t["gain_over_chain"] for d, t in table.items()}, plot,
                         {d: t["predicted_gain"] for d, t in table.items() if t["predicted_gain"] is not None})
    if report_json:
        Path(report_json).parent.mkdir(parents=True, exist_ok=True)
        Path(report_json).write_text(json.dumps(report, indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for name, r in domains.items():
        click.echo(f"\n{name}\n" + format_table(r["summary"]))
    click.echo("\n" + format_sweep(table))
    if report_json:
        click.echo(f"wrote {report_json}")
