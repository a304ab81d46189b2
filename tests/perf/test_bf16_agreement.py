"""perf.bf16_agreement on a tiny random target: it finds divergences, places them, and
measures their fp32 margin; in fp32 every method agrees with AR exactly."""

from __future__ import annotations

import torch

from cast_trtllm.spec_config import SpecConfig
from perf.bf16_agreement import compare, first_divergence
from runtime.drafter import DrafterExecutor, random_drafter
from runtime.engine import LLMEngine

from tests.runtime.doubles import random_target


def test_first_divergence_places_the_first_differing_token():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1


def test_fp32_engine_agrees_with_ar_on_every_prompt():
    target = random_target(seed=2, vocab_size=64)
    engine = LLMEngine(target, DrafterExecutor(random_drafter(target.config, block_size=6, seed=1), target),
                       spec=SpecConfig())
    report = compare(engine, target, [[1, 2, 3], [7, 8]], [("chain", None), ("cast", 15)], 16, 0.1, progress=False)
    assert all(s["identical"] == s["prompts"] == 2 for s in report["summary"].values())


def test_bf16_divergences_get_a_position_and_an_fp32_margin():
    fp32 = random_target(seed=2, vocab_size=64)
    bf16 = random_target(seed=2, vocab_size=64).to(torch.bfloat16)
    engine = LLMEngine(bf16, DrafterExecutor(random_drafter(fp32.config, block_size=6, seed=1), bf16),
                       spec=SpecConfig())
    report = compare(engine, fp32, [[1, 2, 3], [7, 8], [9]], [("cast", 15)], 24, 0.1, progress=False)
    for row in report["rows"]:
        assert row["identical"] == (row["first_divergence"] is None)
        if not row["identical"]:
            assert row["fp32_margin"] >= 0 and isinstance(row["near_tie"], bool)
