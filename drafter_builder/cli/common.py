"""What every `train-drafter` subcommand shares: options, the frozen target, the evaluation sets."""

from __future__ import annotations

import os
from pathlib import Path

import click
import torch

from drafter_builder.blocks import FrozenTarget
from drafter_builder.recipe import ROOT
from runtime.drafter import DEFAULT_DRAFTER

LAYER_IDS = (1, 8, 15, 22, 29)  # taps stored in the data shards
MASK_TOKEN_ID = 16  # <empty_output>: a special token the chat template never emits
HELDOUT_SETS = ("gsm8k", "humaneval", "mt_bench")  # domains of the acceptance report

WORK = click.option("--work", type=click.Path(file_okay=False, path_type=Path), default=Path("/tmp/dflash_train"),
                    show_default=True, help="Cache folder for shards, checkpoints and trainer state.")
DATA = click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path),
                    default=ROOT.parent / "shared" / "data", show_default=True, help="Shared data folder.")
SEED = click.option("--seed", type=int, default=0, show_default=True, help="Seed of prompts, init and anchors.")
CHECKPOINT = click.option("--checkpoint", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DRAFTER,
                          show_default=True, help="Drafter checkpoint (the shipped head by default).")
THREADS = click.option("--threads", type=int, default=2, show_default=True, help="torch CPU threads.")
DEVICE = click.option("--device", default="cpu", show_default=True,
                      help="torch device of the target and head (e.g. cuda); shards, checkpoints and the mass "
                           "calibration stay on the CPU.")
MAX_NEW_TOKENS = click.option("--max-new-tokens", type=int, default=128, show_default=True,
                              help="Greedy tokens per prompt.")
VAL_SHARDS = click.option("--val-shards", type=int, default=2, show_default=True,
                          help="Last shards of each data run held out for validation (tau monitor, mass calibration).")


def file_option(*decls: str, help: str, **kw):
    """An output file option (`--json`, `--plot`, ...): None unless given."""
    return click.option(*decls, type=click.Path(dir_okay=False, path_type=Path), default=None, help=help, **kw)


def load_target(threads: int, seed: int = 0):
    """(HF model, tokenizer, FrozenTarget, TargetConfig) of the embedded target, frozen, after
    setting torch's CPU threads and seed."""
    from runtime.loader import load_hf_checkpoint
    from runtime.model.llama import TargetConfig

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    checkpoint = load_hf_checkpoint("embedded", dtype=torch.float32)
    hf, tok = checkpoint.model, checkpoint.tokenizer
    hf.requires_grad_(False)
    return hf, tok, FrozenTarget.from_hf(hf), TargetConfig.from_hf(hf.config)


def heldout_prompts(data_dir: Path, name: str, count: int | None) -> list[tuple[str, str]]:
    """The first `count` prompts of an evaluation set (MT-Bench: first turns)."""
    from perf.datasets import named_requests

    return [(name, r.prompt) for r in named_requests(name, count, data_dir=data_dir)]
