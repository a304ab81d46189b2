"""One forward per round, whatever the batch: on the torch path a round of 16 requests
dispatches at most 1.3x the aten ops of a round of one (the model's layers run once for
all of them, and the walks, greedy or sampled, run batched; only per-request bookkeeping
— its commit, its uniforms — grows with B).
Counted with a TorchDispatchMode on the embedded target and the shipped drafter."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cast_trtllm.sampling import SamplingParams
from cast_trtllm.spec_config import SpecConfig
from runtime.drafter.executor import DrafterExecutor
from runtime.engine import LLMEngine, Request


class AtenCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def shipped(embedded_checkpoint):
    from runtime.loader import models_from_hf

    return models_from_hf(embedded_checkpoint, drafter="default")


def ops_per_round(models, batch: int, method: str, budget: int | None, temperature: float = 0.0) -> int:
    """aten ops of the second round (the first after every request's prefill and first round)."""
    engine = LLMEngine(models.target, DrafterExecutor(models.drafter, models.target), models.tokenizer, (),
                       SpecConfig(method="cast"))
    for i in range(batch):
        engine.add_request(Request([1, 2, 3 + i, 4, 5], 8, SamplingParams(temperature, seed=i), method=method,
                                   budget=budget, ignore_eos=True))
    engine.step()
    with AtenCount() as count:
        engine.step()
    assert len(engine.active) == batch  # every request took part in the counted round
    return count.ops


@pytest.mark.parametrize("method, budget, temperature", [("ar", None, 0.0), ("cast", 3, 0.0), ("chain", None, 0.0),
                                                         ("cast", 3, 0.8), ("ar", None, 0.8)])
def test_a_round_of_16_requests_dispatches_at_most_1_3x_the_ops_of_one(shipped, method, budget, temperature):
    alone = ops_per_round(shipped, 1, method, budget, temperature)
    loaded = ops_per_round(shipped, 16, method, budget, temperature)
    assert loaded <= 1.3 * alone, (alone, loaded)
