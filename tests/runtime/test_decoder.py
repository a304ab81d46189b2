"""The shared decoding loop on a tiny random target: losslessness, commit, stops, errors."""

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from cast_trtllm.sampling import SamplingParams
from runtime.decoder import DecodeConfig, Decoder
from runtime.drafter import DrafterExecutor, random_drafter
from runtime.target import TargetExecutor

from tests.runtime.doubles import CharTokenizer, ScriptedDrafter, tiny_target

PROMPTS = [[1, 2, 3], [40, 41, 7, 7, 7, 2], [9], [63, 0, 12, 33, 8, 5, 5, 19, 21]]


@pytest.fixture(scope="module")
def tiny():
    return tiny_target()[1]


def _ar(model, prompt, n, eos=()):
    dec = Decoder(TargetExecutor(model), None, None, eos)
    return dec.generate(prompt, DecodeConfig(method="ar", max_new_tokens=n)).token_ids


def _decoder(model, drafter_source, tokenizer=None, eos=()):
    return Decoder(TargetExecutor(model, drafter_source.tap_layer_ids), drafter_source, tokenizer, eos)


@pytest.mark.parametrize("method, budget", [("chain", 1), ("cast", 1), ("cast", 15), ("cast", 63)])
def test_greedy_random_drafter_reproduces_ar(tiny, method, budget):
    drafter = DrafterExecutor(random_drafter(tiny.config, block_size=8, seed=3), tiny)
    dec = _decoder(tiny, drafter)
    for prompt in PROMPTS:
        out = dec.generate(prompt, DecodeConfig(method=method, budget=budget, max_new_tokens=40))
        assert out.token_ids == _ar(tiny, prompt, 40)
        assert sum(out.accept_lengths) + 1 == len(out.token_ids)


@pytest.mark.parametrize("method, budget", [("chain", 1), ("cast", 4), ("cast", 15), ("cast", 63)])
def test_greedy_with_long_accepted_paths_reproduces_ar_and_commits_kv(tiny, method, budget):
    for prompt in PROMPTS:
        ref = _ar(tiny, prompt, 48)
        dec = _decoder(tiny, ScriptedDrafter(len(prompt), ref, vocab=64))
        out = dec.generate(prompt, DecodeConfig(method=method, budget=budget, max_new_tokens=48))
        assert out.token_ids == ref
        assert max(out.accept_lengths) >= 3  # multi-token rounds really happened
        # the KV cache equals a fresh prefill of the tokens it covers
        n = dec.target.prefix_len
        fresh = TargetExecutor(tiny)
        fresh.reset(128)
        fresh.prefill(torch.tensor(prompt + out.token_ids)[:n])
        for buf in ("k", "v"):
            diff = (getattr(dec.target.cache, buf)[:, :, :n] - getattr(fresh.cache, buf)[:, :, :n]).abs().max()
            assert diff.item() <= 1e-4


def test_tree_commits_more_than_chain_when_the_truth_is_off_rank(tiny):
    prompt = PROMPTS[1]
    ref = _ar(tiny, prompt, 48)
    chain = _decoder(tiny, ScriptedDrafter(len(prompt), ref, 64)).generate(prompt, DecodeConfig("chain", max_new_tokens=48))
    tree = _decoder(tiny, ScriptedDrafter(len(prompt), ref, 64)).generate(prompt, DecodeConfig("cast", 31, max_new_tokens=48))
    assert tree.mean_accept_length > chain.mean_accept_length
    assert tree.num_rounds < chain.num_rounds


def _scripted_run(tiny, prompt, ref, n, **kw):
    tokenizer = kw.pop("tokenizer", CharTokenizer())
    dec = _decoder(tiny, ScriptedDrafter(len(prompt), ref, 64, ranks=(0,)), tokenizer, kw.pop("eos", ()))
    return dec, dec.generate(prompt, DecodeConfig("cast", 15, max_new_tokens=n, **kw))


def test_eos_inside_an_accepted_path_truncates_there(tiny):
    prompt = PROMPTS[0]
    ref = _ar(tiny, prompt, 40)
    k = 10  # the scripted drafter proposes ref exactly, so ref[k] sits inside a long accepted path
    eos = ref[k]
    first = ref.index(eos)
    dec, out = _scripted_run(tiny, prompt, ref, 40, eos=(eos,))
    assert out.finish_reason == "eos"
    assert out.token_ids == ref[: first + 1]
    assert dec.target.prefix_len == len(prompt) + first + 1  # the EOS was an accepted node, not a root
    assert out.accept_lengths[-1] < 7  # truncated inside a block of 7 proposals


def test_stop_string_inside_an_accepted_path_truncates_there(tiny):
    prompt = PROMPTS[0]
    ref = _ar(tiny, prompt, 40)
    text = CharTokenizer().decode(ref)
    stop = text[9:12]
    end = text.index(stop) + len(stop)  # characters = tokens for CharTokenizer
    dec, out = _scripted_run(tiny, prompt, ref, 40, stop_strings=(stop,))
    assert out.finish_reason == "stop"
    assert out.token_ids == ref[:end] and out.text.endswith(stop) and out.text.count(stop) == 1


def test_max_new_tokens_inside_an_accepted_path_truncates_there(tiny):
    prompt = PROMPTS[0]
    ref = _ar(tiny, prompt, 40)
    for n in (1, 2, 5, 13):
        _, out = _scripted_run(tiny, prompt, ref, n)
        assert out.token_ids == ref[:n] and out.finish_reason == "length"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"method": "beam"}, "method must be one of"),
        ({"budget": 0}, "budget must be >= 1"),
        ({"max_new_tokens": 0}, "max_new_tokens must be >= 1"),
        ({"rank_cap": 0}, "rank_cap must be >= 1"),
    ],
)
def test_bad_decode_config_is_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DecodeConfig(**kwargs)


def test_bad_prompts_and_missing_drafter_are_rejected(tiny):
    dec = Decoder(TargetExecutor(tiny), None)
    with pytest.raises(ValueError, match="prompt is empty"):
        dec.generate([], DecodeConfig("ar"))
    with pytest.raises(ValueError, match="context window holds 256"):
        dec.generate([1] * 256, DecodeConfig("ar"))
    with pytest.raises(ValueError, match="needs a drafter"):
        dec.generate([1], DecodeConfig("chain"))


def test_generation_near_the_context_window_stops_with_length(tiny):
    out = Decoder(TargetExecutor(tiny), None).generate([1] * 250, DecodeConfig("ar", max_new_tokens=50))
    assert len(out.token_ids) == 6 and out.finish_reason == "length"


@dataclass
class _Choice:
    budget: int


class _CyclingPolicy:
    """Any object with max_budget, rank_cap, mass_exponent and choose(masses) -> .budget works."""

    max_budget, rank_cap, mass_exponent = 20, 4, 1.0

    def __init__(self):
        self.calls = 0

    def choose(self, masses_desc):
        assert np.all(np.diff(masses_desc) <= 1e-12) and len(masses_desc) <= self.max_budget
        self.calls += 1
        return _Choice([0, 3, 20][self.calls % 3])


def test_width_policy_sets_each_rounds_budget(tiny):
    drafter = DrafterExecutor(random_drafter(tiny.config, block_size=8, seed=3), tiny)
    policy = _CyclingPolicy()
    out = _decoder(tiny, drafter).generate(PROMPTS[1], DecodeConfig("cast", width_policy=policy, max_new_tokens=12))
    assert out.token_ids == _ar(tiny, PROMPTS[1], 12)
    assert out.budgets[:3] == [3, 20, 0] and policy.calls == out.num_rounds


def test_sampling_is_reproducible_from_the_seed(tiny):
    drafter = DrafterExecutor(random_drafter(tiny.config, block_size=8, seed=3), tiny)
    dec = _decoder(tiny, drafter)
    cfg = DecodeConfig("cast", 15, max_new_tokens=20, sampling=SamplingParams(temperature=1.0, seed=7))
    a, b = dec.generate([1, 2], cfg), dec.generate([1, 2], cfg)
    assert a.token_ids == b.token_ids
    c = dec.generate([1, 2], DecodeConfig("cast", 15, max_new_tokens=20, sampling=SamplingParams(1.0, seed=8)))
    assert c.token_ids != a.token_ids


def test_result_reports_decode_only_timing(tiny):
    drafter = DrafterExecutor(random_drafter(tiny.config, block_size=8, seed=3), tiny)
    out = _decoder(tiny, drafter).generate([1, 2, 3], DecodeConfig("chain", max_new_tokens=10))
    t = out.timings
    assert t.decode_ms > 0 and t.first_draft_ms > 0 and t.ttft_ms > 0
    assert abs(t.draft_ms + t.verify_ms + t.overhead_ms - t.decode_ms) < 0.05 * t.decode_ms + 1.0
    d = out.to_dict()
    for key in ("method", "text", "token_ids", "num_rounds", "accept_lengths", "mean_accept_length",
                "decode_ms_per_token"):
        assert key in d
    assert d["decode_ms_per_token"] == pytest.approx(t.decode_ms / len(out.token_ids))


def test_bf16_target_and_drafter_run_the_loop_and_keep_rope_in_fp32():
    _, model = tiny_target()
    model = model.to(torch.bfloat16)
    assert model.rotary.inv_freq.dtype == torch.float32
    drafter = DrafterExecutor(random_drafter(model.config, block_size=8, seed=3), model)
    assert drafter.drafter.fc.weight.dtype == torch.bfloat16
    out = _decoder(model, drafter).generate([1, 2, 3], DecodeConfig("cast", 15, max_new_tokens=12))
    assert len(out.token_ids) == 12


@pytest.mark.parametrize("policy_budget", [None, 15])
def test_draft_gate_mixes_ar_and_drafted_rounds_and_stays_lossless(tiny, policy_budget):
    """probe_every=2 forces both arms to run whatever the timings say; the drafter's
    feature cache is caught up after undrafted rounds, so later drafts still see x."""
    drafter = DrafterExecutor(random_drafter(tiny.config, block_size=8, seed=3), tiny)
    dec = _decoder(tiny, drafter)
    policy = _CyclingPolicy() if policy_budget is None else None
    for prompt in PROMPTS:
        cfg = DecodeConfig("cast", policy_budget or 15, width_policy=policy, max_new_tokens=40,
                           draft_gate=True, gate_probe_every=2)
        out = dec.generate(prompt, cfg)
        assert out.token_ids == _ar(tiny, prompt, 40)
        assert len(out.drafted) == out.num_rounds and 0 < sum(out.drafted) < out.num_rounds
        assert all(n == 0 for n, d in zip(out.budgets, out.drafted) if not d)  # undrafted = AR round
        committed = len(prompt) + len(out.token_ids) - 1  # all but the last token were run
        assert drafter.context_len in range(committed - 8, committed + 1)


def test_draft_gate_catches_the_drafter_up_so_a_scripted_drafter_stays_on_script(tiny):
    ref = _ar(tiny, PROMPTS[3], 48)
    gated = _decoder(tiny, ScriptedDrafter(len(PROMPTS[3]), ref, vocab=64))
    out = gated.generate(PROMPTS[3], DecodeConfig("cast", 4, max_new_tokens=48, draft_gate=True, gate_probe_every=2))
    assert out.token_ids == ref and max(out.accept_lengths) >= 3 and not all(out.drafted)


def test_draft_gate_needs_cast():
    with pytest.raises(ValueError, match="draft_gate"):
        DecodeConfig("chain", draft_gate=True)
