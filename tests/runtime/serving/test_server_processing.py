"""`end_id`, `min_tokens` and `bad_words` through the real tritonserver (tritonclient gRPC,
streaming and not): the answers obey them, and each method's greedy answer equals the AR
path of the same engine under the same processing, decoded alone in this process."""

from __future__ import annotations

import queue

import pytest

from runtime.engine import Request
from tests.runtime.serving.test_server import CFG, first, inputs, start_server

pytestmark = pytest.mark.server
grpc = pytest.importorskip("tritonclient.grpc")

PROMPT, NEW, MIN_TOKENS = "obey me", 20, 8


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("triton"), {"ensemble": True})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def built():
    return CFG.build()


def _alone(built, method: str = "ar", **processing) -> list[int]:
    req = Request(tuple(built.encode(PROMPT)), NEW, method=method, **processing)
    return built.engine.generate([req])[0].token_ids


def _ask(server, **values) -> tuple[list[int], str]:
    """(output ids, finish reason) of one request over a gRPC stream, its pieces joined."""
    responses: queue.Queue = queue.Queue()
    client = grpc.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer("ensemble", inputs(grpc, **values))
    ids, reason = [], ""
    while not reason:
        result, error = responses.get(timeout=60)
        assert error is None, error
        ids += result.as_numpy("output_ids").reshape(-1).tolist()
        reason = first(result, "finish_reason").decode()
    client.stop_stream()
    client.close()
    return ids, reason


def _word(built, ids: list[int]) -> tuple[str, tuple[int, ...]]:
    """A 2-token word of `ids` (after its 3rd token) whose text tokenizes back to those tokens."""
    for i in range(3, len(ids) - 1):
        text = built.engine.tokenizer.decode(ids[i:i + 2])
        if built.engine.tokenizer(text, add_special_tokens=False).input_ids == ids[i:i + 2]:
            return text, tuple(ids[i:i + 2])
    raise AssertionError(f"no 2-token word of {ids} round-trips through the tokenizer")


def _occurs(word, seq) -> bool:
    return any(tuple(seq[i:i + len(word)]) == tuple(word) for i in range(len(seq) - len(word) + 1))


def test_end_id_min_tokens_and_bad_words_are_obeyed_and_greedy_equals_ar_under_the_same_processing(server, built):
    full = _alone(built, eos_token_ids=())  # no end id at all
    end_id = full[2]
    assert _alone(built, eos_token_ids=(end_id,)) == full[:full.index(end_id) + 1]  # would end by token 3
    word, bad = _word(built, full)
    expected = _alone(built, eos_token_ids=(end_id,), min_tokens=MIN_TOKENS, bad_words=(bad,))
    assert end_id not in expected[:MIN_TOKENS] and len(expected) > MIN_TOKENS
    assert not _occurs(bad, list(built.encode(PROMPT)) + expected) and _occurs(bad, full)  # the ban bit
    assert (expected[-1] == end_id) == (len(expected) < NEW)  # ended by its end id, or ran to max_tokens
    for method, stream in (("cast", True), ("chain", False), ("ar", True)):
        ids, reason = _ask(server, text_input=PROMPT, max_tokens=NEW, end_id=end_id, min_tokens=MIN_TOKENS,
                           bad_words=[word, ""], method=method, stream=stream)
        assert ids == expected, method
        assert reason == ("eos" if len(expected) < NEW else "length")
