"""The OpenAI-compatible server (`cast-trtllm serve --api openai`) through the official
`openai` client and raw HTTP: outputs equal to single-request decoding, streaming, stop
strings, concurrency, 400 errors naming the field, /v1/models, /health and /metrics.
Overload, disconnects, engine faults and SIGTERM: test_openai_robustness.py.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from click.testing import CliRunner

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from runtime.engine import Request  # noqa: E402
from runtime.serving.cli import serve  # noqa: E402
from runtime.serving.openai.app import render_chat  # noqa: E402
from runtime.serving.requests import tokenize  # noqa: E402
from tests.runtime.serving.openai_server import running  # noqa: E402
from tests.runtime.serving.tiny_model import tiny_config  # noqa: E402

CFG = tiny_config(max_batch=16, max_queue=64, max_tokens_limit=64, default_max_tokens=16, shutdown_grace_s=5)
MODEL = "llama"  # the served name of the tiny checkpoint (its label without the annotation)


@pytest.fixture(scope="module")
def server():
    with running(CFG) as (url, service):
        yield url, service


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def alone():
    """Greedy text of a prompt (str) or conversation (list) decoded by itself, by a separate
    engine over the same checkpoint: (text, token count)."""
    serving = CFG.build()
    tok = serving.engine.tokenizer

    def decode(prompt: str | list[dict], max_tokens: int, method: str = "cast") -> tuple[str, int]:
        if isinstance(prompt, str):
            ids = tokenize(tok, prompt, add_special_tokens=True)
        else:
            ids = tokenize(tok, render_chat(tok, prompt), add_special_tokens=False)
        result = serving.engine.generate([Request(tuple(ids), max_tokens, method=method)])[0]
        return tok.decode(result.token_ids, skip_special_tokens=True), len(result.token_ids)

    return decode


def test_completion_and_chat_answer_with_openai_ids_usage_and_the_greedy_text(client, alone):
    out = client.completions.create(model=MODEL, prompt="The tree", max_tokens=12, temperature=0)
    assert out.id.startswith("cmpl-") and out.object == "text_completion" and out.model == MODEL
    text, count = alone("The tree", 12)
    assert out.choices[0].text == text and out.choices[0].finish_reason in ("stop", "length")
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(b"The tree"), count)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    assert chat.id.startswith("chatcmpl-") and chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == alone(messages, 10)[0]


@pytest.mark.parametrize("method", ["ar", "chain", "cast"])
def test_greedy_output_equals_the_prompt_decoded_alone_for_every_method(client, alone, method):
    cast = {"method": method, "budget": 4 if method == "cast" else None}
    for prompt in ("a", "hello world", "0123456789" * 5):
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=20, temperature=0,
                                        extra_body={"cast": cast})
        assert out.choices[0].text == alone(prompt, 20, method)[0]


def test_streamed_chunks_join_to_the_full_text_and_the_stream_ends_with_done(server, client, alone):
    stream = client.completions.create(model=MODEL, prompt="stream me", max_tokens=24, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == alone("stream me", 24)[0]
    assert chunks[-2].choices[0].finish_reason in ("stop", "length") and chunks[-1].usage.completion_tokens > 0
    chat = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "yo"}],
                                               max_tokens=16, temperature=0, stream=True))
    assert chat[0].choices[0].delta.role == "assistant" and chat[-1].choices[0].finish_reason is not None
    expected = alone([{"role": "user", "content": "yo"}], 16)[0]
    assert "".join(c.choices[0].delta.content or "" for c in chat) == expected
    body = {"model": MODEL, "prompt": "raw", "max_tokens": 4, "stream": True}
    with httpx.stream("POST", server[0] + "/v1/completions", json=body, timeout=60) as response:
        lines = [line for line in response.iter_lines() if line]
    assert response.headers["content-type"].startswith("text/event-stream") and lines[-1] == "data: [DONE]"


def test_stop_string_ends_the_text_before_it_streamed_or_not(client, alone):
    full = alone("stop test", 40)[0]
    stop = next(ch for ch in full[3:] if ch != "\ufffd")
    expected = full[: full.index(stop)]
    out = client.completions.create(model=MODEL, prompt="stop test", max_tokens=40, temperature=0, stop=[stop])
    assert (out.choices[0].text, out.choices[0].finish_reason) == (expected, "stop")
    stream = client.completions.create(model=MODEL, prompt="stop test", max_tokens=40, temperature=0, stop=stop,
                                       stream=True)
    assert "".join(c.choices[0].text for c in stream) == expected


def test_sixteen_concurrent_requests_all_complete_with_their_alone_output(client, alone):
    prompts = [f"request number {i}" * (1 + i % 3) for i in range(16)]

    def ask(i: int) -> str:
        if i % 2:
            out = client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=16, temperature=0)
            return out.choices[0].text
        stream = client.completions.create(model=MODEL, prompt=prompts[i], max_tokens=16, temperature=0, stream=True)
        return "".join(c.choices[0].text for c in stream)

    with ThreadPoolExecutor(16) as pool:
        texts = list(pool.map(ask, range(16)))
    assert texts == [alone(p, 16)[0] for p in prompts]


@pytest.mark.parametrize("body, status, field, message", [
    ("{not json", 400, None, "malformed JSON body"),
    ({"model": MODEL, "prompt": "x", "temperature": "hot"}, 400, "temperature", "valid number"),
    ({"model": MODEL, "prompt": "x", "max_tokens": True}, 400, "max_tokens", "valid integer"),
    ({"model": MODEL, "prompt": "x", "bogus": 1}, 400, "bogus", "Unrecognized request argument"),
    ({"model": MODEL, "prompt": "x", "n": 2}, 400, "n", "n=2 is not supported"),
    ({"model": MODEL, "prompt": "x", "logprobs": 30}, 400, "logprobs", "out of range: must be in [0, 20]"),
    ({"model": MODEL, "prompt": "x", "best_of": 2}, 400, "best_of", "best_of=2"),
    ({"model": MODEL, "prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty", "greater than 0"),
    ({"model": MODEL, "prompt": "x", "logit_bias": {"1": 5}}, 400, "logit_bias", "not supported"),
    ({"model": MODEL, "prompt": "   "}, 400, "prompt", "empty"),
    ({"model": MODEL, "prompt": []}, 400, "prompt", "empty"),
    ({"model": MODEL, "prompt": [1, 320]}, 400, "prompt", "outside [0, 320)"),
    ({"model": MODEL, "prompt": "x" * 600}, 400, "prompt", "context window"),  # 512 tokens
    ({"model": MODEL, "prompt": "x" * 480, "max_tokens": 60}, 400, "max_tokens", "context window"),
    ({"model": MODEL, "prompt": "x", "max_tokens": 65}, 400, "max_tokens", "must be in [1, 64]"),
    ({"model": MODEL, "prompt": "x", "stop": [""]}, 400, "stop", "non-empty"),
    ({"model": MODEL, "prompt": "x", "cast": {"method": "beam"}}, 400, "cast.method", "Input should be"),
    ({"model": MODEL, "prompt": "x", "cast": {"budget": 999}}, 400, "cast", "budget"),
    ({"model": "other", "prompt": "x"}, 404, "model", "does not exist"),
])
def test_bad_completion_requests_get_openai_errors_naming_the_field(server, body, status, field, message):
    data = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(server[0] + "/v1/completions", content=data, headers={"content-type": "application/json"})
    error = r.json()["error"]
    assert (r.status_code, error["param"]) == (status, field) and message in error["message"], error
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")


@pytest.mark.parametrize("messages, message", [
    ([], "messages"), ([{"role": "robot", "content": "x"}], "role"), ([{"role": "user", "content": 5}], "content"),
    ([{"role": "user", "content": ""}], "no text"), ([{"role": "assistant", "content": "x"}], "last message"),
])
def test_bad_chat_messages_get_400(client, messages, message):
    with pytest.raises(openai.BadRequestError, match=message):
        client.chat.completions.create(model=MODEL, messages=messages)


def test_models_health_and_metrics_endpoints(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server[0] + "/health").json() == {"status": "ok"}
    client.completions.create(model=MODEL, prompt="count me", max_tokens=8)
    metrics = httpx.get(server[0] + "/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    for name in ("cast_http_requests_total", "cast_queue_depth", "cast_running_requests",
                 "cast_generation_tokens_total", "cast_time_to_first_token_seconds_bucket",
                 "cast_inter_token_latency_seconds_bucket", "cast_e2e_request_latency_seconds_bucket",
                 "cast_mean_committed_length", "cast_drafted_round_share", "cast_budget_per_round_bucket",
                 'cast_http_requests_total{endpoint="/v1/completions",status="200"}',
                 'cast_http_requests_total{endpoint="/v1/completions",status="400"}'):
        assert name in metrics.text, name


@pytest.mark.parametrize("args, message", [
    (["--api", "triton", "--target", "x"], "--target applies to --api openai only"),
    (["--api", "triton", "--max-batch", "2"], "--max-batch applies to --api openai only"),
    (["--api", "openai", "--repo", "."], "--repo applies to --api triton only"),
    (["--api", "openai", "--grpc-port", "9"], "--grpc-port applies to --api triton only"),
    (["--api", "triton"], "--api triton needs --repo"),
])
def test_serve_refuses_flags_the_chosen_api_would_ignore(args, message):
    result = CliRunner().invoke(serve, args)
    assert result.exit_code == 2 and message in result.output


@pytest.mark.slow  # loading the embedded model takes ~30-65 s on 2 shared cores
def test_embedded_model_chat_through_its_template_equals_the_engine_alone():
    from runtime.loader import EmbeddedModelMissing
    from runtime.serving.config import ServingConfig

    cfg = ServingConfig(device="cpu", max_tokens_limit=32, default_max_tokens=16, shutdown_grace_s=5)
    messages = [{"role": "user", "content": "What is 2+3?"}]
    try:
        with running(cfg) as (url, service):
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
            out = client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=messages, max_tokens=24,
                                                 temperature=0)
    except EmbeddedModelMissing as err:
        pytest.skip(str(err))
    tok = service.tokenizer  # the server has stopped: its engine decodes the reference alone
    ids = tokenize(tok, render_chat(tok, messages), add_special_tokens=False)
    alone = service.engine.generate([Request(tuple(ids), 24)])[0]
    assert out.choices[0].message.content == tok.decode(alone.token_ids, skip_special_tokens=True)
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == len(alone.token_ids)
