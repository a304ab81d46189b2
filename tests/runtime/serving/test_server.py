"""The `ensemble` model in the real tritonserver (nvidia-pytriton) as TensorRT-LLM-backend clients
use it (tritonclient HTTP / gRPC streaming, generate / generate_stream): greedy answers equal the
prompt decoded alone. Faults: disconnects mid-stream, bad requests under load, SIGTERM, SIGKILL.
One server (`ensemble` decoupled, `ensemble_sync` not) serves all but the SIGKILL test; the
SIGTERM test runs last and stops it."""

from __future__ import annotations

import json
import queue
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from runtime.engine import Request
from runtime.serving.repo import write_repo
from runtime.serving.server import TritonServer
from tests.runtime.serving.tiny_model import tiny_config

pytestmark = pytest.mark.server
http = pytest.importorskip("tritonclient.http")
grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException, np_to_triton_dtype  # noqa: E402

CFG = tiny_config(max_batch=8, max_tokens_limit=400, default_max_tokens=16, request_timeout_s=60, shutdown_grace_s=30)
LONG = 300  # tokens of a request that is still running when a fault hits (end_id -1: no EOS)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(tmp_path, models: dict[str, bool]) -> TritonServer:
    for name, decoupled in models.items():
        write_repo(tmp_path / "repo", CFG, decoupled, name=name)
    server = TritonServer(tmp_path / "repo", tmp_path / "work", free_port(), free_port(), exit_timeout_s=40).start()
    server.wait_ready(timeout_s=240)
    return server


def inputs(module, **values) -> list:
    """tritonclient inputs with the batch dimension: scalars become [1, 1], lists [1, n]."""
    out = []
    for name, value in values.items():
        items = value if isinstance(value, list) else [value]
        array = np.array([items], {str: np.object_, int: np.int32, float: np.float32, bool: np.bool_}[type(items[0])])
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def first(result, name: str):  # the value of a [1, 1] output
    return result.as_numpy(name).reshape(-1)[0]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("triton"), {"ensemble": True, "ensemble_sync": False})
    yield srv
    srv.stop()  # the SIGTERM test may have stopped it already


@pytest.fixture(scope="module")
def alone():
    """Greedy token ids of one prompt decoded by itself (in this process, same checkpoint)."""
    built = CFG.build()

    def decode(prompt: str, max_tokens: int = 16, method: str | None = None, end_id: int | None = None) -> list[int]:
        req = Request(tuple(built.encode(prompt)), max_tokens, method=method, ignore_eos=end_id is not None)
        ids = built.engine.generate([req])[0].token_ids
        return ids[: ids.index(end_id) + 1] if end_id in ids else ids

    decode.text = lambda ids: built.engine.tokenizer.decode(ids, skip_special_tokens=True)
    return decode


def generate(server, body: dict, stream: bool = False, model: str = "ensemble"):
    """Triton's generate extension: the JSON answer, or the list of SSE events."""
    url = f"http://{server.http_url}/v2/models/{model}/generate{'_stream' if stream else ''}"
    with httpx.Client(timeout=120) as client:
        if not stream:
            return client.post(url, json=body).json()
        with client.stream("POST", url, json=body) as resp:
            return [json.loads(line[5:]) for line in resp.iter_lines() if line.startswith("data:")]


def as_list(value) -> list:  # generate's JSON gives a one-element tensor as a scalar
    return value if isinstance(value, list) else [value]


def test_http_infer_batches_and_generate_answer_with_the_greedy_tokens_and_spec_metrics(server, alone):
    prompt = "The tree"
    with http.InferenceServerClient(server.http_url, network_timeout=120) as client:  # (open ones hold shutdown)
        result = client.infer("ensemble_sync", inputs(http, text_input=prompt, max_tokens=12))
        batch = [np.array([[b"first"], [b"second one"]], dtype=np.object_), np.array([[3], [7]], np.int32)]
        tensors = [http.InferInput(n, [2, 1], t) for n, t in (("text_input", "BYTES"), ("max_tokens", "INT32"))]
        for tensor, array in zip(tensors, batch):
            tensor.set_data_from_numpy(array)
        rows = client.infer("ensemble_sync", tensors).as_numpy("output_ids").tolist()
    ids, rounds = result.as_numpy("output_ids")[0].tolist(), result.as_numpy("accept_lengths")[0].tolist()
    assert ids == alone(prompt, 12) and sum(rounds) == len(ids) - 1
    assert first(result, "finish_reason") == (b"length" if len(ids) == 12 else b"eos")
    assert first(result, "text_output").decode() == prompt + alone.text(ids)  # exclude_input_in_output false
    drafted, accepted = first(result, "total_draft_tokens"), first(result, "total_accepted_draft_tokens")
    assert drafted == 6 * len(rounds) and accepted == sum(rounds) - len(rounds)  # budget 6, every round drafts
    assert first(result, "acceptance_rate") == pytest.approx(accepted / drafted)
    expected = [alone("first", 3), alone("second one", 7)]
    assert rows == [e + [256] * (max(map(len, expected)) - len(e)) for e in expected]  # padded: tokenizer pad id
    for method in ("ar", "chain", "cast"):
        answer = generate(server, {"text_input": prompt, "max_tokens": 12, "method": method,
                                   "exclude_input_in_output": True})
        assert as_list(answer["output_ids"]) == alone(prompt, 12, method) and answer["text_output"] == alone.text(ids)


def test_grpc_streaming_and_generate_stream_send_pieces_that_join_to_the_greedy_answer(server, alone):
    prompt, expected = "stream me", alone("stream me", 24)
    responses: queue.Queue = queue.Queue()
    client = grpc.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    for stream in (True, False):
        client.async_stream_infer("ensemble", inputs(grpc, text_input=prompt, max_tokens=24, stream=stream))
        parts = []
        while not parts or not first(parts[-1], "finish_reason"):
            result, error = responses.get(timeout=60)
            assert error is None, error
            parts.append(result)
        assert sum((p.as_numpy("output_ids").reshape(-1).tolist() for p in parts), []) == expected
        assert "".join(first(p, "text_output").decode() for p in parts) == (
            alone.text(expected) if stream else prompt + alone.text(expected))
        assert (len(parts) > 1) == stream and first(parts[-1], "total_draft_tokens") > 0
    client.stop_stream()
    client.close()
    events = generate(server, {"text_input": prompt, "max_tokens": 24, "stream": True}, stream=True)
    ids = sum((as_list(e["output_ids"]) for e in events), [])
    assert len(events) > 1 and ids == expected and events[-1]["finish_reason"] in ("length", "eos")
    assert "".join(e["text_output"] for e in events) == alone.text(expected)


def test_end_id_stop_words_and_returned_counts_are_honoured(server, alone):
    prompt = "honour me"
    full = alone(prompt, 20, end_id=-1)
    end = generate(server, {"text_input": prompt, "max_tokens": 20, "end_id": full[4]})
    assert as_list(end["output_ids"]) == full[: full.index(full[4]) + 1] and end["finish_reason"] == "eos"
    no_eos = generate(server, {"text_input": prompt, "max_tokens": 20, "end_id": -1, "return_num_input_tokens": True,
                               "return_num_output_tokens": True, "return_perf_metrics": True})
    assert no_eos["output_ids"] == full and no_eos["num_output_tokens"] == 20 and no_eos["num_input_tokens"] > 2
    assert no_eos["arrival_time_ns"] <= no_eos["first_token_time_ns"] <= no_eos["last_token_time_ns"]
    stop = alone.text(full)[3:5]
    stopped = generate(server, {"text_input": prompt, "max_tokens": 20, "end_id": -1, "stop_words": ["", stop],
                                "bad_words": [""], "exclude_input_in_output": True})
    assert stopped["finish_reason"] == "stop" and stopped["text_output"].endswith(stop)
    assert alone.text(full).startswith(stopped["text_output"])


def test_unsupported_inputs_and_modes_are_refused_with_a_message_naming_them(server):
    refused = {"beam_width": 2, "num_return_sequences": 2, "return_log_probs": True,
               "lora_task_id": 3}
    for name, value in refused.items():
        answer = generate(server, {"text_input": "hi", "max_tokens": 4, name: value})
        assert f"input '{name}'" in answer["error"] and "not supported" in answer["error"], answer
    answer = generate(server, {"text_input": "hi", "max_tokens": 4, "stream": True}, model="ensemble_sync")
    assert "needs a decoupled model" in answer["error"]
    with http.InferenceServerClient(server.http_url) as client, pytest.raises(InferenceServerException, match="dec"):
        client.infer("ensemble", inputs(http, text_input="hi"))  # Triton: HTTP infer needs a non-decoupled model


MALFORMED = [  # (name, inputs, message)
    ("no text_input", dict(max_tokens=4), "text_input"),
    ("wrong dtype", dict(text_input="hi", max_tokens=4.0), "max_tokens"),
    ("empty prompt", dict(text_input=" "), "empty"),
    ("max_tokens over the limit", dict(text_input="hi", max_tokens=401), "out of range"),
    ("oversized prompt", dict(text_input="long " * 600, max_tokens=8), "context window"),
    ("negative temperature", dict(text_input="hi", temperature=-1.0), "temperature"),
    ("top_p above 1", dict(text_input="hi", top_p=1.5), "top_p"),
    ("unknown input", dict(text_input="hi", nonsense=1), "nonsense"),
]


def test_malformed_and_oversized_requests_interleaved_under_load_fail_alone(server, alone):
    jobs = []
    for i in range(16):
        jobs.append(("ok", f"request {i}: " + "ab" * (i % 5), None))
        if i % 2:
            jobs.append(("bad", *MALFORMED[i // 2][::2]))
    references = {prompt: alone(prompt, 10) for kind, prompt, _ in jobs if kind == "ok"}

    def call(job):
        kind, key, message = job
        values = dict(text_input=key, max_tokens=10) if kind == "ok" else next(m[1] for m in MALFORMED if m[0] == key)
        with http.InferenceServerClient(server.http_url, network_timeout=120) as client:
            try:
                return job, client.infer("ensemble_sync", inputs(http, **values)).as_numpy("output_ids")[0].tolist()
            except InferenceServerException as err:
                return job, err

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, jobs))
    answered = [(job, out) for job, out in results if not isinstance(out, Exception)]
    refused = [(job, out) for job, out in results if isinstance(out, Exception)]
    counts = {"sent": len(jobs), "answered": len(answered), "refused": len(refused)}
    print("load counts", counts)
    assert counts == {"sent": 24, "answered": 16, "refused": 8}
    assert all(job[0] == "ok" and out == references[job[1]] for job, out in answered)
    assert all(job[0] == "bad" and job[2] in str(err) for job, err in refused), refused
    assert server.ready()


def test_a_client_that_disconnects_mid_stream_has_its_request_dropped(server, alone):
    body = {"text_input": "leave early", "max_tokens": LONG, "end_id": -1, "stream": True}
    before = server.log_tail(10**6).count("cancelled by the client")
    responses: queue.Queue = queue.Queue()
    client = grpc.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer("ensemble", inputs(grpc, **body))
    assert responses.get(timeout=60)[1] is None  # streaming has begun
    client.stop_stream(cancel_requests=True)
    client.close()
    url = f"http://{server.http_url}/v2/models/ensemble/generate_stream"
    with httpx.Client(timeout=60) as http_client, http_client.stream("POST", url, json=body) as resp:
        assert next(resp.iter_lines()).startswith("data:")  # then the connection closes
    cancelled = lambda: server.log_tail(10**6).count("cancelled by the client") - before  # noqa: E731
    deadline = time.monotonic() + 20
    while cancelled() < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    counts = {"sent": 2, "cancelled": cancelled()}
    print("disconnect counts", counts)
    assert counts == {"sent": 2, "cancelled": 2}
    after = generate(server, {"text_input": "still here", "max_tokens": 6})
    assert as_list(after["output_ids"]) == alone("still here", 6)


def _long_streams(server: TritonServer, count: int):
    """`count` gRPC streams of LONG tokens each, returned once every one has streamed a response."""
    streams = []
    for i in range(count):
        q: queue.Queue = queue.Queue()
        client = grpc.InferenceServerClient(server.grpc_url)
        client.start_stream(callback=lambda result, error, q=q: q.put((time.monotonic(), result, error)))
        client.async_stream_infer("ensemble", inputs(grpc, text_input=f"long {i}", max_tokens=LONG, end_id=-1,
                                                     stream=True))
        streams.append((client, q))
    deadline = time.monotonic() + 60
    while any(q.empty() for _, q in streams):
        assert time.monotonic() < deadline, "a long request did not start streaming"
        time.sleep(0.02)
    return streams


def _outcome(q: queue.Queue, timeout_s: float) -> tuple[str, int, float]:
    """('done' | error text, tokens received, time of the last response)."""
    tokens = 0
    while True:
        at, result, error = q.get(timeout=timeout_s)
        if error is not None:
            return str(error), tokens, at
        tokens += result.as_numpy("output_ids").size
        if first(result, "finish_reason"):
            return "done", tokens, at


def test_sigterm_drains_in_flight_requests_to_the_end(server):
    streams = _long_streams(server, 4)
    server.terminate()
    signalled = time.monotonic()
    outcomes = [_outcome(q, 60) for _, q in streams]
    for client, _ in streams:
        client.close()  # an open stream would hold Triton's shutdown until its exit timeout
    try:
        late = generate(server, {"text_input": "too late", "max_tokens": 4})
    except httpx.HTTPError:  # Triton has closed its endpoints
        late = None
    code = server.stop(timeout_s=60)
    counts = {"in_flight": 4, "finished": sum(o[0] == "done" and o[1] >= LONG for o in outcomes),
              "late_refused": late is None or "error" in late}
    print("sigterm counts", counts, "drain seconds", max(o[2] for o in outcomes) - signalled)
    assert counts == {"in_flight": 4, "finished": 4, "late_refused": True}, outcomes
    assert code == 0, server.log_tail()


def test_sigkill_gives_every_in_flight_client_an_error_within_seconds(tmp_path):
    server = start_server(tmp_path, {"ensemble": True})
    try:
        streams = _long_streams(server, 6)
        killed = time.monotonic()
        server.kill()
        outcomes = [_outcome(q, 30) for _, q in streams]
    finally:
        server.stop()
    counts = {"in_flight": 6, "errors": sum(o[0] != "done" for o in outcomes)}
    print("sigkill counts", counts, "seconds to the last error", max(o[2] for o in outcomes) - killed)
    assert counts == {"in_flight": 6, "errors": 6}
    assert all(o[2] - killed < 10 for o in outcomes)
