"""The LLM API as a TensorRT-LLM user writes it (its quickstart / sampling / async examples),
with only the import changed, on the embedded default target: text, token ids, finish and
stop reasons, stop strings, logprobs per token, ignore_eos, penalties, streaming
generate_async and get_stats; greedy CAST and DFlash token ids equal AR's."""

import asyncio

import pytest

from cast_trtllm import SamplingParams
from cast_trtllm.llmapi import CASTDecodingConfig, DFlashDecodingConfig

PROMPTS = ["Hello, my name is", "The capital of France is", "def fibonacci(n):"]
CHAT = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"  # greedy: a short answer + EOS


@pytest.fixture(scope="module")
def ar(make_llm):
    return make_llm()  # no speculative_config: autoregressive


@pytest.fixture(scope="module")
def cast(make_llm):
    return make_llm(speculative_config=CASTDecodingConfig(max_total_draft_tokens=15, draft_gate=False))


def test_the_tensorrt_llm_quickstart_runs_and_greedy_dflash_and_cast_equal_ar(make_llm, ar, cast):
    # --- TensorRT-LLM's quickstart, `tensorrt_llm` -> `cast_trtllm` ---------------------------
    from cast_trtllm import LLM  # noqa: F401  (the script's import; `make_llm` builds it on the session model)

    sampling_params = SamplingParams(max_tokens=16)  # no temperature / top_k / top_p: greedy, as TensorRT-LLM
    dflash = make_llm(speculative_config=DFlashDecodingConfig(max_draft_len=15))
    for llm in (ar, dflash, cast):
        outputs = llm.generate(PROMPTS, sampling_params)
        for output in outputs:
            print(f"Prompt: {output.prompt!r}, Generated text: {output.outputs[0].text!r}")
    # ------------------------------------------------------------------------------------------
    want = ar.generate(PROMPTS, sampling_params)
    for llm in (dflash, cast):
        got = llm.generate(PROMPTS, sampling_params)
        for g, w in zip(got, want):
            assert g.outputs[0].token_ids == w.outputs[0].token_ids and g.outputs[0].text == w.outputs[0].text
    for out, prompt in zip(want, PROMPTS):
        c = out.outputs[0]
        assert out.finished and out.prompt == prompt and out.prompt_token_ids == ar.tokenizer(prompt).input_ids
        assert c.finish_reason in ("stop", "length") and c.text == ar.tokenizer.decode(c.token_ids,
                                                                                      skip_special_tokens=True)
        assert c.finish_reason == "stop" or len(c.token_ids) == 16


def test_stop_strings_end_the_text_before_them_unless_asked_to_keep_them(ar, cast):
    plain = ar.generate(PROMPTS[1], SamplingParams(max_tokens=16)).outputs[0].text
    word = plain.split()[2]
    for llm in (ar, cast):
        out = llm.generate(PROMPTS[1], SamplingParams(max_tokens=16, stop=[word, "zzqx"])).outputs[0]
        assert (out.finish_reason, out.stop_reason) == ("stop", word)
        assert out.text == plain[:plain.index(word)] and out.text.startswith(ar.tokenizer.decode(out.token_ids))
        kept = llm.generate(PROMPTS[1], SamplingParams(max_tokens=16, stop=word,
                                                       include_stop_str_in_output=True)).outputs[0]
        assert kept.text == plain[:plain.index(word) + len(word)]


def test_eos_ends_with_stop_and_ignore_eos_runs_to_max_tokens(ar, cast):
    short = ar.generate(CHAT, SamplingParams(max_tokens=40)).outputs[0]
    assert short.finish_reason == "stop" and short.stop_reason is None and len(short.token_ids) < 40
    assert not set(short.token_ids) & set(ar.engine.eos_token_ids)  # the end id is not returned
    for llm in (ar, cast):
        long = llm.generate(CHAT, SamplingParams(max_tokens=40, ignore_eos=True)).outputs[0]
        assert long.finish_reason == "length" and len(long.token_ids) == 40
        assert long.token_ids[:len(short.token_ids)] == short.token_ids


def test_logprobs_per_token_are_the_same_under_cast_as_under_ar(ar, cast):
    params = SamplingParams(max_tokens=12, logprobs=2)
    a, c = (llm.generate(PROMPTS[0], params).outputs[0] for llm in (ar, cast))
    assert a.token_ids == c.token_ids and len(a.logprobs) == len(a.token_ids) == 12
    for token, la, lc in zip(a.token_ids, a.logprobs, c.logprobs):
        assert token in la and la.keys() == lc.keys() and len(la) <= 3
        assert la[token].logprob == pytest.approx(lc[token].logprob, abs=1e-4) and la[token].rank == 1
    assert a.cumulative_logprob == pytest.approx(sum(lp[t].logprob for lp, t in zip(a.logprobs, a.token_ids)))


def test_penalties_and_min_p_keep_greedy_cast_equal_to_ar(ar, cast):
    params = SamplingParams(max_tokens=20, repetition_penalty=1.3, frequency_penalty=0.3, min_p=0.1)
    a, c = (llm.generate(PROMPTS[2], params).outputs[0] for llm in (ar, cast))
    assert a.token_ids == c.token_ids
    assert a.token_ids != ar.generate(PROMPTS[2], SamplingParams(max_tokens=20)).outputs[0].token_ids


def test_streaming_generate_async_grows_to_the_generate_output_and_abort_cancels(cast):
    params = SamplingParams(max_tokens=24)
    want = cast.generate(PROMPTS[0], params).outputs[0]

    async def main():
        texts, seen = [], []
        async for output in cast.generate_async(PROMPTS[0], params, streaming=True):
            texts.append(output.outputs[0].text_diff)
            seen.append(len(output.outputs[0].token_ids))
        final = await cast.generate_async(PROMPTS[0], params).aresult()
        pending = cast.generate_async(PROMPTS[1], SamplingParams(max_tokens=200, ignore_eos=True), streaming=True)
        async for output in pending:
            pending.abort()
            if output.finished:
                break
        return texts, seen, output, final

    texts, seen, cancelled, final = asyncio.run(main())
    assert "".join(texts) == want.text and seen == sorted(seen) and len(seen) > 2
    assert final.outputs[0].token_ids == want.token_ids
    assert cancelled.outputs[0].finish_reason == "cancelled" and len(cancelled.outputs[0].token_ids) < 200


def test_get_stats_reports_each_round_with_spec_decoding_stats(cast):
    cast.get_stats(0)  # drop what earlier tests left
    cast.generate(PROMPTS, SamplingParams(max_tokens=16))
    stats = cast.get_stats(timeout=2)
    assert stats and [s["iter"] for s in stats] == sorted(s["iter"] for s in stats)
    spec = [s["specDecodingStats"] for s in stats]
    drafted = [s for s in spec if s["numRequestsWithDraftTokens"]]
    assert drafted and all(s["numDraftTokens"] >= s["numRequestsWithDraftTokens"] for s in drafted)
    assert any(s["numDraftTokens"] >= 15 * s["numRequestsWithDraftTokens"] for s in drafted)  # fewer only near max_tokens
    assert all(1.0 <= s["acceptanceLength"] <= 16 and 0 <= s["draftOverhead"] <= 1 for s in drafted)
    assert asyncio.run(_collect(cast)) == []  # nothing new since the last call


async def _collect(llm):
    return [s async for s in llm.get_stats_async(timeout=0)]


@pytest.mark.parametrize("kwargs, field", [({"n": 2}, "SamplingParams.n=2"),
                                           ({"use_beam_search": True}, "use_beam_search"),
                                           ({"guided_decoding": {"json": {}}}, "guided_decoding"),
                                           ({"temperature": -1}, "temperature"), ({"min_p": 2}, "min_p")])
def test_what_the_engine_cannot_honour_is_one_error_line_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field) as err:
        SamplingParams(**kwargs)
    assert "\n" not in str(err.value)


def test_an_unknown_llm_argument_is_named(make_llm):
    with pytest.raises(ValueError, match="'max_tokens_per_second'"):
        make_llm(max_tokens_per_second=3)


def test_a_seeded_sampled_request_repeats_exactly_with_a_fixed_budget(cast):
    params = SamplingParams(max_tokens=10, temperature=0.8, top_k=20, top_p=0.95, seed=7)
    first, again = (cast.generate(PROMPTS[0], params).outputs[0].token_ids for _ in range(2))
    assert first == again and len(first) == 10
