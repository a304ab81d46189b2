"""OpenAI logprobs and the processing extensions through the official `openai` client.

The server decodes with CAST (budget 6) in fp32; every committed token's logprob and its
top 3 equal those of the same engine's AR path within 1e-4, streaming and not, for
/v1/completions (`logprobs`: int) and /v1/chat/completions (`logprobs`, `top_logprobs`).
`min_tokens`, `stop_token_ids` and `bad_words` (vLLM / trtllm-serve extra body fields)
give the AR path's greedy answer under the same processing.
"""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from runtime.engine import Request  # noqa: E402
from runtime.serving.openai.app import render_chat  # noqa: E402
from runtime.serving.requests import tokenize  # noqa: E402
from tests.runtime.serving.openai_server import running  # noqa: E402
from tests.runtime.serving.test_openai_server import CFG, MODEL  # noqa: E402

PROMPT, MESSAGES, NEW, TOL = "The tree", [{"role": "user", "content": "name a tree"}], 16, 1e-4


@pytest.fixture(scope="module")
def client():
    with running(CFG) as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def ar():
    """The AR path of the same engine build, decoding one prompt (str) or conversation alone."""
    serving = CFG.build()
    tok = serving.engine.tokenizer

    def decode(prompt, **kw):
        if isinstance(prompt, str):
            ids = tokenize(tok, prompt, add_special_tokens=True)
        else:
            ids = tokenize(tok, render_chat(tok, prompt), add_special_tokens=False)
        return serving.engine.generate([Request(tuple(ids), NEW, method="ar", **kw)])[0]

    decode.text = lambda t: tok.decode([t], skip_special_tokens=False)
    decode.tokenizer = tok
    return decode


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < TOL for x, y in zip(a, b))


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_equal_the_ar_logprobs(client, ar, stream):
    ref = ar(PROMPT, logprobs=3)
    out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=NEW, temperature=0, logprobs=3,
                                    stream=stream)
    chunks = list(out) if stream else [out]
    lps = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs is not None]
    tokens = sum((lp.tokens for lp in lps), [])
    assert tokens == [ar.text(t) for t in ref.token_ids]
    assert _close(sum((lp.token_logprobs for lp in lps), []), ref.logprobs)
    tops = sum((lp.top_logprobs for lp in lps), [])
    for got, want in zip(tops, ref.top_logprobs):
        expected = {ar.text(t): v for t, v in want}
        assert got.keys() == expected.keys() and _close(list(got.values()), list(expected.values()))
    offsets = sum((lp.text_offset for lp in lps), [])
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_and_top_logprobs_equal_the_ar_logprobs(client, ar, stream):
    ref = ar(MESSAGES, logprobs=3)
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=NEW, temperature=0,
                                         logprobs=True, top_logprobs=3, stream=stream)
    chunks = list(out) if stream else [out]
    content = sum((c.choices[0].logprobs.content for c in chunks
                   if c.choices and c.choices[0].logprobs is not None), [])
    assert [e.token for e in content] == [ar.text(t) for t in ref.token_ids]
    assert _close([e.logprob for e in content], ref.logprobs)
    assert all(e.bytes == list(e.token.encode()) for e in content)
    for entry, want in zip(content, ref.top_logprobs):
        assert [t.token for t in entry.top_logprobs] == [ar.text(t) for t, _ in want]
        assert _close([t.logprob for t in entry.top_logprobs], [v for _, v in want])
    if stream:  # each token's logprobs arrive once, with the chunk that first carries it
        assert sum(1 for c in chunks if c.choices and c.choices[0].logprobs is not None) > 1


def test_no_logprobs_unless_asked(client):
    out = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0)
    assert out.choices[0].logprobs is None
    assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4).choices[0].logprobs is None


@pytest.mark.parametrize("kind, body, field, message", [
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "top_logprobs=21 is out of range"),
    ("chat", {"top_logprobs": 2}, "top_logprobs", "top_logprobs needs logprobs=true"),
    ("completion", {"logprobs": 21}, "logprobs", "logprobs=21 is out of range"),
    ("completion", {"min_tokens": 9, "max_tokens": 8}, "min_tokens", "min_tokens=9 is over max_tokens=8"),
    ("completion", {"min_tokens": -1}, "min_tokens", "greater than or equal to 0"),
    ("completion", {"stop_token_ids": [10**6]}, "stop_token_ids", "outside [0, 320)"),
    ("completion", {"bad_words": [""]}, "bad_words", "empty word"),
])
def test_bad_logprobs_and_processing_fields_get_400_naming_them(client, kind, body, field, message):
    with pytest.raises(openai.BadRequestError) as err:
        if kind == "chat":
            client.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body=body)
        else:
            client.completions.create(model=MODEL, prompt=PROMPT, extra_body=body)
    assert err.value.body["param"] == field and message in err.value.body["message"]


def test_min_tokens_stop_token_ids_and_bad_words_give_the_ar_answer_under_the_same_processing(client, ar):
    full = ar(PROMPT, eos_token_ids=()).token_ids  # a long answer, no EOS
    word = next(ar.tokenizer.decode(full[i:i + 2]) for i in range(2, NEW - 1)
                if tokenize(ar.tokenizer, ar.tokenizer.decode(full[i:i + 2]), False) == full[i:i + 2])
    bad = tuple(tokenize(ar.tokenizer, word, False))
    kw = dict(min_tokens=6, stop_token_ids=(full[1],), bad_words=(bad,))
    ref = ar(PROMPT, **kw)
    assert ref.token_ids != full[:len(ref.token_ids)] and full[1] not in ref.token_ids[:6]  # the bans bit
    extra = {"min_tokens": 6, "stop_token_ids": [full[1]], "bad_words": [word]}
    for stream in (False, True):
        out = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=NEW, temperature=0, logprobs=0,
                                        stream=stream, extra_body=extra)
        chunks = list(out) if stream else [out]
        tokens = sum((c.choices[0].logprobs.tokens for c in chunks if c.choices and c.choices[0].logprobs), [])
        assert tokens == [ar.text(t) for t in ref.token_ids]
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == (
            "stop" if ref.finish_reason == "eos" else "length")
