"""`train-drafter data` and `heldout`: the target's greedy continuations (+ taps) as shards."""

from __future__ import annotations

import json
from pathlib import Path

import click
import torch

from drafter_builder import prompts as P
from drafter_builder import shards as S
from drafter_builder.cli import common
from drafter_builder.cli.common import DATA, HELDOUT_SETS, LAYER_IDS, MAX_NEW_TOKENS, SEED, THREADS, WORK
from drafter_builder.recipe import pool_counts, shipped_prompts
from perf.datasets import MBPP_TRAINING_IDS, NAMED_SETS
from runtime.loader import encode_prompt

_MBPP_IDS = f"{MBPP_TRAINING_IDS.start}-{MBPP_TRAINING_IDS.stop - 1}"


@click.command("data")
@WORK
@DATA
@SEED
@THREADS
@click.option("--gsm8k", type=int, default=1500, show_default=True, help="GSM8K train prompts (MIT).")
@click.option("--gsm8k-stub", type=int, default=0, show_default=True,
              help="GSM8K train questions as HumanEval-style stubs `def solution() -> int` (answered in bare code).")
@click.option("--mbpp", type=int, default=464, show_default=True, help=f"MBPP task_id {_MBPP_IDS} prompts (CC-BY-4.0).")
@click.option("--mbpp-stub", type=int, default=0, show_default=True,
              help="The same MBPP tasks as HumanEval-style function stubs (signature + docstring).")
@click.option("--mbpp-doctest", type=int, default=0, show_default=True,
              help="The same MBPP tasks as stubs with the solution's imports and every test as a doctest.")
@click.option("--stdlib-function", type=int, default=0, show_default=True,
              help="Stubs (signature + docstring) of documented public functions of the Python standard library "
                   "(PSF-2.0): varied real signatures.")
@click.option("--stdlib-method", type=int, default=0, show_default=True,
              help="The same for public methods, each stub inside its `class` line.")
@click.option("--self-chat", type=int, default=600, show_default=True, help="User prompts the target writes itself.")
@click.option("--self-chat-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Reuse these target-written prompts (JSON list) instead of sampling new ones.")
@click.option("--alpaca", type=int, default=0, show_default=True, help="Alpaca prompts (CC BY-NC: head becomes research-only).")
@click.option("--code-alpaca", type=int, default=0, show_default=True, help="CodeAlpaca prompts (CC BY-NC: research-only).")
@click.option("--batch-size", type=int, default=32, show_default=True, help="Generation batch size.")
@MAX_NEW_TOKENS
@click.option("--gen-minutes", type=float, default=27.0, show_default=True, help="Time box of the greedy generation.")
@click.option("--name", default=None, help="Data run folder under --work/train (default seed<SEED>); "
              "another name adds a separate run beside it.")
@click.option("--skip-seen/--keep-seen", default=True, show_default=True,
              help="Drop prompts another data run under --work/train already answered.")
@click.option("--skip-shipped/--keep-shipped", default=False, show_default=True,
              help="Drop every prompt the shipped head's recorded data runs asked for (a run `recipe` holds: "
                   "the runs before it): new data for a head continued with `train --init-from` on a machine "
                   "without their shards.")
@common.DEVICE
@click.option("--dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True,
              help="Decoding precision: fp32 is the exact target; bf16 is 1.7-1.8x faster on an AMX Xeon and "
                   "agrees on 98-99% of tokens (python -m drafter_builder.data_dtype).")
def data(work: Path, data_dir: Path, seed: int, threads: int, self_chat: int, self_chat_file: Path | None,
         batch_size: int, max_new_tokens: int, gen_minutes: float, name: str | None, skip_seen: bool,
         skip_shipped: bool, dtype: str, device: str, **pools: int) -> None:
    """Target greedy continuations (+ taps) of the training prompt pools."""
    hf, tok, _, _ = common.load_target(threads, seed)
    hf = hf.to(device=device, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
    written: list[str] = []
    if self_chat_file is not None:
        written = json.loads(self_chat_file.read_text())[:self_chat]
        if len(written) < self_chat:
            raise click.ClickException(f"{self_chat_file} holds {len(written)} prompts; --self-chat asks for {self_chat}")
    elif self_chat > 0:
        cache = work / f"self_prompts_seed{seed}.json"
        if not cache.is_file() or len(json.loads(cache.read_text())) < self_chat:
            work.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(P.sample_self_prompts(hf, tok, self_chat, seed, batch_size), indent=1))
        written = json.loads(cache.read_text())[:self_chat]
    counts = pool_counts({**pools, "self_chat": len(written)})  # pools: the other pool options (--gsm8k, ...)
    prompts = P.load_prompts(data_dir, counts, seed, written)
    evaluation = [p for name in NAMED_SETS for _, p in common.heldout_prompts(data_dir, name, None)]
    kept = set(P.drop_contaminated([p for _, p in prompts], evaluation))
    click.echo(f"{len(prompts) - len(kept)} of {len(prompts)} prompts dropped: they share a 13-gram with an evaluation set")
    prompts = [(name, p) for name, p in prompts if p in kept]
    run_dir = work / "train" / (name or f"seed{seed}")
    if skip_shipped:
        shipped = shipped_prompts(data_dir, before_run=run_dir.name)
        fresh = [(n, p) for n, p in prompts if p not in shipped]
        click.echo(f"{len(prompts) - len(fresh)} of {len(prompts)} prompts dropped: "
                   "the shipped head's data runs asked for them")
        prompts = fresh
    if skip_seen:
        seen = S.answered_prompts(work / "train", skip=run_dir)
        fresh = [(n, p) for n, p in prompts if tuple(encode_prompt(tok, p, chat=True)) not in seen]
        click.echo(f"{len(prompts) - len(fresh)} of {len(prompts)} prompts dropped: another data run answered them")
        prompts = fresh
    meta = S.build_dataset(hf, tok, prompts, LAYER_IDS, run_dir, batch_size, max_new_tokens, gen_minutes * 60)
    click.echo(json.dumps(meta, indent=2))


@click.command("heldout")
@WORK
@DATA
@THREADS
@click.option("--count", type=int, default=40, show_default=True, help="Prompts per evaluation set.")
@MAX_NEW_TOKENS
def heldout(work: Path, data_dir: Path, threads: int, count: int, max_new_tokens: int) -> None:
    """Target greedy continuations of the first prompts of GSM8K test, HumanEval, MT-Bench."""
    hf, tok, _, _ = common.load_target(threads)
    for name in HELDOUT_SETS:
        meta = S.build_dataset(hf, tok, common.heldout_prompts(data_dir, name, count), LAYER_IDS,
                               work / "heldout" / name, 32, max_new_tokens, float("inf"))
        click.echo(f"{name}: {meta['sequences']} sequences, {meta['response_tokens']} tokens")
