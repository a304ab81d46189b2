"""Is `auto` right on a machine it has never seen? cast:auto beside fixed N, from a cold start.

For each scenario the cost cache starts EMPTY (a fresh `$CAST_CACHE_DIR`: no learned
table, no execution choice) and the engine runs the prompts in order, every method
interleaved per prompt on the same engine: cast:auto and CAST at fixed N. ms/token is
taken from the rounds after the engine's first `--warm-rounds` rounds of auto (its
learning period), and compared with the best fixed N of the same run.
Scenarios: `--threads` other than the one profiles were shipped at, and a width profile
of another configuration forced in as the prior (`--profile`).

    python -m perf.portability --scenario threads=1 --scenario threads=2,profile=cast_trtllm/profiles/measured/cpu-smollm2-135m-fp32.json
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import click

BUDGETS = (1, 3, 7, 15, 31)


def after(result: Any, skip: int) -> tuple[float, int]:
    """(ms, tokens) of the rounds after the first `skip` of a result."""
    return sum(result.round_ms[skip:]), sum(result.accept_lengths[skip:])


def scenario(spec_text: str, prompts: list[list[int]] | None, dataset: str, num_prompts: int, max_new: int,
             warm_rounds: int) -> dict[str, Any]:
    from cast_trtllm.spec_config import SpecConfig
    from perf.datasets import load_dataset
    from runtime.engine import Request
    from runtime.engine.build import build_engine

    opts = dict(kv.split("=", 1) for kv in spec_text.split(",") if kv)
    os.environ["CAST_CACHE_DIR"] = tempfile.mkdtemp(prefix="cast-cold-")
    built = build_engine("embedded", "default", SpecConfig(width_profile=opts.get("profile")), "cpu", None,
                         int(opts["threads"]) if "threads" in opts else None)
    engine = built.engine
    requests = load_dataset(dataset, num_prompts, max_new)
    ids = [built.encode(r.prompt) for r in requests]
    methods = ["auto"] + [str(n) for n in BUDGETS]
    totals = {m: [0.0, 0] for m in methods}
    auto_rounds = 0
    for i, prompt in enumerate(ids):
        for m in methods[i % len(methods):] + methods[:i % len(methods)]:
            out = engine.generate([Request(prompt, max_new, budget="auto" if m == "auto" else int(m),
                                           ignore_eos=True)])[0]
            skip = max(0, warm_rounds - auto_rounds) if m == "auto" else 0
            if m == "auto":
                auto_rounds += out.num_rounds
            ms, tokens = after(out, skip)
            totals[m][0] += ms
            totals[m][1] += tokens
    per_token = {m: ms / tokens for m, (ms, tokens) in totals.items() if tokens}
    best = min((m for m in per_token if m != "auto"), key=per_token.get)
    return {"scenario": spec_text, "execution": built.execution, "width": built.width_profile,
            "ms_per_token": per_token, "best_fixed_N": int(best),
            "auto_over_best_fixed": per_token["auto"] / per_token[best], "warm_rounds": warm_rounds}


@click.command()
@click.option("--scenario", "scenarios", multiple=True, default=("threads=1",), show_default=True,
              help="threads=T[,profile=PATH] (repeatable)")
@click.option("--dataset", default="gsm8k", show_default=True)
@click.option("--num-prompts", type=int, default=6, show_default=True)
@click.option("--max-new-tokens", type=int, default=96, show_default=True)
@click.option("--warm-rounds", type=int, default=16, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), default="perf/results/portability_cpu.json", show_default=True)
def main(scenarios, dataset, num_prompts, max_new_tokens, warm_rounds, out) -> None:
    """cast:auto vs the best fixed N after the first rounds, from an empty cache."""
    from perf.report import machine_info

    rows = [scenario(s, None, dataset, num_prompts, max_new_tokens, warm_rounds) for s in scenarios]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({"rows": rows, "machine": machine_info(), "dataset": dataset,
                                     "num_prompts": num_prompts, "max_new_tokens": max_new_tokens}, indent=2) + "\n")
    for r in rows:
        pt = " ".join(f"{k}={v:.1f}" for k, v in r["ms_per_token"].items())
        click.echo(f"{r['scenario']}: auto / best fixed N={r['best_fixed_N']}: {r['auto_over_best_fixed']:.3f} ({pt} ms/token)")
    click.echo(f"wrote {out}")


if __name__ == "__main__":
    main()
