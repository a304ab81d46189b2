"""What every benchmark mode shares: the options, one domain's interleaved run, the exact
command that reproduces a result, and writing the report JSON + page."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any, Sequence

import click

from cast_trtllm.sampling import SamplingParams
from perf.datasets import NAMED_SETS, load_dataset
from perf.harness import MethodSpec, run_bench
from perf.report import build_report
from runtime.options import model_options, option_group, spec_options

_OPTIONS = [
    click.option("--dataset", required=True,
                 help=f"Comma list of trtllm-bench JSONL files or named sets {sorted(NAMED_SETS)} (one domain each)."),
    click.option("--num-prompts", type=click.IntRange(1), default=None, help="First N prompts of each domain."),
    click.option("--skip-prompts", type=click.IntRange(min=0), default=0, show_default=True,
                 help="Drop the first K of those prompts (--num-prompts 20 --skip-prompts 14 runs 14..19)."),
    click.option("--max-new-tokens", type=click.IntRange(1), default=None,
                 help="Token budget of every request (default: each row's output_tokens)."),
    click.option("--data-dir", type=click.Path(file_okay=False), default=None,
                 help="Evaluation data directory (default: ../shared/data next to the repo)."),
    click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy."),
    click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed (request i uses seed + i)."),
    click.option("--stop-at-eos", is_flag=True,
                 help="Stop a request at EOS (default: ignore EOS, so every method commits the same tokens)."),
    click.option("--no-chat", is_flag=True, help="Feed prompts raw instead of as one chat-template user turn."),
    click.option("--no-progress", is_flag=True, help="Hide the progress bar."),
    click.option("--out", type=click.Path(dir_okay=False), default=None,
                 help="Write OUT.json (report) and OUT.md (page) with OUT*.png plots beside them."),
    click.option("--json", "as_json", is_flag=True, help="Print the JSON report on stdout instead of the tables."),
]


run_options = option_group(_OPTIONS)


def bench_mode(fn):
    """What every mode takes: the run options above, the engine's (`runtime.options` model and
    speculative options), and its click context (`command_line` reads it)."""
    return run_options(model_options(spec_options(click.pass_context(fn))))


def domains(text: str) -> list[str]:
    return [d.strip() for d in text.split(",") if d.strip()]


def domain_label(dataset: str) -> str:
    """A named set as is; a JSONL file by its stem (the report's and page's domain key)."""
    return Path(dataset).stem if dataset.endswith(".jsonl") else dataset


def ints(text: str, flag: str) -> list[int]:
    """A comma list of positive integers, or a ValueError naming `flag`."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ValueError(f"{flag} {text!r}: expected positive integers")
    return values


def run_domain(session: Any, dataset: str, specs: Sequence[MethodSpec], params: dict[str, Any],
               settings: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """One domain, every method interleaved per prompt -> (trtllm-bench-shaped report, BenchRun)."""
    requests = load_dataset(dataset, params["num_prompts"], params["max_new_tokens"], params["data_dir"],
                            params["skip_prompts"])
    bench = run_bench(requests, specs, session, session.encode,
                      SamplingParams(params["temperature"], seed=params["seed"]), progress=not params["no_progress"],
                      after_warmup=session.round_parts_ms)  # the warm-up's rounds are not tallied
    report = build_report(bench, dataset, [r.output_tokens for r in requests], session.engine,
                          {**settings, "temperature": params["temperature"], "seed": params["seed"],
                           "methods": [s.label for s in specs], "num_prompts": len(requests),
                           "skip_prompts": params["skip_prompts"], "max_new_tokens": params["max_new_tokens"]})
    if session.round_parts is not None:
        report["round_parts_ms"] = session.round_parts_ms()
    return report, bench


def option_words(ctx: click.Context, names: Sequence[str] | None = None) -> list[str]:
    """The options of `ctx` not left at default (only `names`, when given), as command-line words."""
    words = []
    for param in ctx.command.params:
        if (names is not None and param.name not in names
                or ctx.get_parameter_source(param.name) is click.core.ParameterSource.DEFAULT):
            continue
        value = ctx.params[param.name]
        if getattr(param, "is_flag", False):
            words += (param.opts if value else param.secondary_opts)[:1]
        elif value is not None:
            words += [param.opts[0], str(value)]
    return words


def command_line(ctx: click.Context) -> str:
    """The exact command that reproduces this run: `python -m perf.bench MODE` + every option not left at default."""
    return shlex.join(["python", "-m", "perf.bench", ctx.info_name, *option_words(ctx)])


def write_outputs(out: str | None, report: dict[str, Any], page: str) -> list[Path]:
    """OUT.json and OUT.md (the plots were written next to them by the caller)."""
    if not out:
        return []
    stem = Path(out).with_suffix("")
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".json"), stem.with_suffix(".md")]
    paths[0].write_text(json.dumps(report, indent=2) + "\n")
    paths[1].write_text(page)
    return paths


RUN_KEYS = {p.name for p in run_options(lambda: None).__click_params__}  # the names of `_OPTIONS`


def split_options(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """click kwargs -> (run options, engine options for `runtime.options.engine_options`)."""
    return ({k: v for k, v in kwargs.items() if k in RUN_KEYS},
            {k: v for k, v in kwargs.items() if k not in RUN_KEYS})


def finish(report: dict, page: str, params: dict) -> None:
    """Write OUT.json + OUT.md, print the page (or the JSON), and name any lossless method that differs from AR."""
    paths = write_outputs(params["out"], report, page)
    click.echo(json.dumps(report, indent=2) if params["as_json"] else page)
    if paths:
        click.echo(f"wrote {', '.join(map(str, paths))}", err=params["as_json"])
    differs = [f"{d}: {r['method']}" for d, rep in report["domains"].items()
               for r in (rep["summary"] if isinstance(rep, dict) else rep)
               if r.get("lossless", True) and r.get("equal_to_ar") is not None
               and r["equal_to_ar"] != r["requests"]]
    if differs:
        click.echo(f"[perf.bench] lossless methods whose greedy output differs from AR: {', '.join(differs)}",
                   err=True)
