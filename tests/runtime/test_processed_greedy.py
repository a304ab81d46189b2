"""fp32 greedy on the embedded SmolLM2 target under per-request logit processing:
min_tokens, bad_words and a per-request EOS list. Chain, CAST:15 and auto emit exactly the
tokens of AR greedy under the same processing, which is the law a plain HF loop applying
the same bans would follow; and each committed token's logprob is AR's within 1e-4."""

import pytest
import torch

from cast_trtllm.spec_config import SpecConfig
from runtime.drafter import DEFAULT_DRAFTER, DrafterExecutor, load_drafter
from runtime.engine import LLMEngine, Request
from runtime.engine.build import width_source

PROMPT = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"  # greedy: "The answer is 4." + EOS
NEW = 24
PROFILE = "cast_trtllm/profiles/reference/h100-sxm__qwen3-4b__table5.json"
METHODS = [("chain", None), ("cast", 15), ("cast", "auto")]


@pytest.fixture(scope="module")
def engines(embedded):
    spec = SpecConfig(width_profile=PROFILE, width_rule="marginal", draft_gate=False)
    width, _ = width_source(spec, embedded.name, torch.float32, torch.device("cpu"), 1.0)
    drafter = DrafterExecutor(load_drafter(DEFAULT_DRAFTER, embedded.model.config), embedded.model)
    eos = embedded.eos_token_ids
    return (LLMEngine(embedded.model, None, eos_token_ids=eos, spec=SpecConfig(method="ar")),
            LLMEngine(embedded.model, drafter, eos_token_ids=eos, spec=spec, width=width))


@pytest.fixture(scope="module")
def case(embedded, engines):
    """(prompt ids, processing) where every ban bites: the plain answer ends at EOS before
    min_tokens, its 2nd token is banned, and a 2-token word of the processed answer is too."""
    ids = embedded.tokenizer(PROMPT).input_ids
    plain = engines[0].generate([Request(ids, NEW)])[0]
    assert plain.finish_reason == "eos" and len(plain.token_ids) < 12
    kw = dict(min_tokens=16, bad_words=((plain.token_ids[1],),))
    first = engines[0].generate([Request(ids, NEW, **kw)])[0].token_ids
    kw["bad_words"] += ((first[8], first[9]),)
    return ids, kw


def _hf_greedy(hf, ids, n, stop_ids, min_tokens, bad_words):
    """Independent reference: full-context HF forwards, the bans written out by hand."""
    out = []
    for i in range(n):
        with torch.no_grad():
            logits = hf(torch.tensor([ids + out])).logits[0, -1].clone()
        if i < min_tokens:
            logits[list(stop_ids)] = float("-inf")
        ctx = ids + out
        for w in bad_words:
            if tuple(ctx[len(ctx) - len(w) + 1:]) == w[:-1] or len(w) == 1:
                logits[w[-1]] = float("-inf")
        out.append(int(logits.argmax()))
        if out[-1] in stop_ids:
            break
    return out


def _occurs(word, seq):
    return any(tuple(seq[i:i + len(word)]) == word for i in range(len(seq) - len(word) + 1))


def test_ar_greedy_under_processing_is_the_law_a_plain_loop_with_the_same_bans_follows(embedded, embedded_hf,
                                                                                       engines, case):
    ids, kw = case
    out = engines[0].generate([Request(ids, NEW, **kw)])[0]
    eos = embedded.eos_token_ids
    assert out.token_ids == _hf_greedy(embedded_hf[0], ids, NEW, eos, kw["min_tokens"], kw["bad_words"])
    assert not any(t in eos for t in out.token_ids[:kw["min_tokens"]])
    assert not any(_occurs(w, ids + out.token_ids) for w in kw["bad_words"])


@pytest.mark.parametrize("method, budget", METHODS)
def test_greedy_chain_cast_and_auto_under_processing_equal_ar_with_its_logprobs(engines, case, method, budget):
    ids, kw = case
    ar = engines[0].generate([Request(ids, NEW, logprobs=3, **kw)])[0]
    out = engines[1].generate([Request(ids, NEW, method=method, budget=budget, logprobs=3, **kw)])[0]
    assert out.token_ids == ar.token_ids and out.finish_reason == ar.finish_reason
    assert max(out.accept_lengths) > 1  # drafted nodes were accepted through the processed rows
    assert max(abs(a - b) for a, b in zip(out.logprobs, ar.logprobs)) < 1e-4
    assert [[t for t, _ in top] for top in out.top_logprobs] == [[t for t, _ in top] for top in ar.top_logprobs]
    assert len(out.logprobs) == len(out.token_ids)


@pytest.mark.parametrize("method, budget", [("ar", None), ("cast", 15)])
def test_a_per_request_eos_list_ends_the_request_at_its_first_id(engines, case, method, budget):
    ids, kw = case
    plain = engines[0].generate([Request(ids, NEW)])[0].token_ids  # ends at the model's EOS
    full = engines[0].generate([Request(ids, NEW, **kw)])[0].token_ids
    engine = engines[0] if method == "ar" else engines[1]

    def run(**extra):
        return engine.generate([Request(ids, NEW, method=method, budget=budget, **extra)])[0]

    # eos_token_ids REPLACES the model's EOS ids (Triton end_id; () is end_id -1)
    none = run(eos_token_ids=())
    assert none.token_ids[:len(plain)] == plain and len(none.token_ids) == NEW and none.finish_reason == "length"
    end = run(eos_token_ids=(plain[3],))
    assert end.token_ids == plain[:plain.index(plain[3]) + 1] and end.finish_reason == "eos"
    # stop_token_ids ADD to them (OpenAI / vLLM) ...
    added = run(stop_token_ids=(plain[3],))
    assert added.token_ids == plain[:plain.index(plain[3]) + 1] and added.finish_reason == "eos"
    # ... and min_tokens bans them as it bans EOS
    early = run(stop_token_ids=(full[5],), **kw)
    assert early.token_ids[:5] == full[:5] and full[5] not in early.token_ids[:kw["min_tokens"]]
