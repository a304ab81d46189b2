"""`cast-trtllm prepare-dataset | bench | sweep`.

    cast-trtllm prepare-dataset gsm8k --out gsm8k.jsonl --num-prompts 20 --output-tokens 128
    cast-trtllm bench latency --dataset gsm8k.jsonl --methods ar,chain,cast:auto,dflash,hf --out r
    cast-trtllm bench throughput --dataset gsm8k --concurrency 1,4,16 --out t
    cast-trtllm sweep --dataset gsm8k,humaneval --budgets 1,3,7,15,31,63 --out s

`bench` is `python -m perf.bench` and `sweep` its `sweep` mode: one command, one engine.
"""

from __future__ import annotations

import click

from perf.bench import bench, sweep
from perf.datasets import DEFAULT_OUTPUT_TOKENS, NAMED_SETS, DatasetError, named_requests, write_requests

__all__ = ["bench", "prepare_dataset", "sweep"]


@click.command("prepare-dataset")
@click.argument("name", type=click.Choice(sorted(NAMED_SETS)))
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="Output JSONL (trtllm-bench format).")
@click.option("--num-prompts", type=int, default=None, help="Use the first N prompts (default: all).")
@click.option("--output-tokens", type=int, default=DEFAULT_OUTPUT_TOKENS, show_default=True,
              help="output_tokens of every row.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Evaluation data directory (default: ../shared/data next to the repo).")
def prepare_dataset(name: str, out: str, num_prompts: int | None, output_tokens: int, data_dir: str | None) -> None:
    """Write a named prompt set as a trtllm-bench dataset JSONL."""
    try:
        requests = named_requests(name, num_prompts, output_tokens, data_dir)
    except DatasetError as err:
        raise click.ClickException(str(err)) from None
    write_requests(requests, out)
    click.echo(f"wrote {len(requests)} requests of {name} to {out}")
