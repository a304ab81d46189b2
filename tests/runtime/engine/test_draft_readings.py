"""The live cost model's draft readings price what drafting adds to EVERY round: a first
draft's context pass over its prompt is prefill, paid once, and stays out of them."""

from __future__ import annotations

import time

import numpy as np

from cast_trtllm.spec_config import SpecConfig
from runtime.drafter.checkpoint import random_drafter
from runtime.drafter.executor import DrafterExecutor
from runtime.engine import LLMEngine, Request
from tests.runtime.doubles import random_target

VOCAB, L, MS_PER_ROW = 64, 4, 2.0


class Readings:
    """Records the engine's cost readings (the `cost` argument's contract)."""

    def __init__(self) -> None:
        self.draft: list[float] = []
        self.verify: list[float] = []
        self.packed: list[tuple[int, int]] = []  # (packed tokens, batch) per verify reading

    def observe_verify(self, packed: int, ms: float, batch: int = 1) -> None:
        self.verify.append(ms)
        self.packed.append((packed, batch))

    def observe_draft(self, ms: float, batch: int = 1) -> None:
        self.draft.append(ms)

    def round_ms(self, packed: int, batch: int = 1, drafted: bool = True) -> float:
        return 1.0  # the realized guard's price of a round no request drafted; not what these tests read


class SlowContext(DrafterExecutor):
    """The real drafter, its context pass made MS_PER_ROW ms per tap row slower, so its
    share of a round is known whatever this machine's speed."""

    def _context(self, taps, positions):
        time.sleep(MS_PER_ROW * taps.shape[0] / 1e3)
        return super()._context(taps, positions)


def test_a_first_drafts_prompt_context_is_not_priced_as_a_per_round_draft_cost():
    target = random_target(seed=5, vocab_size=VOCAB)
    drafter = SlowContext(random_drafter(target.config, num_layers=1, block_size=L + 1, seed=6), target)
    readings = Readings()
    engine = LLMEngine(target, drafter, spec=SpecConfig(method="cast", budget=3), cost=readings)
    prompt = np.random.default_rng(0).integers(0, VOCAB, size=150).tolist()
    seq = engine.add_request(Request(prompt, 6))
    while engine.active:
        engine.step()
    prompt_pass_ms = MS_PER_ROW * 150
    assert seq.timings.first_draft_ms >= prompt_pass_ms  # the first draft did pay for the prompt ...
    assert readings.draft and max(readings.draft) < prompt_pass_ms / 3  # ... but no reading carries it
    assert len(readings.draft) == sum(seq.drafted) > 0  # every drafted round is still read


def test_a_verify_reading_carries_the_commit_that_follows_it():
    """The width rule prices a round's width-dependent work: the verify pass and what follows it (the
    walk, the commit, the KV compaction). A KV compaction made COMMIT_MS slower shows in every reading."""
    commit_ms = 20.0
    target = random_target(seed=5, vocab_size=VOCAB)
    drafter = DrafterExecutor(random_drafter(target.config, num_layers=1, block_size=L + 1, seed=6), target)
    readings = Readings()
    engine = LLMEngine(target, drafter, spec=SpecConfig(method="cast", budget=3), cost=readings)
    real = engine.target.commit_many  # the engine's backend over the model

    def slow_commit(*args, **kwargs):
        time.sleep(commit_ms / 1e3)
        return real(*args, **kwargs)
    engine.target.commit_many = slow_commit
    seq = engine.add_request(Request(np.arange(1, 20).tolist(), 6))
    while engine.active:
        engine.step()
    assert len(readings.verify) == seq.num_rounds and min(readings.verify) >= commit_ms


def test_a_verify_reading_is_priced_at_the_width_the_pass_padded_every_request_to():
    """A round where one request packs 4 tokens and another 1 runs both padded to 4: its reading is 8
    tokens at batch 2, not the 5 packed (read by their mean, 13 + 1 + 1 + 1 at batch 4 priced bucket 4
    with the cost of a pass 14 tokens wide)."""
    target = random_target(seed=5, vocab_size=VOCAB)
    drafter = DrafterExecutor(random_drafter(target.config, num_layers=1, block_size=L + 1, seed=6), target)
    readings = Readings()
    engine = LLMEngine(target, drafter, spec=SpecConfig(method="cast", budget=3), cost=readings)
    prompt = np.arange(1, 20).tolist()
    engine.add_request(Request(prompt, 6, ignore_eos=True))  # cast, budget 3: packs 4 tokens
    engine.add_request(Request(prompt, 6, method="ar", ignore_eos=True))  # packs 1
    while engine.active:
        engine.step()
    both = [packed for packed, batch in readings.packed if batch == 2]
    assert 2 * 4 in both and set(both) <= {2 * 4, 2 * 1}  # 2 x 1: a last round, one token left (root alone)
