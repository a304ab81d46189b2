"""Load, error and crash behaviour of the real tritonserver (nvidia-pytriton) serving CAST.

The tiny random model (byte tokenizer) keeps this CPU-cheap; every server listens on
loopback only and is started (and stopped) by the tests.
"""

from __future__ import annotations

import queue
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from runtime.batch_decoder import GenRequest
from runtime.serving.config import ServingConfig
from runtime.serving.engine import ByteTokenizer, build_engine
from runtime.serving.repo import write_repo
from runtime.serving.server import TritonServer

pytestmark = pytest.mark.server
http = pytest.importorskip("tritonclient.http")
grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

CFG = ServingConfig(model="random", block_size=5, max_batch=16, max_queue=64, max_tokens_limit=16,
                    default_max_tokens=8, request_timeout_s=60, shutdown_grace_s=5, mean_budget=3, max_width=8)
LONG = ServingConfig(model="random", block_size=5, max_batch=16, max_tokens_limit=1000, request_timeout_s=120,
                     shutdown_grace_s=0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp_path, models: dict[str, tuple[ServingConfig, bool]], exit_timeout_s: int = 30) -> TritonServer:
    for name, (cfg, decoupled) in models.items():
        write_repo(tmp_path / "repo", cfg, decoupled, name=name)
    server = TritonServer(tmp_path / "repo", tmp_path / "work", free_port(), free_port(), exit_timeout_s=exit_timeout_s)
    server.start()
    server.wait_ready(timeout_s=180)
    return server


def inputs(module, **values) -> list:
    types = {np.object_: "BYTES", np.int32: "INT32", np.float32: "FP32", np.uint64: "UINT64"}
    out = []
    for name, array in values.items():
        tensor = module.InferInput(name, list(array.shape), types[array.dtype.type])
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def text(s: str) -> np.ndarray:
    return np.array([s.encode()], dtype=np.object_)


PROMPTS = [f"request {i}: " + "abc" * (i % 7) for i in range(64)]
MALFORMED = {
    "missing text_input": dict(max_tokens=np.array([4], np.int32)),
    "wrong dtype": dict(text_input=text("hi"), max_tokens=np.array([4.0], np.float32)),
    "empty prompt": dict(text_input=text("")),
    "max tokens over the limit": dict(text_input=text("hi"), max_tokens=np.array([17], np.int32)),
    "negative temperature": dict(text_input=text("hi"), temperature=np.array([-1.0], np.float32)),
    "top_p above 1": dict(text_input=text("hi"), top_p=np.array([1.5], np.float32)),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("triton"), {"cast": (CFG, False), "cast_stream": (CFG, True)})
    yield srv
    assert srv.stop() == 0


@pytest.fixture(scope="module")
def reference():
    """Single-request greedy outputs of the same seeded engine, computed in-process."""
    decoder = build_engine(CFG).decoder
    encode = ByteTokenizer().encode
    return {p: decoder.generate([GenRequest(p, tuple(encode(p)), 8)])[0].token_ids for p in PROMPTS}


def test_64_requests_at_concurrency_16_with_malformed_ones_interleaved(server, reference):
    jobs = []
    for i, prompt in enumerate(PROMPTS):
        jobs.append(("ok", prompt, dict(text_input=text(prompt), max_tokens=np.array([8], np.int32))))
        if i % 8 == 3:
            name = list(MALFORMED)[(i // 8) % len(MALFORMED)]
            jobs.append(("bad", name, MALFORMED[name]))

    def call(job):
        kind, key, values = job
        client = http.InferenceServerClient(server.http_url, network_timeout=120, connection_timeout=120)
        try:
            result = client.infer("cast", inputs(http, **values))
            return kind, key, result.as_numpy("output_ids").tolist(), result.as_numpy("accept_lengths").tolist()
        except InferenceServerException as err:
            return kind, key, err, None
        finally:
            client.close()

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, jobs))
    for kind, key, out, rounds in results:
        if kind == "ok":
            assert out == reference[key], key
            assert sum(rounds) == len(out) - 1  # the prefill token, then committed rounds
        else:
            assert isinstance(out, InferenceServerException), key
    assert server.ready()  # still serving after the bad requests


def test_decoupled_model_streams_one_response_per_round(server, reference):
    prompt = PROMPTS[5]
    responses: queue.Queue = queue.Queue()
    client = grpc.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    client.async_stream_infer("cast_stream", inputs(grpc, text_input=text(prompt), max_tokens=np.array([8], np.int32)))
    ids, rounds, parts = [], [], 0
    while True:
        result, error = responses.get(timeout=60)
        assert error is None, error
        ids += result.as_numpy("output_ids").tolist()
        rounds += result.as_numpy("accept_lengths").tolist()
        parts += 1
        if result.as_numpy("finish_reason")[0]:
            break
    client.stop_stream()
    assert ids == reference[prompt] and parts > 1 and sum(rounds) == len(ids) - 1


def _long_requests(server: TritonServer, count: int, timeout_s: float):
    def call(i):
        client = http.InferenceServerClient(server.http_url, network_timeout=timeout_s, connection_timeout=timeout_s)
        start = time.monotonic()
        try:
            client.infer("cast", inputs(http, text_input=text(f"long {i}"), max_tokens=np.array([1000], np.int32)))
            return "ok", time.monotonic() - start
        except Exception as err:  # connection reset, timeout or a server error: all are errors
            return str(err), time.monotonic() - start
        finally:
            client.close()  # an open keep-alive connection would hold Triton's shutdown

    pool = ThreadPoolExecutor(count)
    futures = [pool.submit(call, i) for i in range(count)]
    return pool, futures


def test_killed_server_gives_clients_errors_without_hanging(tmp_path):
    server = start_server(tmp_path, {"cast": (LONG, False)})
    pool, futures = _long_requests(server, 8, timeout_s=20)
    time.sleep(0.5)  # requests are in flight (each runs for seconds unless it draws EOS early)
    server.kill()
    outcomes = [f.result(timeout=30) for f in futures]
    pool.shutdown()
    assert any(status != "ok" for status, _ in outcomes)  # (a request may end at EOS first)
    assert all(elapsed < 25 for _, elapsed in outcomes)


def test_graceful_shutdown_answers_in_flight_requests_explicitly(tmp_path):
    server = start_server(tmp_path, {"cast": (LONG, False)}, exit_timeout_s=20)
    pool, futures = _long_requests(server, 4, timeout_s=60)
    time.sleep(2.0)
    server.terminate()
    outcomes = [f.result(timeout=60) for f in futures]
    pool.shutdown()
    code = server.stop(timeout_s=30)
    assert all(status == "ok" or "server shutting down" in status for status, _ in outcomes), outcomes
    assert code == 0, server.log_tail()
    assert all(elapsed < 15 for _, elapsed in outcomes)  # failed after the grace, not at the exit timeout
