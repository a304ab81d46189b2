"""Drafter training data decoded in bf16 beside fp32, side by side (`train-drafter data --dtype`).

For the first prompts of each held-out domain, one process decodes the target's greedy
continuations in fp32 (the exact target) and in bf16 (AMX / AVX512-bf16 on recent Xeons),
batch by batch, alternating which goes first, and reports:
  - tokens/s of each and their ratio;
  - how often the bf16 path equals the fp32 path (identical sequences, first divergence);
  - agreement: the share of bf16 response tokens equal to the fp32 target's own greedy token
    given the same (bf16) prefix, read from an exact fp32 pass over the bf16 sequences;
  - the shipped head's teacher-forced tau on fp32 data, on bf16 data with its bf16 taps, and
    on the same bf16 sequences with fp32 taps (tap precision vs. path, separated).

    python -m drafter_builder.data_dtype --domains humaneval,mt_bench --prompts 64 --batch-size 32 \
        --json perf/results/drafter/data_dtype.json
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import click
import torch

from drafter_builder.cli import common
from drafter_builder.cli.common import DATA, LAYER_IDS, MAX_NEW_TOKENS, THREADS, heldout_prompts


@torch.inference_mode()
def fp32_pass(hf, recs: list[dict]) -> tuple[list[dict], int, int]:
    """The records with fp32 taps of their own sequences, and (agreeing, response) token counts."""
    out, agree, total = [], 0, 0
    head = hf.get_output_embeddings().weight
    for rec in recs:
        ids, p = rec["ids"].long(), rec["prompt_len"]
        hidden = hf.model(input_ids=ids[None], output_hidden_states=True).hidden_states
        taps = torch.cat([hidden[i + 1][0, :-1] for i in LAYER_IDS], dim=-1)  # [T-1, F]
        greedy = (hidden[-1][0, p - 1 : -1] @ head.T).argmax(-1)  # the fp32 target's token at each response slot
        agree, total = agree + int((greedy == ids[p:]).sum()), total + len(ids) - p
        out.append({**rec, "taps": taps.to(torch.float16)})
    return out, agree, total


@click.command()
@DATA
@click.option("--domains", default="humaneval,mt_bench,gsm8k", show_default=True, help="Held-out sets, comma-separated.")
@click.option("--prompts", type=int, default=32, show_default=True, help="Prompts per domain.")
@click.option("--batch-size", type=int, default=16, show_default=True,
              help="Prompts per decoding batch; fp32 and bf16 take turns batch by batch.")
@MAX_NEW_TOKENS
@THREADS
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write JSON.")
def main(data_dir: Path, domains: str, prompts: int, batch_size: int, max_new_tokens: int, threads: int,
         json_path: Path | None) -> None:
    from drafter_builder import shards as S
    from drafter_builder import train as T
    from runtime.device import device_name
    from runtime.drafter import DEFAULT_DRAFTER, load_drafter
    from runtime.loader import encode_prompt

    hf, tok, frozen, target_cfg = common.load_target(threads)
    models = {"fp32": hf, "bf16": copy.deepcopy(hf).to(torch.bfloat16)}
    drafter = load_drafter(DEFAULT_DRAFTER, target_cfg)
    eos, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id
    rows = {}
    for k, name in enumerate(domains.split(",")):
        ids = [encode_prompt(tok, p, chat=True) for _, p in heldout_prompts(data_dir, name, prompts)]
        recs, seconds = {"fp32": [], "bf16": []}, {"fp32": 0.0, "bf16": 0.0}
        for j in range(0, len(ids), batch_size):  # interleaved batches: machine noise hits both alike
            for dtype in (("fp32", "bf16") if (k + j // batch_size) % 2 == 0 else ("bf16", "fp32")):
                mark = time.monotonic()
                batch = ids[j : j + batch_size]
                recs[dtype] += S.generate_shard(models[dtype], batch, LAYER_IDS, max_new_tokens, eos, pad)
                seconds[dtype] += time.monotonic() - mark
        speed = {d: sum(len(r["ids"]) - r["prompt_len"] for r in recs[d]) / seconds[d] for d in recs}
        pairs = list(zip(recs["fp32"], recs["bf16"]))
        divergence = []
        for a, b in pairs:
            x, y = a["ids"][a["prompt_len"] :].tolist(), b["ids"][b["prompt_len"] :].tolist()
            divergence.append(next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y))))
        retapped, agree, total = fp32_pass(hf, recs["bf16"])
        rows[name] = {
            "prompts": len(ids),
            "tokens_per_s": {d: round(v, 1) for d, v in speed.items()},
            "bf16_speedup": round(speed["bf16"] / speed["fp32"], 2),
            "identical_sequences": sum(a["ids"].tolist() == b["ids"].tolist() for a, b in pairs),
            "mean_first_divergence": round(sum(divergence) / len(divergence), 1),
            "bf16_token_agreement": round(agree / total, 4),
            "shipped_head_tau": {
                "fp32_data": T.acceptance(drafter, frozen, recs["fp32"])["tau"],
                "bf16_data_bf16_taps": T.acceptance(drafter, frozen, recs["bf16"])["tau"],
                "bf16_data_fp32_taps": T.acceptance(drafter, frozen, retapped)["tau"],
            },
        }
        r = rows[name]
        click.echo(f"{name:<10} fp32 {r['tokens_per_s']['fp32']:6.1f} tok/s  bf16 {r['tokens_per_s']['bf16']:6.1f} tok/s "
                   f"(x{r['bf16_speedup']})  identical {r['identical_sequences']}/{r['prompts']}  "
                   f"agreement {r['bf16_token_agreement']:.4f}  tau {r['shipped_head_tau']}")
    if json_path is not None:
        json_path.write_text(json.dumps({"device": device_name(torch.device("cpu")), "threads": threads,
                                         "batch_size": batch_size, "max_new_tokens": max_new_tokens,
                                         "date": time.strftime("%Y-%m-%d"),
                                         "domains": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
