"""At T = 1, the tokens CAST commits follow the autoregressive sampling law.

Horizon: the first 3 new tokens of a fixed prompt on a tiny random target, with
top_k = 5 so the law has 125 outcomes and is computed exactly. The drafter proposes the
target's own marginals plus noise, and with K = 2 retained children per position many rounds accept a node AND many reject all (both
branches of the walk run). Monte-Carlo floor: the 99th percentile of the TV distance
between the exact law and N i.i.d. draws FROM that law (simulated below); the decoder's
empirical TV over N generations must not exceed it.
"""

import itertools

import numpy as np
import pytest
import torch

from cast_trtllm.sampling import SamplingParams, target_probs
from cast_trtllm.spec_config import SpecConfig
from runtime.engine import LLMEngine, Request

from tests.runtime.doubles import tiny_target

PROMPT = [5, 17, 33]
HORIZON = 3
SAMPLES = 2000
LAW = SamplingParams(temperature=1.0, top_k=5)


class NoisyTargetDrafter:
    """Proposes softmax(target logits + noise) along the target's greedy continuation."""

    num_draft_positions = 3
    tap_layer_ids = (0,)
    mass_exponent = 1.0

    def __init__(self, hf, unnameable: torch.Tensor | None = None):
        self.hf = hf
        self.unnameable = unnameable  # token ids with drafter mass 0 (a reduced draft vocabulary)
        self.memo = {}  # context -> proposals (deterministic, so cached)

    def new_state(self, capacity):
        return {"ids": [], "root": None}

    def append_context(self, state, taps):
        m = taps.shape[0]
        if state["root"] is None:
            state["ids"] = list(PROMPT)  # the prompt's own taps
        elif m == 1 and state["ids"] is not None:
            state["ids"].append(state["root"])
        else:
            state["ids"] = None  # accepted nodes: only happens after the horizon is complete

    def draft(self, states, roots):
        return torch.stack([self._one(s, r) for s, r in zip(states, roots)])  # [B, L, V]

    def _one(self, state, root):
        assert state["ids"] is not None, "drafted past the horizon"
        state["root"] = root
        ctx = state["ids"] + [root]
        if tuple(ctx) not in self.memo:
            self.memo[tuple(ctx)] = self._propose(ctx, root)
        return self.memo[tuple(ctx)]

    def _propose(self, ctx, root):
        gen = torch.Generator().manual_seed(len(ctx) * 997 + root)
        rows = []
        for _ in range(self.num_draft_positions):
            with torch.no_grad():
                logits = self.hf(torch.tensor(ctx)[None]).logits[0, -1]
            row = logits + 0.7 * torch.randn(logits.shape, generator=gen)
            if self.unnameable is not None:
                row[self.unnameable] = float("-inf")
            rows.append(row)
            ctx = ctx + [int(logits.argmax())]
        return torch.stack(rows)


def _exact_law(hf):
    def probs(ctx):
        with torch.no_grad():
            return target_probs(hf(torch.tensor(ctx)[None]).logits[0, -1:], LAW)[0]

    law = {}
    p1 = probs(PROMPT)
    for a in torch.nonzero(p1).flatten().tolist():
        p2 = probs(PROMPT + [a])
        for b in torch.nonzero(p2).flatten().tolist():
            p3 = probs(PROMPT + [a, b])
            for c in torch.nonzero(p3).flatten().tolist():
                law[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return law


def _tv(law, counts, n):
    keys = set(law) | set(counts)
    return 0.5 * sum(abs(law.get(k, 0.0) - counts.get(k, 0) / n) for k in keys)


@pytest.mark.parametrize("reduced_vocab", [False, True], ids=["full-vocab", "reduced-vocab"])
def test_cast_sampling_matches_the_autoregressive_law_within_the_monte_carlo_floor(reduced_vocab):
    hf, model = tiny_target()
    law = _exact_law(hf)
    assert len(law) == 125
    # reduced: the drafter cannot name every other token of the target's top-5 at the first step
    top = torch.topk(hf(torch.tensor(PROMPT)[None]).logits[0, -1], 5).indices
    drafter = NoisyTargetDrafter(hf, top[1::2] if reduced_vocab else None)
    engine = LLMEngine(model, drafter, spec=SpecConfig(rank_cap=2, budget=6))
    counts, accepted = {}, 0
    for seed in range(SAMPLES):
        out = engine.generate([Request(PROMPT, HORIZON, SamplingParams(1.0, top_k=5, seed=seed))])[0]
        key = tuple(out.token_ids)
        counts[key] = counts.get(key, 0) + 1
        accepted += out.num_rounds == 1  # round 1 accepted a node (else a 2nd round ran)
    tv = _tv(law, counts, SAMPLES)

    rng = np.random.default_rng(0)
    keys, p = list(law), np.array(list(law.values()))
    null = [
        _tv(law, dict(zip(keys, rng.multinomial(SAMPLES, p / p.sum()))), SAMPLES) for _ in range(400)
    ]
    floor = float(np.quantile(null, 0.99))
    assert 0.2 * SAMPLES < accepted < 0.95 * SAMPLES, accepted  # both walk branches exercised
    print(f"TV {tv:.4f}, floor {floor:.4f}, accepted {accepted}/{SAMPLES}")
    assert tv <= floor, f"TV {tv:.4f} above the Monte-Carlo floor {floor:.4f} (N={SAMPLES})"
