"""The shipped head's recipe is data (`drafter_builder/recipe.json`): walking it invokes
exactly the commands, with exactly the options, that the recipe invoked when its phases
were Python constants; a data run asks for its own pools only; and the prompts its data
runs asked for are what `data --skip-shipped` keeps clear of, run by run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from drafter_builder.cli import train_drafter
from drafter_builder.prompts import pool
from drafter_builder.recipe import POOL_OPTIONS, ROOT, data_options, phases, self_chat_record, shipped_prompts
from drafter_builder.stubs import stdlib_stubs

# every invocation of `train-drafter recipe` (options with click's defaults filled in), recorded
# from perf/train_drafter.py before the phases moved into recipe.json; paths as <work>/<data>/<repo>
INVOCATIONS = Path(__file__).with_name("recipe_invocations.json")


def _plain(value, roots: dict[str, Path]):
    if isinstance(value, Path):
        for tag, root in roots.items():
            if value == root:
                return tag
            if value.is_relative_to(root):
                return f"{tag}/{value.relative_to(root)}"
    return "inf" if isinstance(value, float) and math.isinf(value) else value


def test_the_recipe_invokes_exactly_what_the_recorded_recipe_invoked(tmp_path, monkeypatch):
    roots = {"<work>": tmp_path / "work", "<data>": tmp_path / "data", "<repo>": ROOT}
    calls = []
    for name in ("data", "heldout", "train", "report"):
        def record(_name=name, **options):
            calls.append({"command": _name, **{k: _plain(v, roots) for k, v in options.items()}})
        monkeypatch.setattr(train_drafter.commands[name], "callback", record)
    args = ["recipe", "--work", str(roots["<work>"]), "--data-dir", str(roots["<data>"])]
    res = CliRunner().invoke(train_drafter, args)
    assert res.exit_code == 0, res.output
    assert calls == json.loads(INVOCATIONS.read_text())
    assert [p.number for p in phases()] == list(range(1, 11))


def test_a_data_run_asks_for_its_pools_only_and_a_chat_run_replays_its_seeds_committed_prompts():
    gsm = data_options({"name": "gsm1", "seed": 3, "pools": {"gsm8k": 1500, "gsm8k_stub": 800}, "gen_minutes": None})
    assert {k: gsm[k] for k in POOL_OPTIONS if gsm[k]} == {"gsm8k": 1500, "gsm8k_stub": 800}
    assert gsm["gen_minutes"] == math.inf and gsm["self_chat_file"] is None
    chat = data_options({"name": "chat3", "seed": 5, "pools": {"self_chat": 1200}, "gen_minutes": 11.0,
                         "dtype": "bf16"})
    assert chat["self_chat_file"] == self_chat_record(5) and chat["self_chat_file"].is_file()
    assert chat["dtype"] == "bf16"


@pytest.mark.skipif(not (ROOT.parent / "shared" / "data" / "gsm8k_train.jsonl").is_file(),
                    reason="shared data folder not present")
def test_shipped_prompts_hold_every_committed_chat_turn_and_a_run_skips_only_its_predecessors():
    data = ROOT.parent / "shared" / "data"
    shipped = shipped_prompts(data)
    # (seed, prompts) of the chat runs
    chat_runs = ((0, 600), (1, 480), (2, 720), (5, 1200), (8, 640), (9, 3000), (13, 2400), (16, 2400))
    written = [p for seed, n in chat_runs for p in json.loads(self_chat_record(seed).read_text())[:n]]
    assert set(written) <= shipped
    assert set(stdlib_stubs(methods=False)) <= shipped  # phase 7 asked for every function stub
    assert set(stdlib_stubs(methods=True)) <= shipped  # phase 7 asked for 1200 method stubs, phase 8 the rest
    questions = pool(data, "gsm8k_train")
    used = sum(q in shipped for q in questions)
    assert 3000 < used <= 6800 < len(questions)  # four runs of 1500 draws and one of 800, overlapping
    assert shipped == shipped_prompts(data)  # drawn again from recorded seeds: deterministic
    assert shipped_prompts(data, before_run="seed0") == set() and shipped_prompts(data, before_run="new") == shipped
    # a recorded run skips only what the runs before it asked for, as it did when it was made: the
    # counts its data record holds (e.g. gsm3: 732 of 1499 already asked for), whatever later runs drew
    stubs = set(stdlib_stubs(methods=True))
    assert len(stubs & shipped_prompts(data, before_run="code3")) == 0  # code5 asked for them all, later
    assert len(stubs & shipped_prompts(data, before_run="code5")) == 1200
    assert len(set(questions) & shipped_prompts(data, before_run="gsm3")) < len(set(questions) & shipped)
