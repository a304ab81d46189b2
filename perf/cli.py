"""`cast-trtllm prepare-dataset | bench | sweep`.

    cast-trtllm prepare-dataset gsm8k --out gsm8k.jsonl --num-prompts 20 --output-tokens 128
    cast-trtllm prepare-dataset token-norm-dist --out syn.jsonl --num-requests 32 --input-mean 128 \
        --input-stdev 0 --output-mean 64 --output-stdev 0     # trtllm-bench's synthetic rows
    cast-trtllm bench latency --dataset gsm8k.jsonl --methods ar,chain,cast:auto,dflash,hf --out r
    cast-trtllm bench throughput --dataset gsm8k --concurrency 1,4,16 --out t
    cast-trtllm sweep --dataset gsm8k,humaneval --budgets 1,3,7,15,31,63 --out s

`bench` is `python -m perf.bench` and `sweep` its `sweep` mode: one command, one engine.
"""

from __future__ import annotations

import click

from perf.bench import bench, sweep
from perf.datasets import DEFAULT_OUTPUT_TOKENS, NAMED_SETS, DatasetError, named_requests, write_requests

SYNTHETIC = "token-norm-dist"  # trtllm-bench's prepare_dataset.py subcommand of the same name

__all__ = ["bench", "prepare_dataset", "sweep"]


@click.command("prepare-dataset")
@click.argument("name", type=click.Choice(sorted(NAMED_SETS) + [SYNTHETIC]))
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="Output JSONL (trtllm-bench format).")
@click.option("--num-prompts", "--num-requests", "--num_requests", "num_prompts", type=int, default=None,
              help="Use the first N prompts (default: all); token-norm-dist: how many rows [default: 100].")
@click.option("--output-tokens", type=int, default=DEFAULT_OUTPUT_TOKENS, show_default=True,
              help="output_tokens of every row (named sets).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Evaluation data directory (default: ../shared/data next to the repo).")
@click.option("--input-mean", "--input_mean", "input_mean", type=int, default=128, show_default=True,
              help="token-norm-dist: mean input length (tokens).")
@click.option("--input-stdev", "--input_stdev", "input_stdev", type=float, default=0.0, show_default=True,
              help="token-norm-dist: input length standard deviation.")
@click.option("--output-mean", "--output_mean", "output_mean", type=int, default=128, show_default=True,
              help="token-norm-dist: mean output length (tokens).")
@click.option("--output-stdev", "--output_stdev", "output_stdev", type=float, default=0.0, show_default=True,
              help="token-norm-dist: output length standard deviation.")
@click.option("--random-seed", "--random_seed", "seed", type=int, default=0, show_default=True,
              help="token-norm-dist: seed of the lengths and ids.")
@click.option("--tokenizer", "--target", "tokenizer", default="embedded", show_default=True,
              help="token-norm-dist: the model whose vocabulary the random ids come from (as --target).")
def prepare_dataset(name: str, out: str, num_prompts: int | None, output_tokens: int, data_dir: str | None,
                    input_mean: int, input_stdev: float, output_mean: int, output_stdev: float, seed: int,
                    tokenizer: str) -> None:
    """Write a named prompt set, or trtllm-bench's synthetic token-norm-dist rows, as a trtllm-bench
    dataset JSONL."""
    try:
        if name == SYNTHETIC:
            from perf.synthetic import token_norm_dist
            from runtime.loader import load_tokenizer

            vocab = len(load_tokenizer(tokenizer))
            requests = token_norm_dist(num_prompts or 100, input_mean, input_stdev, output_mean, output_stdev, vocab,
                                       seed)
        else:
            requests = named_requests(name, num_prompts, output_tokens, data_dir)
    except (DatasetError, ValueError) as err:
        raise click.ClickException(str(err)) from None
    write_requests(requests, out)
    click.echo(f"wrote {len(requests)} requests of {name} to {out}")
