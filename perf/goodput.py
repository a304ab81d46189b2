"""Goodput under load: chain vs fixed wide vs uniform vs best-first (paper §5, App. F).

    python -m perf.goodput --batch-sizes 1,4,8,16 --policies chain,fixed,uniform,best_first \
        --dataset gsm8k --num-requests 16 --max-new-tokens 32 --out perf/results/goodput_cpu.json

For each batch size B, every policy serves the SAME request pool through its own
`runtime.engine.LLMEngine` (the one engine the servers run) with B slots (continuous batching: a queued request
joins as soon as one leaves). The policies' rounds are interleaved (one round of each
policy in turn), so slow drift of a shared machine hits all alike.

Budgets per round: chain = the block chain (L nodes per request); fixed = N nodes per
request (48); uniform = W nodes per request; best_first = ONE shared budget of W·B'
nodes (B' = active requests) split by global best-first mass (Proposition 2), at most
`max_width` per request. uniform and best_first thus verify the same total nodes; only
the allocation differs.

goodput = committed tokens / wall seconds of the decode rounds (prefill on admission and
its first token excluded, paper App. D). R = committed round length (accepted + 1) per
request-round; packed = verify tokens (nodes + pending roots) of one batched round.
Greedy decoding is lossless: every policy's tokens must equal the chain's, token for token.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

import click
import numpy as np
from tqdm import tqdm

from cast_trtllm.spec_config import SpecConfig
from runtime.engine import LLMEngine, Request, Sequence as LiveRequest
from perf.goodput_report import format_goodput, plot_goodput
from runtime.engine.trees import MeanBudget

WARMUP_REQUESTS, WARMUP_TOKENS = 2, 4


@dataclass(slots=True)
class PoolRun:
    """One policy serving one request pool with `slots` concurrent requests."""

    decoder: LLMEngine
    queue: deque[Request]
    slots: int
    served: dict[str, LiveRequest] = field(default_factory=dict)
    decode_s: float = 0.0  # wall time of the rounds that decode (a joining prompt's chunk rides some of them)
    committed: int = 0  # tokens committed by decode rounds
    round_lengths: list[int] = field(default_factory=list)  # R per request-round
    packed: list[int] = field(default_factory=list)  # verify tokens per batched round

    @property
    def done(self) -> bool:
        return not self.queue and not self.decoder.active

    def round(self) -> int:
        """Admit queued requests into free slots, run one timed round; returns requests finished."""
        finished = 0
        while self.queue and len(self.decoder.active) < self.slots:
            seq = self.decoder.add_request(self.queue.popleft())
            self.served[seq.request.request_id] = seq
        batch = [s for s in self.decoder.active if not s.prefilling]  # decoding this round
        if not batch:  # prompts only (their chunks): not a decode round
            return finished + len(self.decoder.step())
        start = time.perf_counter()
        finished += len(self.decoder.step())
        self.decode_s += time.perf_counter() - start
        lengths = [s.accept_lengths[-1] for s in batch]
        self.round_lengths += lengths
        self.committed += sum(lengths)
        self.packed.append(sum(s.budgets[-1] + 1 for s in batch))
        return finished


POLICIES = ("chain", "fixed", "uniform", "best_first")


@dataclass(frozen=True, slots=True)
class LoadPolicy:
    """How a pool's requests get their trees: per-request method/budget of the one engine."""

    name: str
    shared_width: int = 8  # uniform: W nodes per request; best_first: W·B shared
    fixed_width: int = 48  # fixed: N per request
    max_width: int = 64  # best_first: cap on one request's share
    rank_cap: int = 8

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"batch policy must be one of {POLICIES}, got {self.name!r}")

    def engine(self, model: Any, drafter: Any, tokenizer: Any, eos: Sequence[int]) -> LLMEngine:
        spec = SpecConfig(rank_cap=self.rank_cap, max_request_width=self.max_width, draft_gate=False)
        return LLMEngine(model, drafter, tokenizer, eos, spec, lambda prefix: MeanBudget(self.shared_width))

    def request(self, index: int, prompt: Sequence[int], max_new_tokens: int) -> Request:
        method, budget = {"chain": ("chain", None), "fixed": ("cast", self.fixed_width),
                          "uniform": ("cast", self.shared_width), "best_first": ("cast", "auto")}[self.name]
        return Request(tuple(prompt), max_new_tokens, method=method, budget=budget, request_id=str(index))


def make_policy(name: str, shared_width: int, fixed_width: int, max_width: int, rank_cap: int) -> LoadPolicy:
    return LoadPolicy(name, shared_width, fixed_width, max_width, rank_cap)


def budget_note(policy: LoadPolicy, num_draft_positions: int) -> str:
    """The per-round verify budget of a policy, in words."""
    return {"chain": f"chain: {num_draft_positions} nodes/request",
            "fixed": f"{policy.fixed_width} nodes/request",
            "uniform": f"{policy.shared_width} nodes/request ({policy.shared_width}·B total)",
            "best_first": f"{policy.shared_width}·B shared, best-first, cap {policy.max_width}"}[policy.name]


def _requests(policy: LoadPolicy, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> list[Request]:
    return [policy.request(i, p, max_new_tokens) for i, p in enumerate(prompts)]


def measure_goodput(
    model: Any,  # runtime.model.llama.LlamaTarget
    drafter: Any,  # runtime.drafter.DrafterExecutor
    prompts: Sequence[Sequence[int]],
    batch_sizes: Sequence[int],
    policies: Sequence[LoadPolicy],
    max_new_tokens: int,
    tokenizer: Any = None,
    eos_token_ids: Sequence[int] = (),
    warmup: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Serve `prompts` at every B with every policy; cells, per-request tokens and the lossless check."""
    if not prompts or not batch_sizes or not policies:
        raise ValueError("measure_goodput needs prompts, batch sizes and policies")
    if "chain" not in [p.name for p in policies]:
        raise ValueError("the policies must include chain: it is the reference for ratios and losslessness")

    def decoder(policy: LoadPolicy) -> LLMEngine:
        return policy.engine(model, drafter, tokenizer, eos_token_ids)

    if warmup:  # first-call allocations and kernel choices, per policy, untimed
        for policy in policies:
            run = PoolRun(decoder(policy), deque(_requests(policy, prompts[:WARMUP_REQUESTS], WARMUP_TOKENS)), 2)
            while not run.done:
                run.round()
    cells, tokens = [], {}
    bar = tqdm(total=len(batch_sizes) * len(policies) * len(prompts), desc="goodput", unit="req", disable=not progress)
    for B in batch_sizes:
        runs = {p.name: PoolRun(decoder(p), deque(_requests(p, prompts, max_new_tokens)), B) for p in policies}
        bar.set_postfix_str(f"B={B}")
        while not all(r.done for r in runs.values()):
            for run in runs.values():  # one round of each policy in turn
                if not run.done:
                    bar.update(run.round())
        tokens[B] = {name: [run.served[str(i)].tokens for i in range(len(prompts))] for name, run in runs.items()}
        chain = runs["chain"]
        for policy in policies:
            run = runs[policy.name]
            goodput = run.committed / run.decode_s if run.decode_s else 0.0
            chain_goodput = chain.committed / chain.decode_s if chain.decode_s else 0.0
            cells.append({
                "batch_size": B, "policy": policy.name,
                "budget": budget_note(policy, drafter.num_draft_positions),
                "goodput_tok_s": goodput,
                "ratio_to_chain": goodput / chain_goodput if chain_goodput else None,
                "committed_tokens": run.committed, "decode_s": run.decode_s, "rounds": len(run.packed),
                "mean_R": float(np.mean(run.round_lengths)) if run.round_lengths else None,
                "mean_packed_per_round": float(np.mean(run.packed)) if run.packed else None,
                "mean_packed_per_request_round": (sum(run.packed) / len(run.round_lengths)
                                                  if run.round_lengths else None),
                "equal_to_chain": tokens[B][policy.name] == tokens[B]["chain"],
            })
    bar.close()
    mismatches = [f"B={c['batch_size']} {c['policy']}" for c in cells if not c["equal_to_chain"]]
    first = tokens[batch_sizes[0]]["chain"]
    return {
        "cells": cells,
        "lossless": {
            "all_policies_equal_chain": not mismatches,
            "mismatches": mismatches,
            "chain_equal_across_batch_sizes": all(tokens[B]["chain"] == first for B in batch_sizes),
        },
        "outputs": {str(B): t for B, t in tokens.items()},
    }


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1 or len(set(values)) != len(values):
        raise click.BadParameter(f"{text!r}: expected distinct positive integers, e.g. 1,4,8,16", param_hint=flag)
    return values


@click.command()
@click.option("--batch-sizes", default="1,4,8,16", show_default=True, help="Comma list of concurrent slots B.")
@click.option("--policies", default=",".join(POLICIES), show_default=True,
              help=f"Comma list of batch policies from {POLICIES}; chain is always included (the reference).")
@click.option("--dataset", default="gsm8k", show_default=True, help="Named prompt set or trtllm-bench JSONL file.")
@click.option("--num-requests", type=int, default=16, show_default=True, help="Requests in the pool (first N prompts).")
@click.option("--max-new-tokens", type=int, default=32, show_default=True, help="Token budget of every request.")
@click.option("--out", type=click.Path(dir_okay=False), default="perf/results/goodput_cpu.json", show_default=True,
              help="JSON report; the markdown table goes next to it with a .md suffix.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write goodput vs B per policy (PNG).")
@click.option("--threads", type=int, default=1, show_default=True, help="torch intra-op threads.")
@click.option("--shared-width", type=int, default=8, show_default=True,
              help="W: uniform verifies W nodes per request; best_first shares W·B nodes per round.")
@click.option("--fixed-width", type=int, default=48, show_default=True, help="N per request of the fixed policy.")
@click.option("--max-width", type=int, default=64, show_default=True,
              help="best_first: most nodes one request may take from the shared budget.")
@click.option("--rank-cap", type=int, default=8, show_default=True, help="K: tokens kept per drafted position.")
@click.option("--target", default="embedded", show_default=True, help="embedded | an HF model directory | a .gguf file.")
@click.option("--drafter", default="default", show_default=True, help="default | a DFlash checkpoint directory.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Evaluation data directory (default: ../shared/data next to the repo).")
@click.option("--ignore-eos", is_flag=True, help="Always generate the full token budget.")
@click.option("--no-chat", is_flag=True, help="Feed prompts raw instead of as one chat-template user turn.")
@click.option("--seed", type=int, default=0, show_default=True, help="torch seed (greedy decoding is deterministic).")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report on stdout instead of the table.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
def main(batch_sizes, policies, dataset, num_requests, max_new_tokens, out, plot, threads, shared_width, fixed_width,
         max_width, rank_cap, target, drafter, data_dir, ignore_eos, no_chat, seed, as_json, no_progress) -> None:
    """Goodput of chain / fixed / uniform / best_first at each batch size B, measured side by side."""
    import torch

    from perf.datasets import DatasetError, load_dataset
    from perf.report import machine_info, percentiles
    from runtime.engine.build import build_engine

    sizes = _int_list(batch_sizes, "--batch-sizes")
    names = list(dict.fromkeys(["chain"] + [p.strip() for p in policies.split(",") if p.strip()]))
    if threads < 1 or num_requests < 1 or max_new_tokens < 1:
        raise click.BadParameter("--threads, --num-requests and --max-new-tokens must be >= 1")
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    torch.set_grad_enabled(False)
    try:
        pols = [make_policy(n, shared_width, fixed_width, max_width, rank_cap) for n in names]
        requests = load_dataset(dataset, num_requests, max_new_tokens, data_dir)
    except (ValueError, DatasetError) as err:
        raise click.ClickException(str(err)) from None
    try:
        built = build_engine(target, drafter, SpecConfig(rank_cap=rank_cap), "cpu", None, threads)
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    loaded, draft = built.models, built.engine.drafter
    prompts = [list(r.input_ids) if r.input_ids is not None else built.encode(r.prompt, not no_chat)
               for r in requests]
    result = measure_goodput(loaded.target, draft, prompts, sizes, pols, max_new_tokens, loaded.tokenizer,
                             () if ignore_eos else loaded.eos_token_ids, progress=not no_progress)
    report = {
        "engine": {**built.describe(), "backend": "cast-trtllm LLMEngine (ragged verify)", "ignore_eos": ignore_eos,
                   "chat_template": not no_chat},
        "machine": machine_info(),
        "dataset": {"name": dataset, "num_requests": len(prompts), "isl_stats": percentiles([len(p) for p in prompts])},
        "settings": {"batch_sizes": sizes, "policies": names, "max_new_tokens": max_new_tokens,
                     "shared_width_W": shared_width, "fixed_width_N": fixed_width, "max_width": max_width,
                     "seed": seed, "threads": threads, "sampling": "greedy",
                     "budgets": {p.name: budget_note(p, draft.num_draft_positions) for p in pols},
                     "timer": "decode rounds only (admission prefill excluded); policies interleaved round by round",
                     "date": datetime.now(timezone.utc).isoformat(timespec="seconds")},
        **result,
    }
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    lossless = report["lossless"]
    md = (f"# Goodput on CPU ({loaded.name}, {built.describe()['dtype']}, {threads} thread(s))\n\n"
          f"{len(prompts)} {dataset} requests x {max_new_tokens} new tokens, greedy; uniform and best_first share "
          f"{shared_width}·B nodes per round, fixed = {fixed_width}/request.\n\n{format_goodput(report['cells'], True)}\n\n"
          f"Greedy outputs equal to the chain's for every policy: {lossless['all_policies_equal_chain']}.\n")
    out_path.with_suffix(".md").write_text(md)
    if plot:
        plot_goodput(report["cells"], plot)
    click.echo(json.dumps(report, indent=2) if as_json else format_goodput(report["cells"]))
    click.echo(f"wrote {out_path} and {out_path.with_suffix('.md')}", err=as_json)
    if not lossless["all_policies_equal_chain"]:
        raise click.ClickException(f"greedy outputs differ from the chain's: {', '.join(lossless['mismatches'])}")


if __name__ == "__main__":
    main()
