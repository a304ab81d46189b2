"""The one engine at B > 1: batched verify/draft parity, continuous batching, mixed methods
and token-for-token greedy equivalence with single-request AR."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from cast_trtllm.sampling import SamplingParams
from cast_trtllm.tree import build_tree
from cast_trtllm.spec_config import SpecConfig
from cast_trtllm.width import WidthPolicy
from runtime.drafter.executor import DrafterExecutor
from runtime.engine import LLMEngine, Request
from runtime.engine.trees import MeanBudget
from runtime.engine.backend import TorchTarget
from tests.runtime.doubles import prefilled

VOCAB, L = 64, 4  # the shared target's and drafter's (conftest.py)


def prompts(count: int, seed: int = 0) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    return [tuple(rng.integers(0, VOCAB, size=int(rng.integers(2, 24))).tolist()) for _ in range(count)]


@functools.lru_cache(maxsize=None)
def ar_greedy(target, prompt: tuple[int, ...], max_new: int) -> list[int]:
    return LLMEngine(target, None, spec=SpecConfig(method="ar")).generate([Request(prompt, max_new)])[0].token_ids


class NoisyOracle:
    """Drafter that knows each request's greedy continuation and proposes it with errors:
    the true token is ranked 1st, 2nd or off the top-K at random, giving mixed acceptance."""

    tap_layer_ids = (0,)  # committed rows are counted through the target's taps
    num_draft_positions = L
    mass_exponent = 1.0

    def __init__(self, continuations: list[list[int]], seed: int) -> None:
        self.pending = list(continuations)
        self.rng = np.random.default_rng(seed)

    def new_state(self, capacity: int) -> dict:
        return {"ref": self.pending.pop(0), "length": 0}

    def append_context(self, state: dict, taps) -> None:
        state["length"] += taps.shape[0]

    def draft(self, states, roots) -> torch.Tensor:
        logits = torch.from_numpy(self.rng.normal(0, 1, (len(states), L, VOCAB))).float()
        for b, state in enumerate(states):
            for j in range(L):
                pos = state["length"] + 1 + j
                if pos < len(state["ref"]):
                    logits[b, j, state["ref"][pos]] += [8.0, 2.5, -8.0][self.rng.choice(3, p=[0.6, 0.25, 0.15])]
        return logits


def _engine(target, drafter, width=None, device_trees=False, **spec):
    engine = LLMEngine(target, drafter, spec=SpecConfig(**spec), width=(lambda prefix: width) if width else None)
    engine.device_trees = device_trees  # True: trees built as tensors, as on CUDA (`runtime.device_trees`)
    return engine


@pytest.mark.parametrize("device_trees", [False, True])
def test_batched_greedy_mixed_methods_in_one_batch_equal_single_request_ar(target, device_trees):
    ps, max_new = prompts(8), 12
    refs = [ar_greedy(target, p, max_new) for p in ps]
    continuations = [list(p) + ar_greedy(target, p, 20) for p in ps]
    # shared-budget "auto" requests ride along with chain, AR and fixed-N requests
    methods = [("cast", "auto")] * 4 + [("chain", None), ("ar", None), ("cast", 3), ("cast", 12)]
    reqs = [Request(p, max_new, method=m, budget=n) for p, (m, n) in zip(ps, methods)]
    results = _engine(target, NoisyOracle(continuations, seed=1), MeanBudget(4), device_trees,
                      draft_gate=False).generate(reqs)
    assert [r.token_ids for r in results] == refs
    lengths = [a for r in results for a in r.accept_lengths]
    assert max(lengths) > 2 and min(lengths) == 1  # mixed acceptance
    assert [r.method for r in results] == [m for m, _ in methods]


@pytest.mark.parametrize("device_trees", [False, True])
def test_best_first_splits_the_shared_budget_unequally_and_caps_it(target, device_trees):
    ps = prompts(8, seed=5)
    continuations = [list(p) + ar_greedy(target, p, 20) for p in ps]
    engine = _engine(target, NoisyOracle(continuations, seed=2), MeanBudget(3), device_trees, max_request_width=7,
                     draft_gate=False)
    results = engine.generate([Request(p, 8) for p in ps])
    first = [r.budgets[0] for r in results]
    assert sum(first) == 3 * 8 and max(first) <= 7 and len(set(first)) > 1
    assert [r.token_ids for r in results] == [ar_greedy(target, p, 8) for p in ps]


def test_best_first_with_a_width_profile_uses_the_batched_stopping_rule(target):
    # steep verify cost: Proposition 3 keeps only high-mass nodes, fewer than the cap allows
    policy = WidthPolicy(buckets=(1, 4, 8), batch_sizes=(1, 8), bucket_ms=((10.0, 30.0, 60.0), (20.0, 60.0, 120.0)),
                         intercept_ms=(5.0, 10.0), slope_ms=(6.0, 12.0), fixed_ms=(1.0, 2.0), rule="marginal")
    ps = prompts(4, seed=6)
    continuations = [list(p) + ar_greedy(target, p, 20) for p in ps]
    engine = _engine(target, NoisyOracle(continuations, seed=3), policy, draft_gate=False)
    results = engine.generate([Request(p, 8) for p in ps])
    assert [r.token_ids for r in results] == [ar_greedy(target, p, 8) for p in ps]
    assert all(sum(r.budgets) < 7 * len(r.budgets) for r in results)


def test_batched_verify_logits_equal_single_request_verify(target):
    backend = TorchTarget(target, (0, 1))
    rng = np.random.default_rng(0)
    trees, packs, slots, singles = [], [], [], []
    for p in prompts(3, seed=7):
        ids = rng.integers(0, VOCAB, (L, 4))
        lp = np.sort(np.log(rng.dirichlet(np.ones(4), L)), axis=1)[:, ::-1]
        tree = build_tree(ids, lp, int(rng.integers(0, 9)))
        pack = np.concatenate([[p[-1]], tree.tokens]).astype(np.int64)
        slot = backend.new_sequence(64)
        backend.prefill(slot, torch.tensor(p[:-1] or p))
        singles.append(backend.verify([slot], [pack], [tree]))  # B = 1; a verify never commits
        trees.append(tree), packs.append(pack), slots.append(slot)
    logits, taps = backend.verify(slots, packs, trees)  # ONE pass over the three packs
    torch.testing.assert_close(logits, torch.cat([s[0] for s in singles]), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(taps, torch.cat([s[1] for s in singles]), rtol=1e-4, atol=1e-4)


def test_batched_draft_equals_one_drafter_call_per_request(target, drafter):
    batched = DrafterExecutor(drafter, target)
    states, singles, roots = [], [], []
    for p in prompts(3, seed=8):
        taps = prefilled(target, p, drafter.config.target_layer_ids)[3]
        single = batched.new_state(64)
        batched.append_context(single, taps)
        state = batched.new_state(64)
        batched.append_context(state, taps)
        states.append(state), singles.append(single), roots.append(p[0])
    out = batched.draft(states, roots)  # [B, L, V]
    want = torch.cat([batched.draft([s], [r]) for s, r in zip(singles, roots)])  # B = 1 each
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_continuous_batching_requests_join_and_leave_between_rounds(target, drafter):
    ps = prompts(6, seed=9)
    engine = _engine(target, DrafterExecutor(drafter, target), budget=3)
    limits = [3, 9, 5, 12, 1, 7]
    live = {}
    for i, (p, n) in enumerate(zip(ps, limits)):
        live[i] = engine.add_request(Request(p, n))
        engine.step()  # a new request joins every round while others are mid-generation
    while engine.active:
        engine.step()
    for i, (p, n) in enumerate(zip(ps, limits)):
        assert live[i].tokens == ar_greedy(target, p, n)
        assert live[i].finish_reason == "length"


def test_sampled_requests_keep_their_own_seed_and_match_single_request_runs(target, drafter):
    ps = prompts(4, seed=10)
    params = [SamplingParams(temperature=0.8, top_k=20, seed=s) for s in (1, 2, 3, 4)]
    draft = DrafterExecutor(drafter, target)
    batched = _engine(target, draft, method="chain").generate([Request(p, 10, sp) for p, sp in zip(ps, params)])
    for p, sp, got in zip(ps, params, batched):
        want = _engine(target, draft, method="chain").generate([Request(p, 10, sp)])[0]
        assert got.token_ids == want.token_ids
