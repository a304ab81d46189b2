"""At T = 1, CAST under min_tokens + bad_words + a stop token id commits tokens that follow
the autoregressive law AFTER the same processing (not the raw target's).

Set-up of `test_sampling_law` (tiny random target, horizon 3, top_k = 5, a drafter that
proposes the raw target's marginals plus noise, so it often proposes banned tokens and
the walk must reject them). The bans are chosen to bite: the first step's two most likely
tokens are banned (one as a stop id before min_tokens = 2, one as a bad word), and the
most likely pair of the processed law is a 2-token bad word. The exact processed law is
written out by hand; the empirical TV must stay within the Monte-Carlo floor.
"""

import numpy as np
import torch

from cast_trtllm.sampling import SamplingParams, target_probs
from cast_trtllm.spec_config import SpecConfig
from runtime.engine import LLMEngine, Request
from tests.law import assert_law
from tests.runtime.doubles import tiny_target
from tests.runtime.test_sampling_law import HORIZON, LAW, PROMPT, NoisyTargetDrafter, _tv

SAMPLES = 2000
MIN_TOKENS = 2


def _probs(hf, ctx, out_len, stop, bad):
    with torch.no_grad():
        logits = hf(torch.tensor(ctx)[None]).logits[0, -1:].clone()
    if stop is not None and out_len < MIN_TOKENS:
        logits[0, stop] = float("-inf")
    for w in bad:
        if len(w) == 1 or tuple(ctx[len(ctx) - len(w) + 1:]) == w[:-1]:
            logits[0, w[-1]] = float("-inf")
    return target_probs(logits, LAW)[0]


def _exact_law(hf, stop, bad):
    law = {}

    def walk(out, p):
        if len(out) == HORIZON or (out and out[-1] == stop):
            law[tuple(out)] = law.get(tuple(out), 0.0) + p
            return
        probs = _probs(hf, PROMPT + out, len(out), stop, bad)
        for t in torch.nonzero(probs).flatten().tolist():
            walk(out + [t], p * float(probs[t]))

    walk([], 1.0)
    return law


def test_cast_sampling_under_min_tokens_and_bad_words_follows_the_processed_autoregressive_law():
    hf, model = tiny_target()
    with torch.no_grad():
        top = torch.topk(hf(torch.tensor(PROMPT)[None]).logits[0, -1], 2).indices.tolist()
    stop, bad = top[0], [(top[1],)]
    first = _exact_law(hf, stop, bad)
    pair = max(first, key=first.get)[:2]  # the processed law's most likely first two tokens
    bad.append(pair)
    law = _exact_law(hf, stop, bad)
    assert not any(k[:2] == pair for k in law) and not any(stop in k[:MIN_TOKENS] for k in law)

    engine = LLMEngine(model, NoisyTargetDrafter(hf), spec=SpecConfig(rank_cap=2, budget=6))
    counts, accepted = {}, 0
    for seed in range(SAMPLES):
        req = Request(PROMPT, HORIZON, SamplingParams(1.0, top_k=5, seed=seed), stop_token_ids=(stop,),
                      min_tokens=MIN_TOKENS, bad_words=tuple(bad))
        out = engine.generate([req])[0]
        counts[tuple(out.token_ids)] = counts.get(tuple(out.token_ids), 0) + 1
        accepted += out.num_rounds == 1 and len(out.token_ids) > 1  # round 1 accepted a node
    keys = sorted(set(law) | set(counts))
    assert_law(np.array([counts.get(k, 0) for k in keys], float), np.array([law.get(k, 0.0) for k in keys]),
               "processed law")
    assert 0.1 * SAMPLES < accepted, accepted  # drafted nodes were accepted, not only AR steps
    assert _tv(law, counts, SAMPLES) < _tv(_exact_law(hf, None, []), counts, SAMPLES)  # not the raw law
