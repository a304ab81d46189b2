"""At T = 1, CAST under repetition / presence / frequency penalties and min_p commits tokens
that follow the autoregressive law AFTER the same transforms (set-up of
`test_processed_sampling_law`: tiny random target, horizon 3, top_k = 5, a noisy drafter);
the exact penalized law is written out by hand."""

import math

import numpy as np
import torch

from cast_trtllm.penalties import Penalties
from cast_trtllm.sampling import SamplingParams, target_probs
from cast_trtllm.spec_config import SpecConfig
from runtime.engine import LLMEngine, Request
from tests.law import assert_law
from tests.runtime.doubles import tiny_target
from tests.runtime.test_sampling_law import HORIZON, LAW, PROMPT, NoisyTargetDrafter, _tv

SAMPLES = 2000
PEN = Penalties(repetition=3.0, presence=1.0, frequency=1.0, min_p=0.05)


def _probs(hf, ctx):
    with torch.no_grad():
        z = hf(torch.tensor(ctx)[None]).logits[0, -1].clone()
    for x in set(ctx):
        z[x] = (z[x] / PEN.repetition if z[x] > 0 else z[x] * PEN.repetition) - PEN.presence - PEN.frequency * ctx.count(x)
    z[z < z.max() + math.log(PEN.min_p)] = float("-inf")  # min_p at T = 1
    return target_probs(z[None], LAW)[0]


def _exact_law(hf, penalized=True):
    law = {}

    def walk(out, p):
        if len(out) == HORIZON:
            law[tuple(out)] = law.get(tuple(out), 0.0) + p
            return
        if penalized:
            probs = _probs(hf, PROMPT + out)
        else:
            with torch.no_grad():
                probs = target_probs(hf(torch.tensor(PROMPT + out)[None]).logits[0, -1:], LAW)[0]
        for t in torch.nonzero(probs).flatten().tolist():
            walk(out + [t], p * float(probs[t]))

    walk([], 1.0)
    return law


def test_cast_sampling_under_penalties_and_min_p_follows_the_penalized_autoregressive_law():
    hf, model = tiny_target()
    law = _exact_law(hf)
    engine = LLMEngine(model, NoisyTargetDrafter(hf), spec=SpecConfig(rank_cap=2, budget=6))
    counts, accepted = {}, 0
    for seed in range(SAMPLES):
        req = Request(PROMPT, HORIZON, SamplingParams(1.0, top_k=5, seed=seed), penalties=PEN)
        out = engine.generate([req])[0]
        counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1
        accepted += out.num_rounds == 1 and len(out.token_ids) > 1  # round 1 accepted a node
    keys = sorted(set(law) | set(counts))
    assert_law(np.array([counts.get(k, 0) for k in keys], float), np.array([law.get(k, 0.0) for k in keys]),
               "penalized law")
    assert 0.1 * SAMPLES < accepted, accepted  # drafted nodes were accepted, not only AR steps
    assert _tv(law, counts, SAMPLES) < _tv(_exact_law(hf, penalized=False), counts, SAMPLES)  # not the raw law
