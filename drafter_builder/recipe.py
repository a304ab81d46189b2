"""The shipped head's recipe, read from `recipe.json`: its phases and their data runs.

The phases are data, not code: `train-drafter recipe` walks them
(`drafter_builder.cli`), and `shipped_prompts` draws again every prompt their data
runs asked for, so a new run can keep clear of them (`data --skip-shipped`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from drafter_builder.prompts import PROMPT_SOURCES, load_prompts

ROOT = Path(__file__).resolve().parents[1]  # the repository
RECIPE = Path(__file__).with_name("recipe.json")
# `data`'s pool options (`--gsm8k` for gsm8k_train, ...) -> prompt pools, in the order `load_prompts` draws
# them (the order fixes the shuffle)
POOL_OPTIONS = {name.removesuffix("_train"): name for name in PROMPT_SOURCES}


def self_chat_record(seed: int) -> Path:
    """The committed target-written prompts the shipped head's data runs used."""
    return ROOT / "perf" / "results" / "drafter" / f"self_chat_prompts_seed{seed}.json"


def pool_counts(options: dict[str, int]) -> dict[str, int]:
    """Prompts per pool of a data run from its pool options (zero pools dropped), in draw order."""
    return {pool: options[opt] for opt, pool in POOL_OPTIONS.items() if options.get(opt, 0) > 0}


@dataclass(frozen=True, slots=True)
class Phase:
    """One training phase: data runs, then (phase 1) the held-out data, then training runs."""

    number: int
    why: str
    work: str  # folder under --work ("" = --work itself)
    data: tuple[dict[str, Any], ...]  # options of `train-drafter data`, pools given as `pools`
    heldout: bool
    train: tuple[dict[str, Any], ...]  # options of `train-drafter train`


@cache
def _raw() -> dict[str, Any]:
    return json.loads(RECIPE.read_text())


def phases() -> tuple[Phase, ...]:
    """The recipe's phases in order."""
    out = []
    for p in _raw()["phases"]:
        unknown = set(p) - {"phase", "why", "work", "data", "heldout", "train"}
        if unknown:
            raise ValueError(f"{RECIPE}: phase {p.get('phase')} has unknown keys {sorted(unknown)}")
        out.append(Phase(p["phase"], p["why"], p["work"], tuple(p["data"]), p.get("heldout", False), tuple(p["train"])))
    return tuple(out)


def report_options() -> dict[str, str]:
    """`train-drafter report` outputs of the recipe, as file names under --work."""
    return dict(_raw()["report"])


def data_options(run: dict[str, Any]) -> dict[str, Any]:
    """A recipe data run as `train-drafter data` options: its pools (every other pool 0), its
    time box (null: none), and the committed target-written prompts of its seed if it asks for any."""
    run = dict(run)
    pools = run.pop("pools")
    unknown = set(pools) - set(POOL_OPTIONS)
    if unknown:
        raise ValueError(f"{RECIPE}: data run {run.get('name')} names unknown pools {sorted(unknown)}")
    minutes = run.pop("gen_minutes")
    chat = pools.get("self_chat", 0) > 0
    return {**dict.fromkeys(POOL_OPTIONS, 0), **pools, **run, "gen_minutes": math.inf if minutes is None else minutes,
            "self_chat_file": self_chat_record(run["seed"]) if chat else None}


def shipped_prompts(data_dir: Path, before_run: str | None = None) -> set[str]:
    """Every prompt the shipped head's data runs asked for before the run named `before_run`, in
    recipe order (all of them for a run the recipe does not hold: a new one). A recorded run
    skips only what its predecessors asked for, as it did when it was made, so a replay draws
    what it drew then, and a run resuming keeps its own prompts. A superset of what they
    answered: time boxes and skip-seen answered fewer. Drawn again from the recorded pools,
    seeds and counts; a run's target-written prompts are the committed file of its seed."""
    runs: dict[str, dict[str, Any]] = {}  # name -> options of its first invocation (a run may be finished later)
    for phase in phases():
        for run in phase.data:
            runs.setdefault(run["name"], data_options(run))
    names = list(runs)
    kept = names[: names.index(before_run)] if before_run in names else names
    out: set[str] = set()
    for name in kept:
        options = runs[name]
        counts = pool_counts(options)
        chat = counts.get("self_chat", 0)
        written = json.loads(options["self_chat_file"].read_text())[:chat] if chat else []
        out |= {p for _, p in load_prompts(data_dir, counts, options["seed"], written)}
    return out
