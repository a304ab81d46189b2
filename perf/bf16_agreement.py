"""bf16 honesty: how often greedy bf16 CAST equals greedy bf16 AR, and why it differs.

In fp32 greedy CAST equals AR token for token (tested on every change). In bf16 the
verify pass scores a token inside a packed tree with different kernels and shapes than
AR scores it alone, so at a near-tie the argmax can flip. For each prompt this reports:
identical or not, the first divergence position, and whether that divergence is a
near-tie — the fp32 target's logit margin between the AR token and the CAST token at
that position (on the AR prefix) below `--tie-margin`.

    python -m perf.bf16_agreement --dataset gsm8k --num-prompts 10 --max-new-tokens 64 \
        --out perf/results/bf16_agreement.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import click
import torch
from tqdm import tqdm

from cast_trtllm.spec_config import SpecConfig
from runtime.engine import LLMEngine, Request


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (None if one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def fp32_margin(model: Any, prompt: Sequence[int], emitted: Sequence[int], pos: int, tok_a: int, tok_b: int) -> float:
    """|logit(tok_a) - logit(tok_b)| of the fp32 target after prompt + emitted[:pos]."""
    from runtime.engine.backend import TorchTarget

    backend = TorchTarget(model)
    ids = list(prompt) + list(emitted[:pos])
    seq = backend.new_sequence(len(ids) + 1)
    logits, _ = backend.prefill(seq, torch.tensor(ids))
    return float((logits[-1, tok_a] - logits[-1, tok_b]).abs())


def compare(engine: LLMEngine, fp32_model: Any, prompts: Sequence[Sequence[int]], methods: Sequence[tuple[str, Any]],
            max_new: int, tie_margin: float, progress: bool = True) -> dict[str, Any]:
    rows = []
    for prompt in tqdm(prompts, desc="bf16 agreement", disable=not progress):
        ar = engine.generate([Request(prompt, max_new, method="ar", ignore_eos=True)])[0].token_ids
        for method, budget in methods:
            out = engine.generate([Request(prompt, max_new, method=method, budget=budget, draft_gate=False,
                                           ignore_eos=True)])[0].token_ids
            pos = first_divergence(ar, out)
            row = {"method": f"{method}:{budget}" if budget is not None else method, "identical": ar == out,
                   "first_divergence": pos, "fp32_margin": None, "near_tie": None}
            if pos is not None:
                row["fp32_margin"] = fp32_margin(fp32_model, prompt, ar, pos, ar[pos], out[pos])
                row["near_tie"] = row["fp32_margin"] < tie_margin
            rows.append(row)
    summary = {}
    for label in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == label]
        diverged = [r for r in mine if not r["identical"]]
        summary[label] = {"prompts": len(mine), "identical": sum(r["identical"] for r in mine),
                          "diverged": len(diverged), "near_tie_divergences": sum(bool(r["near_tie"]) for r in diverged),
                          "mean_first_divergence": (sum(r["first_divergence"] for r in diverged) / len(diverged)
                                                    if diverged else None)}
    return {"summary": summary, "rows": rows}


@click.command()
@click.option("--dataset", default="gsm8k", show_default=True, help="Named prompt set or trtllm-bench JSONL.")
@click.option("--num-prompts", type=int, default=10, show_default=True)
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--tie-margin", type=float, default=0.1, show_default=True,
              help="A divergence is a near-tie when the fp32 logit margin of the two tokens is below this.")
@click.option("--budgets", default="15", show_default=True, help="Comma list of CAST budgets (besides the chain).")
@click.option("--threads", type=int, default=None, help="torch CPU threads.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None)
@click.option("--out", type=click.Path(dir_okay=False), default="perf/results/bf16_agreement.json", show_default=True)
def main(dataset, num_prompts, max_new_tokens, tie_margin, budgets, threads, data_dir, out) -> None:
    """Greedy bf16 CAST vs greedy bf16 AR on the embedded target and the shipped head."""
    from perf.datasets import load_dataset
    from perf.report import machine_info
    from runtime.drafter import DrafterExecutor
    from runtime.loader import encode_prompt, load_models

    if threads:
        torch.set_num_threads(threads)
    fp32 = load_models("embedded", "default", "cpu", "float32")
    bf16_target = load_models("embedded", "none", "cpu", "bfloat16").target
    engine = LLMEngine(bf16_target, DrafterExecutor(fp32.drafter, bf16_target), fp32.tokenizer, fp32.eos_token_ids,
                       SpecConfig())
    requests = load_dataset(dataset, num_prompts, max_new_tokens, data_dir)
    prompts = [encode_prompt(fp32.tokenizer, r.prompt, True) for r in requests]
    methods = [("chain", None)] + [("cast", int(b)) for b in budgets.split(",")]
    report = compare(engine, fp32.target, prompts, methods, max_new_tokens, tie_margin)
    report["settings"] = {"dataset": dataset, "num_prompts": len(prompts), "max_new_tokens": max_new_tokens,
                          "tie_margin_fp32_logits": tie_margin, "target": fp32.name, "dtype": "bfloat16",
                          "machine": machine_info()}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report, indent=2) + "\n")
    for label, s in report["summary"].items():
        click.echo(f"{label}: {s['identical']}/{s['prompts']} identical to bf16 AR; {s['diverged']} diverged "
                   f"({s['near_tie_divergences']} at an fp32 near-tie < {tie_margin}), mean first divergence "
                   f"{s['mean_first_divergence']}")
    click.echo(f"wrote {out}")


if __name__ == "__main__":
    main()
