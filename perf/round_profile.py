"""Where a round's time goes: the engine's own step, its parts timed in place.

Wraps the engine's draft call, feature-cache update, tree choice, verify pass and commit
with wall-clock timers and runs requests of a named set through `LLMEngine.step`, the
loop every command and server runs. Prints ms per round of each part, the round, and
ms per token (prefill excluded, the first rounds of a warm-up request too).

    python -m perf.round_profile --budget 3 --domain gsm8k --num-prompts 3
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import Any

import click

PARTS = {"append_context": "feature cache", "draft": "draft", "trees": "trees (host)", "verify": "verify",
         "commit": "commit (host)"}


def profile_rounds(engine: Any, prompts: list[list[int]], max_new_tokens: int, budget: int | str | None = None
                   ) -> dict[str, Any]:
    """Run each prompt alone through `engine.step` (budget None: the engine's default);
    ms per round of each part, of the round and per token."""
    from runtime.engine.sequence import Request

    spent: dict[str, float] = defaultdict(float)  # every call
    decode: dict[str, float] = defaultdict(float)  # the decode rounds' calls
    timed = {"append_context": (engine.drafter, "append_context"), "trees": (engine, "_trees"),
             "verify": (engine.target, "verify_trees"), "commit": (engine, "_commit"),
             "draft": (engine, "_draft")}
    originals = {key: getattr(obj, name) for key, (obj, name) in timed.items() if obj is not None}

    def timer(key, fn):
        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[key] += time.perf_counter() - start
        return call

    for key, fn in originals.items():
        obj, name = timed[key]
        setattr(obj, name, timer(key, fn))
    rounds = tokens = 0
    wall = 0.0
    try:
        for ids in prompts:
            seq = engine.add_request(Request(prompt_ids=ids, max_new_tokens=max_new_tokens, budget=budget))
            while seq.prefilling:  # the prompt's own rounds (its chunks) are not decode rounds
                engine.step()
            prefill = dict(spent)
            start = time.perf_counter()
            while engine.active:
                engine.step()
                rounds += 1
            wall += time.perf_counter() - start
            for key in list(spent):
                decode[key] += spent[key] - prefill.get(key, 0.0)
            tokens += len(seq.tokens) - 1  # the first token came with the prefill
    finally:
        for key in originals:
            obj, name = timed[key]
            if name in vars(obj):  # our wrapper; the class's method shows through again
                delattr(obj, name)
    if rounds == 0:
        raise click.UsageError("no round ran: every prompt finished at its first token")
    per_round = {PARTS[k]: 1e3 * decode[k] / rounds for k in PARTS if k in decode}
    return {"rounds": rounds, "tokens": tokens, "ms_per_round": 1e3 * wall / rounds,
            "ms_per_token": 1e3 * wall / max(tokens, 1), "parts_ms_per_round": per_round}


@click.command()
@click.option("--budget", default="auto", show_default=True, help="Tree budget N or 'auto'.")
@click.option("--method", default="cast", show_default=True, type=click.Choice(["cast", "chain", "ar"]))
@click.option("--domain", default="gsm8k", show_default=True, help="Named prompt set (perf.datasets).")
@click.option("--num-prompts", type=int, default=3, show_default=True)
@click.option("--max-new-tokens", type=int, default=96, show_default=True)
def main(budget: str, method: str, domain: str, num_prompts: int, max_new_tokens: int) -> None:
    """Profile the default engine's rounds on `num-prompts` prompts of `domain`."""
    from cast_trtllm.spec_config import SpecConfig, check_budget
    from perf.datasets import named_requests
    from runtime.engine.build import build_engine
    from runtime.engine.sequence import Request

    built = build_engine(spec=SpecConfig(method=method, budget=check_budget(budget)))
    requests = named_requests(domain, num_prompts + 1)
    prompts = [built.encode(r.prompt) for r in requests]
    built.engine.generate([Request(prompt_ids=prompts[0], max_new_tokens=16)])  # warm-up: graphs loaded
    report = profile_rounds(built.engine, prompts[1:], max_new_tokens)
    report.update(method=method, budget=budget, domain=domain, engine=built.describe())
    click.echo(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
