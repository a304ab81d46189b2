"""Through the one loader and the one engine, on tiny random HF checkpoints of every
supported family with z-lab-format drafters: greedy chain and CAST (N = 1, 15, 63, auto)
equal AR token for token, alone (B = 1) and with mixed methods in one batch (B = 4)."""

from __future__ import annotations

import pytest

from cast_trtllm.profile import REFERENCE_DIR
from cast_trtllm.spec_config import SpecConfig
from runtime.engine import Request
from runtime.engine.build import build_engine

from tests.runtime.hf_checkpoints import FAMILIES, write_tiny_checkpoint, write_tiny_drafter

PROMPTS = ("hello there", "def f(x):", "1, 2, 3,", "The sky is")
NEW = 24
# any measured table gives `auto` a cost curve (the tiny model has no profile of its own)
PROFILE = str(sorted(REFERENCE_DIR.glob("h100-sxm__qwen3-8b__table5.json"))[0])


@pytest.fixture(scope="module", params=FAMILIES)
def built(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    target = write_tiny_checkpoint(request.param, root / "target")
    drafter = write_tiny_drafter(target, root / "drafter", block_size=16)
    return build_engine(str(target), str(drafter), SpecConfig(width_profile=PROFILE, draft_gate=False), "cpu",
                        "float32", say=lambda _: None)


def _ids(built, prompt):
    return tuple(built.encode(prompt, chat=True))


def _ar(built, prompt):
    return built.engine.generate([Request(_ids(built, prompt), NEW, method="ar")])[0].token_ids


@pytest.mark.parametrize("method, budget", [("chain", None), ("cast", 1), ("cast", 15), ("cast", 63), ("cast", "auto")])
def test_greedy_speculation_equals_ar_alone(built, method, budget):
    for prompt in PROMPTS[:2]:
        out = built.engine.generate([Request(_ids(built, prompt), NEW, method=method, budget=budget)])[0]
        assert out.token_ids == _ar(built, prompt), (built.models.name, method, budget, prompt)
        if method == "cast" and budget != 1:
            assert max(out.budgets) > 1


def test_greedy_mixed_methods_in_one_batch_equal_ar(built):
    mix = [("cast", "auto"), ("chain", None), ("ar", None), ("cast", 15)]
    requests = [Request(_ids(built, p), NEW, method=m, budget=b) for p, (m, b) in zip(PROMPTS, mix)]
    seqs = [built.engine.add_request(r) for r in requests]
    rounds = 0
    while built.engine.active:
        rounds += 1
        assert len(built.engine.active) <= 4
        built.engine.step()
    for prompt, seq in zip(PROMPTS, seqs):
        assert seq.tokens == _ar(built, prompt)
    # each round (one verify) served every live request; the first prefilled all four prompts in one pass
    assert rounds == 1 + max(s.num_rounds for s in seqs)
