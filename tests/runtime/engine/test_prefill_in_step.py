"""Prefill inside `step`: prompts are prefilled in chunks under the round's token budget,
riding the decode pass; outputs equal AR with the whole prompt prefilled at once (fp32)."""

from __future__ import annotations

import numpy as np
import pytest

from cast_trtllm.spec_config import SpecConfig
from runtime.drafter.executor import DrafterExecutor
from runtime.engine import LLMEngine, Request

VOCAB = 64  # the shared target's (conftest.py)


def _prompt(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, VOCAB, size=n).tolist()


def _alone(target, prompt, max_new):  # one chunk: the whole prompt in the first round
    engine = LLMEngine(target, None, spec=SpecConfig(method="ar"), max_num_tokens=4096)
    return engine.generate([Request(prompt, max_new)])[0].token_ids


def test_add_request_runs_no_pass_and_a_long_prompt_is_prefilled_in_budgeted_chunks(target, drafter):
    engine = LLMEngine(target, DrafterExecutor(drafter, target), spec=SpecConfig(method="cast", budget=3),
                       max_num_tokens=24)
    prompt = _prompt(70, seed=1)
    seq = engine.add_request(Request(prompt, 10))
    assert seq.prefilling and seq.prefilled == 0 and seq.tokens == []
    chunks = []
    while seq.prefilling:
        before = seq.prefilled
        engine.step()
        chunks.append(seq.prefilled - before)
    assert chunks == [24, 24, 22] and len(seq.tokens) == 1  # the first token with the last chunk
    while engine.active:
        engine.step()
    assert seq.tokens == _alone(target, prompt, 10)
    assert seq.timings.ttft_ms > 0


@pytest.mark.parametrize("method, budget", [("ar", None), ("chain", None), ("cast", 7)])
def test_a_prompt_joining_a_busy_batch_rides_the_decode_rounds(target, drafter, method, budget):
    engine = LLMEngine(target, DrafterExecutor(drafter, target), spec=SpecConfig(method="cast"), max_num_tokens=20)
    busy = [engine.add_request(Request(_prompt(6, seed=10 + i), 30, method=method, budget=budget)) for i in range(3)]
    engine.step()  # the three short prompts, in one round
    assert not any(s.prefilling for s in busy) and all(len(s.tokens) == 1 for s in busy)
    late = engine.add_request(Request(_prompt(50, seed=2), 8, method=method, budget=budget))
    while late.prefilling:
        emitted = [len(s.tokens) for s in busy]
        engine.step()
        assert all(len(s.tokens) > e for s, e in zip(busy, emitted))  # decoding went on in the same round
    assert late.prefilled == 50
    while engine.active:
        engine.step()
    assert late.tokens == _alone(target, late.request.prompt_ids, 8)
    assert [s.tokens for s in busy] == [_alone(target, s.request.prompt_ids, 30) for s in busy]


def test_a_bad_token_budget_is_refused(target):
    with pytest.raises(ValueError, match="max_num_tokens"):
        LLMEngine(target, None, max_num_tokens=0)
