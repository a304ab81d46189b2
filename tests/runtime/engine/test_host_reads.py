"""A greedy round reads the device ONCE: the committed tokens (and, with them, the round's
trees). Counted on the torch path on the CPU, where a read costs nothing but is still a
call: every tensor -> host conversion (`cpu`, `numpy`, `tolist`, `item`, `__array__`,
`__bool__`/`__int__`/`__float__`/`__index__`) and every op whose output shape depends on
data (a device sync on CUDA: nonzero, masked_select, boolean indexing, unique, ...).
Only `LLMEngine.host_reads` may make one, once per round."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cast_trtllm.sampling import SamplingParams
from cast_trtllm.spec_config import SpecConfig
from runtime.drafter.executor import DrafterExecutor
from runtime.engine import LLMEngine, Request

SYNC_OPS = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "repeat_interleave", "equal")
CONVERSIONS = ("cpu", "numpy", "tolist", "item", "__array__", "__bool__", "__int__", "__float__", "__index__")


class SyncOps(TorchDispatchMode):
    def __init__(self, seen: list) -> None:
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__
        if any(op in name for op in SYNC_OPS) or (
                "index" in name and any(isinstance(a, (list, tuple)) and any(
                    isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in a) for a in args)):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@contextmanager
def host_reads(engine: LLMEngine):
    """-> (reads through engine.host_reads, every other read / sync) inside the block."""
    seen, reads, inside = [], [0], [False]
    original = {name: getattr(torch.Tensor, name) for name in CONVERSIONS}

    def spy(name):
        def call(self, *args, **kwargs):
            if not inside[0]:
                seen.append(name)
            return original[name](self, *args, **kwargs)
        return call

    allowed = engine.host_reads.__class__.__call__

    def counted(self, tensor):
        reads[0] += 1
        inside[0] = True
        try:
            return allowed(self, tensor)
        finally:
            inside[0] = False

    for name in CONVERSIONS:
        setattr(torch.Tensor, name, spy(name))
    engine.host_reads.__class__.__call__ = counted
    try:
        with SyncOps(seen):
            yield reads, seen
    finally:
        for name, fn in original.items():
            setattr(torch.Tensor, name, fn)
        engine.host_reads.__class__.__call__ = allowed


@pytest.fixture(scope="module")
def shipped(embedded_checkpoint):
    from runtime.loader import models_from_hf

    return models_from_hf(embedded_checkpoint, drafter="default")


def second_round_reads(models, requests: list[Request]) -> tuple[LLMEngine, list]:
    """Run `requests` to completion on a device-tree engine (what a CUDA engine does; the CPU
    default builds trees on the host), asserting its second round read the device once."""
    engine = LLMEngine(models.target, DrafterExecutor(models.drafter, models.target), models.tokenizer, (),
                       SpecConfig(method="cast"))
    engine.device_trees = True
    seqs = [engine.add_request(r) for r in requests]
    engine.step()
    with host_reads(engine) as (reads, others):
        engine.step()
    assert len(engine.active) == len(requests)
    assert reads[0] == 1 and others == [], (reads, others)
    while engine.active:
        engine.step()
    return engine, seqs


@pytest.mark.parametrize("method, budget", [("ar", None), ("chain", None), ("cast", 7)])
def test_a_greedy_round_of_four_requests_reads_the_device_once(shipped, method, budget):
    """Greedy: the round reads once, and the outputs equal AR's."""
    requests = [Request([1, 2, 3 + i, 4, 5], 12, method=method, budget=budget, ignore_eos=True) for i in range(4)]
    _, seqs = second_round_reads(shipped, requests)
    ar = LLMEngine(shipped.target, None, shipped.tokenizer, (), SpecConfig(method="ar"))
    alone = ar.generate([replace(r, method="ar", budget=None) for r in requests])
    assert [s.tokens for s in seqs] == [r.token_ids for r in alone]  # fp32: CAST = AR


@pytest.mark.parametrize("method, budget", [("ar", None), ("chain", None), ("cast", 7), ("mixed", None)])
def test_a_sampled_round_of_four_requests_reads_the_device_once(shipped, method, budget):
    """T > 0 (Theorem 3's walk on the device): one read per round, and a seed reproduces a
    request's tokens whatever shares its batch."""
    kinds = [("ar", None), ("chain", None), ("cast", 7), ("cast", 3)] if method == "mixed" else [(method, budget)] * 4
    laws = [SamplingParams(temperature=0.8, seed=i) if i % 2 else SamplingParams(temperature=1.2, top_p=0.9, seed=i)
            for i in range(4)]
    requests = [Request([1, 2, 3 + i, 4, 5], 12, laws[i], method=m, budget=n, ignore_eos=True)
                for i, (m, n) in enumerate(kinds)]
    engine, seqs = second_round_reads(shipped, requests)
    for b in (1, 3):
        assert seqs[b].tokens == engine.generate([requests[b]])[0].token_ids
