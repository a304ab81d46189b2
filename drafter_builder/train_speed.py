"""Side-by-side training throughput of the drafter-training levers (blocks per second).

Every configuration trains the same fresh 1-layer block-16 head for a few steps on the
same held-out records, in one process, interleaved (rounds of each config in turn), so
machine noise hits all of them alike. Reports blocks/s and the ratio to the baseline
(full vocabulary, fp32).

    python -m drafter_builder.train_speed --work /tmp/dflash_train --json perf/results/drafter_train_speed.json
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import click

from drafter_builder.cli import common
from drafter_builder.cli.common import MASK_TOKEN_ID, WORK


@click.command()
@WORK  # its heldout/gsm8k records are used
@click.option("--threads", type=int, default=1, show_default=True, help="torch CPU threads.")
@click.option("--steps", type=int, default=6, show_default=True, help="Timed steps per config per round.")
@click.option("--rounds", type=int, default=3, show_default=True, help="Interleaved rounds (median over rounds).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write JSON.")
def main(work: Path, threads: int, steps: int, rounds: int, json_path: Path | None) -> None:
    from drafter_builder import shards as S
    from drafter_builder import train as T
    from runtime.drafter import random_drafter
    from runtime.drafter import vocab as V

    _, _, frozen, tc = common.load_target(threads)
    layers = list(common.LAYER_IDS)
    folder = work / "heldout" / "gsm8k"
    recs = S.load_records(S.shard_paths(folder), S.stored_layer_ids(folder), layers, tc.hidden_size)
    responses = [r["ids"][r["prompt_len"] :] for r in recs]
    configs = {  # name -> (draft vocab size or None, bf16 autocast, anchors per sequence)
        "full-vocab fp32 a16": (None, False, 16),
        "full-vocab bf16 a16": (None, True, 16),
        "vocab8192 fp32 a16": (8192, False, 16),
        "vocab8192 bf16 a16": (8192, True, 16),
        "vocab8192 bf16 a32": (8192, True, 32),
        "vocab4096 bf16 a32": (4096, True, 32),
    }
    times: dict[str, list[float]] = {k: [] for k in configs}
    for _ in range(rounds):
        for name, (size, bf16, anchors) in configs.items():
            ids = None if size is None else V.frequent_ids(responses, tc.vocab_size, size)
            drafter = random_drafter(tc, block_size=16, target_layer_ids=layers, mask_token_id=MASK_TOKEN_ID,
                                     intermediate_size=1024, draft_vocab_ids=ids)
            cfg = T.TrainConfig(budget_s=1e9, anchors_per_seq=anchors, seqs_per_step=2, max_steps=1 + steps,
                                autocast_bf16=bf16, warmup_steps=1)
            state = T.train(drafter, frozen, itertools.cycle(recs), cfg)
            t = state.log[-1]["seconds"] - state.log[0]["seconds"]  # excludes the first (warm-up) step
            times[name].append(steps * 2 * anchors / max(t, 1e-6))
    base = sorted(times["full-vocab fp32 a16"])[rounds // 2]
    rows = {k: {"blocks_per_s": round(sorted(v)[rounds // 2], 1), "vs_baseline": round(sorted(v)[rounds // 2] / base, 2)}
            for k, v in times.items()}
    click.echo(f"{'config':<22}{'blocks/s':>10}{'ratio':>8}")
    for k, r in rows.items():
        click.echo(f"{k:<22}{r['blocks_per_s']:>10.1f}{r['vs_baseline']:>8.2f}")
    if json_path is not None:
        json_path.write_text(json.dumps({"threads": threads, "steps": steps, "rounds": rounds, "block_size": 16,
                                         "layers": 1, "configs": rows, "date": time.strftime("%Y-%m-%d")}, indent=2) + "\n")


if __name__ == "__main__":
    main()
