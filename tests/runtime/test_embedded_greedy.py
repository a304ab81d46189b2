"""fp32 greedy on the embedded SmolLM2-135M target: chain and CAST emit exactly the AR
token ids, and the KV cache after a CAST run equals a fresh prefill.

The full matrix (8 prompts x 64 new tokens x chain + CAST 1/15/63, ~15 CPU-minutes on
a shared 2-core box) is `slow`; the default run covers 2 prompts x 32 tokens.
"""

import pytest

from cast_trtllm.spec_config import SpecConfig
from runtime.drafter import DEFAULT_DRAFTER, DrafterExecutor, load_drafter
from runtime.engine import LLMEngine, Request
from tests.runtime.doubles import ScriptedDrafter, fresh_kv

NEW_TOKENS = 64
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "1, 2, 3, 5, 8,",
    "Q: What is the boiling point of water?\nA:",
    "import numpy as np\n\n",
    "Translate to German: good morning",
    "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n",
]
METHODS = [("chain", None), ("cast", 1), ("cast", 15), ("cast", 63)]
_AR: dict[str, list[int]] = {}


def _ids(embedded, prompt):
    return embedded.tokenizer(prompt).input_ids


def _ar(embedded, prompt):
    if prompt not in _AR:
        engine = LLMEngine(embedded.model, None, spec=SpecConfig(method="ar"))
        _AR[prompt] = engine.generate([Request(_ids(embedded, prompt), NEW_TOKENS)])[0].token_ids
    return _AR[prompt]


@pytest.fixture(scope="module")
def trained_decoder(embedded):
    """The shipped trained head: real, mixed acceptance (accepted paths of 0..L tokens)."""
    drafter = DrafterExecutor(load_drafter(DEFAULT_DRAFTER, embedded.model.config), embedded.model)
    return LLMEngine(embedded.model, drafter, spec=SpecConfig(gate_probe_every=2))


def _generate(engine, ids, method, budget, new_tokens, **kw):
    seq = engine.add_request(Request(ids, new_tokens, method=method, budget=budget, **kw))
    while engine.active:
        engine.step()
    return seq, seq.result()


def _assert_kv_equals_fresh_prefill(embedded, target, tokens):
    n = target.length  # the engine's pool slot: its committed rows against a fresh prefill of its tokens
    for buf, ours, fresh in zip(("k", "v"), target.pool.committed(target), fresh_kv(embedded.model, tokens[:n])):
        diff = abs(ours - fresh).max()  # [n, layers, Hkv, d]
        assert diff <= 1e-4, (buf, diff)


def _check(embedded, decoder, prompt, method, budget, new_tokens):
    ids = _ids(embedded, prompt)
    seq, out = _generate(decoder, ids, method, budget, new_tokens)
    assert out.token_ids == _ar(embedded, prompt)[:new_tokens], (prompt, method, budget)
    return ids, seq, out


@pytest.mark.parametrize("method, budget", METHODS)
@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_greedy_chain_and_cast_equal_ar(embedded, trained_decoder, prompt, method, budget):
    ids, seq, out = _check(embedded, trained_decoder, prompt, method, budget, NEW_TOKENS // 2)
    if method == "cast" and budget >= 15:
        assert max(out.accept_lengths) > 1  # the check covers accepted paths, not only AR steps
    if method == "cast" and budget == 15:
        _assert_kv_equals_fresh_prefill(embedded, seq.target, ids + out.token_ids)


@pytest.mark.slow
@pytest.mark.parametrize("method, budget", METHODS)
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_chain_and_cast_equal_ar_on_8_prompts_x_64_tokens(embedded, trained_decoder, prompt, method, budget):
    _check(embedded, trained_decoder, prompt, method, budget, NEW_TOKENS)


@pytest.mark.parametrize("method, budget", [("chain", None), ("cast", 15)])
def test_greedy_with_long_accepted_paths_equals_ar_and_kv_equals_fresh_prefill(embedded, method, budget):
    prompt = PROMPTS[2]
    ids, ref = _ids(embedded, prompt), _ar(embedded, prompt)
    vocab = embedded.model.config.vocab_size
    drafter = ScriptedDrafter(len(ids), ref, vocab, block_size=16, tap_layer_ids=(15,))
    seq, out = _generate(LLMEngine(embedded.model, drafter), ids, method, budget, NEW_TOKENS)
    assert out.token_ids == ref
    assert out.mean_accept_length > 2  # multi-token rounds, incl. off-rank branches for CAST
    _assert_kv_equals_fresh_prefill(embedded, seq.target, ids + out.token_ids)


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_greedy_cast_with_the_draft_gate_equals_ar(embedded, trained_decoder, prompt):
    """probe_every=2 makes drafted and undrafted (AR) rounds alternate whatever the timings."""
    _, out = _generate(trained_decoder, _ids(embedded, prompt), "cast", 15, NEW_TOKENS // 2, draft_gate=True)
    assert out.token_ids == _ar(embedded, prompt)[:NEW_TOKENS // 2]
    assert 0 < sum(out.drafted) < out.num_rounds
