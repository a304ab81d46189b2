"""What an auto request that does not draft pays over `ar` (issue 40), under server-like arrivals.

    PYTHONPATH=<code root> python perf/gate_overhead.py [--levels 1,8,16] [--max-new-tokens 32]

The shipped head with its draft-vocabulary labels permuted (a real drafter never accepted):
every drafted round of `cast:auto` is pure cost. At each concurrency c, 2c synthetic
requests (4 at c = 1) run with at most c live, one joining as one finishes; `ar` and
`cast:auto` interleaved, order rotated, `--repeats` each. Prints per method the fewest wall
and process-CPU seconds, the share of rounds that drafted, and the host ms per round spent
in the engine's gate and bookkeeping (`_drafts` + `account`). Run against two checkouts
(PYTHONPATH) for a before / after.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import defaultdict

import torch

from perf.round_compare import Timed
from perf.throughput import serve
from runtime.engine import Request
from runtime.engine.build import build_engine

WORDS = "time year people way day man thing woman life child world school state family student group".split()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1,8,16")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    built = build_engine(say=lambda m: None)
    engine = built.engine
    ids = engine.drafter.draft_ids
    engine.drafter.draft_ids = ids[torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(0))]
    host = Timed()  # `_drafts` + `account`: the engine's gate and bookkeeping
    host.install()
    rng = random.Random(0)
    options = {"ar": {"method": "ar"}, "cast:auto": {"method": "cast", "budget": "auto", "draft_gate": True}}
    results = []
    for c in (int(x) for x in args.levels.split(",")):
        prompts = [built.encode(" ".join(rng.choice(WORDS) for _ in range(60))) for _ in range(max(4, 2 * c))]
        runs = defaultdict(list)
        for label in options:  # warm-up
            serve(engine, [Request(tuple(p), 8, ignore_eos=True, **options[label]) for p in prompts[:2]], 2)
        for r in range(args.repeats):
            for label in (list(options) if r % 2 == 0 else list(options)[::-1]):
                reqs = [Request(tuple(p), args.max_new_tokens, ignore_eos=True, **options[label]) for p in prompts]
                host.host_ms, cpu = 0.0, time.process_time()
                wall, _, seqs, rounds, _ = serve(engine, reqs, c)
                drafted = [d for s in seqs for d in s.drafted]
                runs[label].append({"wall_s": wall, "cpu_s": time.process_time() - cpu, "rounds": rounds,
                                    "drafted_share": sum(drafted) / len(drafted), "host_ms_per_round": host.host_ms / rounds,
                                    "tokens": [s.tokens for s in seqs]})
        row = {"concurrency": c, "requests": len(prompts)}
        for label, rs in runs.items():
            row[label] = {"wall_s": min(x["wall_s"] for x in rs), "cpu_s": min(x["cpu_s"] for x in rs),
                          "drafted_share": max(x["drafted_share"] for x in rs),
                          "host_ms_per_round": min(x["host_ms_per_round"] for x in rs)}
        row["auto_over_ar_wall"] = row["cast:auto"]["wall_s"] / row["ar"]["wall_s"]
        row["auto_over_ar_cpu"] = row["cast:auto"]["cpu_s"] / row["ar"]["cpu_s"]
        row["equal_to_ar"] = sum(a == b for a, b in zip(runs["ar"][0]["tokens"], runs["cast:auto"][0]["tokens"]))
        results.append(row)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
