"""`cast-trtllm train-drafter`: train, ship and score the DFlash head of the embedded target.

Steps (each resumable; caches live under --work, never in the repository):
  data       target greedy continuations + taps of training prompts (fp16 shards)
  heldout    the same for the first prompts of GSM8K test, HumanEval and MT-Bench
  train      DFlash block training; writes the shipped checkpoint and resumes from --work
  calibrate  fit the plug-in mass calibration on the validation split
  report     greedy replay per domain: chain R, CAST R at budgets, depth-1 reliability
  fit        trained-on vs held-out tau per data run (more data, or a wider head?)
  curve      learning curve from report files of several checkpoints
  recipe     all of the above with the shipped head's recorded phases (recipe.json), one command

    cast-trtllm train-drafter recipe                 # reproduces runtime/drafter/default
    cast-trtllm train-drafter report --json r.json   # acceptance report of a checkpoint
"""

from __future__ import annotations

import click

from drafter_builder.cli.calibrate import calibrate
from drafter_builder.cli.data import data, heldout
from drafter_builder.cli.recipe import recipe
from drafter_builder.cli.report import curve, fit, report
from drafter_builder.cli.train import train


@click.group("train-drafter")
def train_drafter() -> None:
    """Train, ship and score the DFlash head of the embedded target (CPU)."""


for _command in (data, heldout, train, calibrate, report, fit, curve, recipe):
    train_drafter.add_command(_command)
