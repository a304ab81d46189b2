"""One benchmark, shaped like `trtllm-bench`, on the engine the servers run (`build_engine`
defaults unless flags say otherwise), with outside peers as rows of the same run.

    python -m perf.bench latency --dataset gsm8k,humaneval --num-prompts 20 --max-new-tokens 128 \
        --methods ar,chain,cast:auto,dflash,hf --out perf/results/latency_cpu
    python -m perf.bench throughput --dataset gsm8k --num-prompts 16 --max-new-tokens 32 \
        --concurrency 1,4,16,32 --methods ar,chain,cast:3,cast:auto --out perf/results/throughput_cpu
    python -m perf.bench sweep --dataset gsm8k,mt_bench --budgets 1,3,7,15,31,63 --out sweep
    python -m perf.bench throughput --via openai ...   # the same, through `serve --api openai`
    python -m perf.bench tree --budget 127   # tree construction vs a heapq reference (perf.bench_tree)
    python -m perf.bench backends            # one verify pass per backend x threads (perf.bench_backends)

(`cast-trtllm bench latency|throughput|sweep` is the same command.) `latency` decodes one
request at a time (B = 1), every method interleaved per prompt with the order rotated
(`perf.harness`); `throughput` serves the pool at each concurrency (`perf.throughput`);
`sweep` is `latency` over CAST budgets with the paper's Table 2 (`perf.sweep`). Every
greedy output of a lossless method is checked against AR's, token for token. Each writes
OUT.json (the report, with the command that reproduces it and the machine) and OUT.md (a
page) with plots beside them. `--dataset` takes named sets or `prepare-dataset` JSONL.
"""

from __future__ import annotations

import shlex
import sys

import click

from perf.bench_backends import backends
from perf.bench_tree import tree
from perf.datasets import DatasetError, load_dataset
from perf.harness import MethodSpec, parse_methods
from perf.peers import PEERS, PeerUnavailable
from perf.run import (bench_mode, command_line, domain_label, domains, finish, ints, option_words, run_domain,
                      split_options, write_outputs)
from perf.session import load_session

PEER_HELP = "Peers run greedy at B = 1: hf (transformers generate, fp32), dflash (z-lab reference chain)."


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def bench() -> None:
    """trtllm-bench-style runs: latency (B = 1), throughput (concurrency sweep), sweep (CAST widths)."""


def check_peers(session, specs: list[MethodSpec], prompt: list[int]) -> tuple[list[MethodSpec], dict[str, str]]:
    """Drop the peers that cannot run here -> (specs that run, {peer: why not})."""
    gaps = {}
    for spec in [s for s in specs if s.method in PEERS]:
        try:
            session.peer(spec.method, prompt, 2)
        except PeerUnavailable as err:
            gaps[spec.method] = str(err)
            click.echo(f"[perf.bench] peer {spec.method} does not run here: {err}", err=True)
    return [s for s in specs if s.method not in gaps], gaps


def run_latency(ctx: click.Context, specs: list[MethodSpec], kwargs: dict, relaxed: str | None = None,
                round_parts: bool = False, peer_threads: int = 1, budgets: list[int] | None = None) -> None:
    """`latency` and `sweep` (its `budgets`: Table 2 per domain): one domain after another, every
    method interleaved per prompt; the report and page are rewritten as each domain ends."""
    from perf.page import latency_page
    from perf.sweep import sweep_table

    params, engine = split_options(kwargs)
    session = None
    try:
        rule = None
        if relaxed is not None:
            from perf.relaxed_eval import parse_relaxed

            rule = parse_relaxed(relaxed)
            if params["temperature"] <= 0:
                raise ValueError("--relaxed rules are sampling rules: pass --temperature > 0")
            specs += [MethodSpec(s.method, s.budget, rule) for s in specs if s.method in ("chain", "cast")]
        session = load_session(engine, params, relaxed=rule is not None)
        session.peer_threads = peer_threads
        if round_parts:
            session.time_round_parts()
        specs, gaps = check_peers(session, specs, session.encode("Hello"))
        peers = {} if session.peers is None else session.peers.describe()
        report = {"mode": ctx.info_name, "command": command_line(ctx), "peer_gaps": gaps, "domains": {},
                  "peers": {s.method: peers[s.method] for s in specs if s.method in PEERS}}
        settings = {"mode": ctx.info_name} | ({} if budgets is None else {"budgets": budgets})
        for name in domains(params["dataset"]):
            rep, run = run_domain(session, name, specs, params, settings)
            if rule is not None:
                from perf.relaxed_eval import relaxed_blocks

                rep["relaxed"] = relaxed_blocks(specs, rep, run)
            rep["accept_lengths"] = {s.label: [R for r in run.runs[s.label] for R in r.result.accept_lengths]
                                     for s in specs if s.method != "ar"}
            report["domains"][domain_label(name)] = rep
            if budgets is not None:
                report.setdefault("sweep", {})[domain_label(name)] = sweep_table(rep["summary"], budgets)
            write_outputs(params["out"], report, latency_page(report, params["out"]))  # each domain kept as it ends
    except (ValueError, DatasetError) as err:
        raise click.ClickException(str(err)) from None
    finally:
        if session is not None and session.peers is not None:
            session.peers.close()
    finish(report, latency_page(report, params["out"]), params)


@bench.command()
@click.option("--methods", default="ar,chain,cast:auto,dflash,hf", show_default=True,
              help="Comma list of ar, chain, cast[:N|auto|auto-ungated], and peers hf, dflash. " + PEER_HELP)
@click.option("--relaxed", default=None, metavar="NAME:ALPHA",
              help="LOSSY: also run every speculative method under this relaxed rule (needs --temperature > 0).")
@click.option("--round-parts", is_flag=True,
              help="Also time the parts of the engine's decode rounds in place (feature cache, draft, trees, "
                   "verify, commit), ms per round per method.")
@click.option("--peer-threads", type=click.IntRange(1), default=1, show_default=True,
              help="torch threads of the peers' process. 1: on a shared 2-core CPU torch at 2 threads ran them "
                   "4-15x slower under others' load (perf/peers.py).")
@bench_mode
def latency(ctx: click.Context, methods: str, relaxed: str | None, round_parts: bool, peer_threads: int,
            **kwargs) -> None:
    """Decode ms/token, speedup over AR, R, TTFT and time split per method, one request at a time."""
    try:
        specs = parse_methods(methods)
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    if any(s.method == "best-first" for s in specs):
        raise click.ClickException("--methods: best-first:W shares a budget over a batch: run it in throughput mode")
    run_latency(ctx, specs, kwargs, relaxed, round_parts, peer_threads)


@bench.command()
@click.option("--budgets", default="1,3,7,15,31,63", show_default=True, help="Comma list of CAST budgets N.")
@click.option("--no-auto", is_flag=True, help="Skip cast:auto and cast:auto-ungated (no width profile needed).")
@click.option("--no-ar", is_flag=True, help="Skip the autoregressive reference row.")
@click.option("--no-ungated", is_flag=True, help="Skip cast:auto-ungated (the width policy without the draft gate).")
@bench_mode
def sweep(ctx: click.Context, budgets: str, no_auto: bool, no_ar: bool, no_ungated: bool, **kwargs) -> None:
    """Width sweep (paper Table 2): `latency` over AR, chain and CAST at each budget N, sweep oracle vs
    predicted auto width, and the ceiling the verify pass leaves (`perf.sweep`)."""
    try:
        ns = sorted(set(ints(budgets, "--budgets")))
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    specs = ([] if no_ar else [MethodSpec("ar")]) + [MethodSpec("chain")] + [MethodSpec("cast", n) for n in ns]
    specs += [] if no_auto else [MethodSpec("cast", draft_gate=True)] + ([] if no_ungated else [MethodSpec("cast")])
    run_latency(ctx, specs, kwargs, budgets=ns)


@bench.command()
@click.option("--methods", default="ar,chain,cast:3,cast:15,cast:auto", show_default=True,
              help="Comma list of ar, chain, cast[:N|auto|auto-ungated], best-first:W (App. F: W x B nodes shared "
                   "by best-first mass; in process only). ar first: ratios are to it.")
@click.option("--concurrency", default="1,4,16,32", show_default=True, help="Comma list of live-request limits.")
@click.option("--via", type=click.Choice(["engine", "openai"]), default="engine", show_default=True,
              help="engine: in process; openai: start `cast-trtllm serve --api openai` with the engine flags and "
                   "drive it with the openai client (TTFT, ITL, latency percentiles, lost requests).")
@click.option("--repeats", type=click.IntRange(min=1), default=1, show_default=True,
              help="Runs per (concurrency, method) cell, method order rotated each time; the median run "
                   "(the slower middle one of an even count) is reported.")
@click.option("--report-json", "--report_json", "report_json", type=click.Path(dir_okay=False), default=None,
              help="Also write trtllm-bench's report JSON (performance, streaming_metrics, decoding_stats; "
                   "perf/trtllm_report.py): its top level is the last method at the highest concurrency, `runs` "
                   "holds every cell. --via engine only.")
@bench_mode
def throughput(ctx: click.Context, methods: str, concurrency: str, via: str, repeats: int, report_json: str | None,
               **kwargs) -> None:
    """Tokens/s of each method at each concurrency (continuous batching), greedy, EOS ignored."""
    from perf import throughput as tp
    from perf.page import throughput_page
    from perf.report import machine_info

    params, engine = split_options(kwargs)
    server = None
    try:
        levels = ints(concurrency, "--concurrency")
        specs = parse_methods(methods)
        if specs[0].label != "ar" or any(s.method in PEERS for s in specs):
            raise ValueError("--methods: list ar first (every ratio is to it); peers run in latency mode only")
        if params["temperature"] or params["stop_at_eos"]:
            raise ValueError("throughput runs greedy with EOS ignored: drop --temperature / --stop-at-eos")
        if report_json and via != "engine":
            raise ValueError("--report_json reads each request's rounds in process: run it with --via engine")
        pools = {domain_label(name): load_dataset(name, params["num_prompts"], params["max_new_tokens"],
                                                  params["data_dir"], params["skip_prompts"])
                 for name in domains(params["dataset"])}
        max_new = {d: rs[0].output_tokens for d, rs in pools.items()}  # --max-new-tokens, else the first row's
        if via == "openai":
            for spec in specs:  # a method the server cannot run is refused before it starts
                tp.cast_options(spec)
            flags = option_words(ctx, engine)
            server, client = tp.start_server(flags, max(levels), 4 * max(map(len, pools.values())),
                                             max(max_new.values()))
            described = {"api": "openai", "server": "cast-trtllm serve --api openai " + shlex.join(flags)}
            cells = {d: tp.run_openai(client, [r.prompt or r.input_ids for r in rs], max_new[d], specs, levels,
                                      not params["no_chat"], not params["no_progress"], repeats)
                     for d, rs in pools.items()}
        else:
            session = load_session(engine, params)
            described, cells = session.engine, {}
            for d, rs in pools.items():
                prompts = [list(r.input_ids) if r.input_ids is not None else session.encode(r.prompt) for r in rs]
                cells[d] = tp.run(session.built.engine, prompts, max_new[d], specs, levels, not params["no_progress"],
                                  repeats)
    except (ValueError, DatasetError) as err:
        raise click.ClickException(str(err)) from None
    finally:
        if server is not None:
            server.terminate()
            server.wait(60)
    if via == "engine":
        trtllm_report(report_json, cells, described, session.built.engine)
    report = {"mode": "throughput", "via": via, "command": command_line(ctx), "machine": machine_info(),
              "engine": described, "methods": [s.label for s in specs], "concurrency": levels,
              "settings": {k: v for k, v in params.items() if k not in ("as_json", "no_progress")},
              "domains": cells}
    finish(report, throughput_page(report, params["out"]), params)


def trtllm_report(path: str | None, cells: dict[str, list[dict]], engine: dict, live_engine) -> None:
    """trtllm-bench's report of every (domain, concurrency, method) cell into `path` (None: none written);
    the rows keep their tables (the per-request records leave them here either way)."""
    import json

    from perf.throughput import RECORDS
    from perf.trtllm_report import bench_report

    drafter = live_engine.drafter
    positions = None if drafter is None else live_engine.spec.draft_positions(drafter.num_draft_positions)
    described = {**engine, "max_num_tokens": live_engine.max_num_tokens}
    runs = [bench_report(row.pop(RECORDS), described, row["concurrency"], row["method"], positions, domain)
            for domain, rows in cells.items() for row in rows]
    if path is None:
        return
    top = max(runs, key=lambda r: (r["world_info"]["max_batch_size"], 0))  # the highest concurrency, last method
    top = [r for r in runs if r["world_info"]["max_batch_size"] == top["world_info"]["max_batch_size"]][-1]
    with open(path, "w") as f:
        json.dump({**top, "runs": runs}, f, indent=2)


for command in (tree, backends):
    bench.add_command(command)

if __name__ == "__main__":
    sys.exit(bench())
