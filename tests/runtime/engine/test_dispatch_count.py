"""One forward per round, whatever the batch: on the torch path a round of 16 requests
dispatches at most 1.3x the aten ops of a round of one (the model's layers run once for
all of them; only per-request bookkeeping — its walk, its commit — grows with B).
Counted with a TorchDispatchMode on the embedded target and the shipped drafter."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

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


def ops_per_round(models, batch: int, method: str, budget: int | None) -> int:
    """aten ops of the second round (the first after every request's prefill and first round)."""
    engine = LLMEngine(models.target, DrafterExecutor(models.drafter, models.target), models.tokenizer, (),
                       SpecConfig(method="cast"))
    for i in range(batch):
        engine.add_request(Request([1, 2, 3 + i, 4, 5], 8, method=method, budget=budget))
    engine.step()
    with AtenCount() as count:
        engine.step()
    assert len(engine.active) == batch  # every request took part in the counted round
    return count.ops


@pytest.mark.parametrize("method, budget", [("ar", None), ("cast", 3), ("chain", None)])
def test_a_round_of_16_requests_dispatches_at_most_1_3x_the_ops_of_one(shipped, method, budget):
    alone, loaded = ops_per_round(shipped, 1, method, budget), ops_per_round(shipped, 16, method, budget)
    assert loaded <= 1.3 * alone, (alone, loaded)
