"""fp32 greedy on the embedded SmolLM2 target under occurrence penalties (and min_p, a no-op
at T = 0): AR follows the law a plain HF loop applying the penalties by hand follows, and
chain and CAST:15 emit exactly AR's tokens (the penalties run on every verified row)."""

import pytest
import torch

from cast_trtllm.penalties import Penalties
from cast_trtllm.spec_config import SpecConfig
from runtime.drafter import DEFAULT_DRAFTER, DrafterExecutor, load_drafter
from runtime.engine import LLMEngine, Request

PROMPT = "<|im_start|>user\nList three colors, then list them again.<|im_end|>\n<|im_start|>assistant\n"
NEW = 20
PEN = Penalties(repetition=1.3, presence=0.4, frequency=0.3, min_p=0.2)


@pytest.fixture(scope="module")
def engines(embedded):
    drafter = DrafterExecutor(load_drafter(DEFAULT_DRAFTER, embedded.model.config), embedded.model)
    eos = embedded.eos_token_ids
    return (LLMEngine(embedded.model, None, eos_token_ids=eos, spec=SpecConfig(method="ar")),
            LLMEngine(embedded.model, drafter, eos_token_ids=eos, spec=SpecConfig(budget=15, draft_gate=False)))


def _hf_greedy(hf, ids, n, stop_ids):
    out = []
    for _ in range(n):
        with torch.no_grad():
            z = hf(torch.tensor([ids + out])).logits[0, -1].clone()
        for x in set(ids + out):
            c = (ids + out).count(x)
            z[x] = z[x] / PEN.repetition if z[x] > 0 else z[x] * PEN.repetition
            z[x] -= PEN.presence + PEN.frequency * c
        out.append(int(z.argmax()))
        if out[-1] in stop_ids:
            break
    return out


@pytest.fixture(scope="module")
def ar(embedded, engines):
    ids = embedded.tokenizer(PROMPT).input_ids
    return ids, engines[0].generate([Request(ids, NEW, penalties=PEN)])[0]


def test_ar_greedy_under_penalties_is_a_plain_loop_penalizing_by_hand(embedded, embedded_hf, ar, engines):
    ids, out = ar
    assert out.token_ids == _hf_greedy(embedded_hf[0], ids, NEW, embedded.eos_token_ids)
    plain = engines[0].generate([Request(ids, NEW)])[0]
    assert plain.token_ids != out.token_ids  # the penalties bite on this prompt


@pytest.mark.parametrize("method, budget", [("chain", None), ("cast", 15)])
def test_greedy_chain_and_cast_under_penalties_equal_ar(ar, engines, method, budget):
    ids, want = ar
    out = engines[1].generate([Request(ids, NEW, method=method, budget=budget, penalties=PEN)])[0]
    assert out.token_ids == want.token_ids and out.finish_reason == want.finish_reason
    assert sum(out.drafted) > 0
