"""The OpenAI server takes trtllm-serve's extra body fields and means by them what the LLM API
does (one SamplingParams): include_stop_str_in_output, penalties (greedy CAST = AR under them),
min_p, skip_special_tokens; `/version`; avg_decoded_tokens_per_iter on the finishing choice."""

from __future__ import annotations

import httpx
import pytest

openai = pytest.importorskip("openai")

from tests.runtime.serving.openai_server import running  # noqa: E402
from tests.runtime.serving.tiny_model import tiny_config  # noqa: E402

MODEL = "llama"


@pytest.fixture(scope="module")
def server():
    with running(tiny_config(max_tokens_limit=64, default_max_tokens=16)) as (url, _):
        yield url, openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _complete(client, **extra):
    out = client.completions.create(model=MODEL, prompt="The tree", max_tokens=12, temperature=0,
                                    **({"stop": extra.pop("stop")} if "stop" in extra else {}), extra_body=extra)
    return out.model_dump()["choices"][0]


def test_include_stop_str_in_output_keeps_the_stop_string(server):
    _, client = server
    full = _complete(client)["text"]
    stop = full[4:6]
    cut = full.index(stop)
    assert _complete(client, stop=[stop])["text"] == full[:cut]
    kept = _complete(client, stop=[stop], include_stop_str_in_output=True)
    assert kept["text"] == full[:cut + len(stop)] and kept["finish_reason"] == "stop"


def test_penalties_keep_greedy_cast_equal_to_ar_and_change_the_answer(server):
    _, client = server
    pen = {"repetition_penalty": 0.2, "presence_penalty": -2.0, "frequency_penalty": -1.0, "min_p": 0.1}  # repeat!
    cast, ar = (_complete(client, cast={"method": m}, **pen)["text"] for m in ("cast", "ar"))
    assert cast == ar and cast != _complete(client, cast={"method": "ar"})["text"]


def test_version_and_tokens_per_iteration_are_reported(server):
    url, client = server
    choice = _complete(client, skip_special_tokens=False, spaces_between_special_tokens=False)
    assert choice["avg_decoded_tokens_per_iter"] >= 1.0
    assert httpx.get(url + "/version").json() == {"version": __import__("cast_trtllm").__version__}
