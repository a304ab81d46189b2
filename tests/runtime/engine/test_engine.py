"""The one engine at B = 1 on a tiny random target: losslessness, commit, stops, errors,
width rules, the draft gate and App. D timings."""

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from cast_trtllm.sampling import SamplingParams
from cast_trtllm.spec_config import SpecConfig
from runtime.drafter import DrafterExecutor, random_drafter
from runtime.engine import LLMEngine, Request
from runtime.engine.trees import MeanBudget
from tests.runtime.doubles import CharTokenizer, ScriptedDrafter, fresh_kv, tiny_target

PROMPTS = [[1, 2, 3], [40, 41, 7, 7, 7, 2], [9], [63, 0, 12, 33, 8, 5, 5, 19, 21]]


@pytest.fixture(scope="module")
def tiny():
    return tiny_target()[1]


def _ar(model, prompt, n, eos=()):
    engine = LLMEngine(model, None, None, eos, SpecConfig(method="ar"))
    return engine.generate([Request(prompt, n)])[0].token_ids


def _run(model, drafter, prompt, tokenizer=None, eos=(), width=None, **kw):
    engine = LLMEngine(model, drafter, tokenizer, eos, SpecConfig(), width)
    seq = engine.add_request(Request(prompt, **kw))
    while engine.active:
        engine.step()
    return seq, seq.result(tokenizer)


@pytest.mark.parametrize("method, budget", [("chain", None), ("cast", 1), ("cast", 15), ("cast", 56)])
def test_greedy_random_drafter_reproduces_ar(tiny, method, budget):
    drafter = DrafterExecutor(random_drafter(tiny.config, block_size=8, seed=3), tiny)
    for prompt in PROMPTS:
        _, out = _run(tiny, drafter, prompt, method=method, budget=budget, max_new_tokens=40)
        assert out.token_ids == _ar(tiny, prompt, 40)
        assert sum(out.accept_lengths) + 1 == len(out.token_ids)


@pytest.mark.parametrize("method, budget", [("chain", None), ("cast", 4), ("cast", 15), ("cast", 56)])
def test_greedy_with_long_accepted_paths_reproduces_ar_and_commits_kv(tiny, method, budget):
    for prompt in PROMPTS:
        ref = _ar(tiny, prompt, 48)
        seq, out = _run(tiny, ScriptedDrafter(len(prompt), ref, vocab=64), prompt, method=method, budget=budget,
                        max_new_tokens=48)
        assert out.token_ids == ref
        assert max(out.accept_lengths) >= 3  # multi-token rounds really happened
        n = seq.target.length  # the KV cache equals a fresh prefill of the tokens it covers
        for ours, theirs in zip(seq.target.pool.committed(seq.target), fresh_kv(tiny, (prompt + out.token_ids)[:n])):
            assert abs(ours - theirs).max() <= 1e-4  # [n, layers, Hkv, d]


def test_tree_commits_more_than_chain_when_the_truth_is_off_rank(tiny):
    prompt = PROMPTS[1]
    ref = _ar(tiny, prompt, 48)
    _, chain = _run(tiny, ScriptedDrafter(len(prompt), ref, 64), prompt, method="chain", max_new_tokens=48)
    _, tree = _run(tiny, ScriptedDrafter(len(prompt), ref, 64), prompt, method="cast", budget=31, max_new_tokens=48)
    assert tree.mean_accept_length > chain.mean_accept_length
    assert tree.num_rounds < chain.num_rounds


def _scripted_run(tiny, prompt, ref, n, eos=(), **kw):
    drafter = ScriptedDrafter(len(prompt), ref, 64, ranks=(0,))
    return _run(tiny, drafter, prompt, CharTokenizer(), eos, method="cast", budget=15, max_new_tokens=n, **kw)


def test_eos_inside_an_accepted_path_truncates_there(tiny):
    prompt = PROMPTS[0]
    ref = _ar(tiny, prompt, 40)
    eos = ref[10]  # the scripted drafter proposes ref exactly, so ref[10] sits inside a long accepted path
    first = ref.index(eos)
    seq, out = _scripted_run(tiny, prompt, ref, 40, eos=(eos,))
    assert out.finish_reason == "eos"
    assert out.token_ids == ref[: first + 1]
    assert seq.target.length == len(prompt) + first + 1  # the EOS was an accepted node, not a root
    assert out.accept_lengths[-1] < 7  # truncated inside a block of 7 proposals


def test_ignore_eos_runs_past_the_eos_token(tiny):
    prompt = PROMPTS[0]
    ref = _ar(tiny, prompt, 40)
    _, out = _scripted_run(tiny, prompt, ref, 40, eos=(ref[10],), ignore_eos=True)
    assert out.token_ids == ref and out.finish_reason == "length"


def test_stop_string_inside_an_accepted_path_truncates_there(tiny):
    prompt = PROMPTS[0]
    ref = _ar(tiny, prompt, 40)
    text = CharTokenizer().decode(ref)
    stop = text[9:12]
    end = text.index(stop) + len(stop)  # characters = tokens for CharTokenizer
    _, out = _scripted_run(tiny, prompt, ref, 40, stop_strings=(stop,))
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
        ({"budget": -1}, "budget must be 'auto' or an integer >= 0"),
        ({"budget": "wide"}, "budget must be 'auto' or an integer >= 0"),
        ({"max_new_tokens": 0}, "max_new_tokens must be >= 1"),
        ({"prompt_ids": ()}, "prompt is empty"),
        ({"stop_strings": ("",)}, "stop strings must be non-empty"),
    ],
)
def test_bad_requests_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Request(**{"prompt_ids": (1,), **kwargs})


def test_bad_prompts_missing_drafter_and_oversized_budgets_are_rejected(tiny):
    engine = LLMEngine(tiny, None, spec=SpecConfig(method="ar"))
    with pytest.raises(ValueError, match="context window holds 256"):
        engine.add_request(Request([1] * 256))
    with pytest.raises(ValueError, match="needs a drafter"):
        engine.add_request(Request([1], method="chain"))
    drafter = DrafterExecutor(random_drafter(tiny.config, block_size=8, seed=3), tiny)
    engine = LLMEngine(tiny, drafter)
    with pytest.raises(ValueError, match=r"budget 100000 exceeds the 56 nodes the drafter can offer \(L = 7"):
        engine.add_request(Request([1], budget=100000))
    with pytest.raises(ValueError, match="exceeds the 56 nodes"):
        LLMEngine(tiny, drafter, spec=SpecConfig(budget=57))
    with pytest.raises(ValueError, match="needs a width rule"):
        engine.add_request(Request([1], budget="auto"))
    assert engine.active == []


def test_generation_near_the_context_window_stops_with_length(tiny):
    engine = LLMEngine(tiny, None, spec=SpecConfig(method="ar"))
    out = engine.generate([Request([1] * 250, 50)])[0]
    assert len(out.token_ids) == 6 and out.finish_reason == "length"


@dataclass
class _Choice:
    budget: int


class _CyclingRule:
    """Any object with max_budget, mass_exponent and choose(masses, batch, drafting) -> .budget works."""

    max_budget, mass_exponent = 20, 1.0

    def __init__(self):
        self.calls = 0

    def choose(self, masses_desc, batch=1, drafting=None):
        assert np.all(np.diff(masses_desc) <= 1e-12) and len(masses_desc) <= self.max_budget
        self.calls += 1
        return _Choice([0, 3, 20][self.calls % 3])


def test_width_rule_sets_each_rounds_budget(tiny):
    drafter = DrafterExecutor(random_drafter(tiny.config, block_size=8, seed=3), tiny)
    rule = _CyclingRule()
    _, out = _run(tiny, drafter, PROMPTS[1], width=lambda prefix: rule, budget="auto", draft_gate=False,
                  max_new_tokens=12)
    assert out.token_ids == _ar(tiny, PROMPTS[1], 12)
    assert out.budgets[:3] == [3, 20, 0] and rule.calls == sum(out.drafted)
    assert out.num_rounds - sum(out.drafted) <= 1  # all but a last round with one token left (`Sequence.room`)


def test_sampling_is_reproducible_from_the_seed(tiny):
    drafter = DrafterExecutor(random_drafter(tiny.config, block_size=8, seed=3), tiny)

    def sample(seed):
        return _run(tiny, drafter, [1, 2], budget=15, max_new_tokens=20,
                    sampling=SamplingParams(temperature=1.0, seed=seed))[1].token_ids

    assert sample(7) == sample(7) and sample(8) != sample(7)


def test_result_reports_decode_only_timing(tiny):
    drafter = DrafterExecutor(random_drafter(tiny.config, block_size=8, seed=3), tiny)
    _, out = _run(tiny, drafter, [1, 2, 3], method="chain", max_new_tokens=10)
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
    _, out = _run(model, drafter, [1, 2, 3], budget=15, max_new_tokens=12)
    assert len(out.token_ids) == 12


@pytest.mark.parametrize("auto", [True, False])
def test_draft_gate_mixes_ar_and_drafted_rounds_and_stays_lossless(tiny, auto):
    """probe_every=2 forces both arms to run whatever the timings say; the drafter's
    feature cache is caught up after undrafted rounds, so later drafts still see x."""
    drafter = DrafterExecutor(random_drafter(tiny.config, block_size=8, seed=3), tiny)
    rule = _CyclingRule()
    engine = LLMEngine(tiny, drafter, spec=SpecConfig(gate_probe_every=2), width=lambda prefix: rule)
    for prompt in PROMPTS:
        seq = engine.add_request(Request(prompt, 40, budget="auto" if auto else 15, draft_gate=True))
        while engine.active:
            engine.step()
        out = seq.result()
        assert out.token_ids == _ar(tiny, prompt, 40)
        assert len(out.drafted) == out.num_rounds and 0 < sum(out.drafted) < out.num_rounds
        assert all(n == 0 for n, d in zip(out.budgets, out.drafted) if not d)  # undrafted = AR round
        last = max(r for r, d in enumerate(out.drafted) if d)  # the gate's tries back off: the last draft may be early
        assert seq.draft_state.length == len(prompt) + sum(out.accept_lengths[:last])  # every row committed before it


def test_draft_gate_catches_the_drafter_up_so_a_scripted_drafter_stays_on_script(tiny):
    ref = _ar(tiny, PROMPTS[3], 48)
    engine = LLMEngine(tiny, ScriptedDrafter(len(PROMPTS[3]), ref, vocab=64), spec=SpecConfig(gate_probe_every=2))
    out = engine.generate([Request(PROMPTS[3], 48, budget=4, draft_gate=True)])[0]
    assert out.token_ids == ref and max(out.accept_lengths) >= 3 and not all(out.drafted)


def test_max_draft_len_shortens_the_chain(tiny):
    drafter = DrafterExecutor(random_drafter(tiny.config, block_size=8, seed=3), tiny)
    engine = LLMEngine(tiny, drafter, spec=SpecConfig(method="chain", max_draft_len=3))
    out = engine.generate([Request(PROMPTS[1], 20)])[0]
    assert out.token_ids == _ar(tiny, PROMPTS[1], 20)
    room = 20 - 1 - np.cumsum([0] + out.accept_lengths[:-1])  # tokens each round may still emit (1: the prefill's)
    assert out.budgets == np.minimum(3, room - 1).tolist()  # no node deeper than the request can commit
    assert out.budgets.count(3) >= 3


def test_no_node_is_drafted_deeper_than_max_new_tokens_can_commit(tiny):
    """A round commits at most the tokens a request may still emit, so a tree never reaches deeper
    (`trees.cap_depth`) and a request with one token left does not draft: output unchanged."""
    class Depths(LLMEngine):
        def _commit(self, seq, tree, acc, logits, draft):
            self.depths.append(int(tree.depth.max(initial=0)))
            return super()._commit(seq, tree, acc, logits, draft)

    for method, budget in (("cast", 15), ("chain", None), ("cast", "auto")):
        for n in (2, 3, 7):
            ref = _ar(tiny, PROMPTS[0], n)
            engine = Depths(tiny, ScriptedDrafter(len(PROMPTS[0]), ref, vocab=64), spec=SpecConfig(),
                            width=lambda prefix: MeanBudget(15))
            engine.depths = []
            out = engine.generate([Request(PROMPTS[0], n, method=method, budget=budget, draft_gate=False)])[0]
            assert out.token_ids == ref
            room = n - 1 - np.cumsum([0] + out.accept_lengths[:-1])
            assert engine.depths == np.minimum(room - 1, 7).tolist()  # the script is accepted to the cap
            assert out.drafted == [r > 1 for r in room]


def test_a_cold_engine_under_load_sends_one_scout_and_the_others_inherit_its_masses(tiny):
    """Four gated auto requests join a fresh engine at once: the first round drafts for the
    oldest only (drafting all of them to learn what one can tell costs the whole batch);
    then every other request holds the scout's masses, and the outputs stay AR's."""
    drafter = DrafterExecutor(random_drafter(tiny.config, block_size=8, seed=3), tiny)
    engine = LLMEngine(tiny, drafter, spec=SpecConfig(gate_probe_every=2), width=lambda prefix: MeanBudget(4))
    seqs = [engine.add_request(Request(p, 24, budget="auto", draft_gate=True)) for p in PROMPTS[:4]]
    while any(not s.drafted for s in seqs):  # until every request has had its first decode round
        engine.step()
    assert [s.drafted[0] for s in seqs] == [True, False, False, False]
    engine.step()  # the next round's gates start from the scout's masses
    assert all(s.gate.masses is not None for s in seqs)
    while engine.active:
        engine.step()
    assert [s.tokens for s in seqs] == [_ar(tiny, p, 24) for p in PROMPTS[:4]]


def test_a_tree_capped_near_max_tokens_teaches_no_masses_to_its_gate_or_to_the_engines_pool(tiny):
    """A capped round drafted only the levels it could commit: its masses are a part of the text's, so the
    gate's typical masses and the engine's pool (what the next requests inherit) are not blended with them
    (zero-padded they shrank: new batches priced AR on the last batch's tails); acceptance still counts."""
    n = 12
    ref = _ar(tiny, PROMPTS[0], n)
    engine = LLMEngine(tiny, ScriptedDrafter(len(PROMPTS[0]), ref, vocab=64), spec=SpecConfig(),
                       width=lambda prefix: MeanBudget(15))
    seq = engine.add_request(Request(PROMPTS[0], n, budget="auto", draft_gate=True))
    rounds = []  # (capped, drafted, (gate masses, pool masses, forecast tokens) before, the same after)
    while engine.active:
        before = (seq.gate.masses, engine.evidence.masses, seq.forecast)
        drafted = len(seq.drafted)
        engine.step()
        after = (seq.gate.masses, engine.evidence.masses, seq.forecast)
        rounds.append((id(seq) in engine.capped, len(seq.drafted) > drafted and seq.drafted[-1], before, after))
    assert seq.tokens == ref
    capped = [r for r in rounds if r[0] and r[1]]
    whole = [r for r in rounds if not r[0] and r[1]]
    assert capped and whole  # the script accepts to the cap: full rounds first, capped ones near the end
    for _, _, (gate, pool, _), (gate2, pool2, _) in whole:
        assert gate2 is not gate and pool2 is not pool  # a whole tree's masses are learned
    for _, _, (gate, pool, seen), (gate2, pool2, seen2) in capped:
        assert gate2 is gate and pool2 is pool  # a capped one's are not
        assert seen2 > seen  # but its forecast still counts against what it accepted
