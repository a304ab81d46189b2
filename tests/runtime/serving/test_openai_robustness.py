"""The OpenAI-compatible server under stress: a full queue (429 + Retry-After), clients
that go away (their batch slot is freed), an engine fault (only that round's requests
fail) and SIGTERM (admission stops, in-flight requests finish, then the process exits).
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn")

from tests.runtime.serving.openai_server import free_port, running  # noqa: E402
from tests.runtime.serving.tiny_model import tiny_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
MODEL = "llama"  # the served name of the tiny checkpoint
LONG = {"model": MODEL, "max_tokens": 480, "ignore_eos": True, "cast": {"method": "ar"}}  # 480 rounds (>= 4.8 s slowed)


def client_for(url: str):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def slow_rounds(service, monkeypatch, seconds: float = 0.01) -> None:
    """Each round takes >= `seconds` (the tiny model's ~2 ms rounds would end LONG before a client can act)."""
    real_step = service.engine.step

    def step():
        time.sleep(seconds)
        return real_step()

    monkeypatch.setattr(service.engine, "step", step)


def test_full_queue_answers_429_and_a_disconnected_stream_frees_its_slot(monkeypatch):
    cfg = tiny_config(max_batch=1, max_queue=1, max_tokens_limit=480, shutdown_grace_s=5)
    with running(cfg) as (url, service):
        slow_rounds(service, monkeypatch)
        client = client_for(url)
        with httpx.stream("POST", url + "/v1/completions", json={**LONG, "prompt": "long", "stream": True},
                          timeout=60) as first:
            lines = first.iter_lines()  # (dropping this iterator would close the stream)
            next(lines)  # running: it holds the only batch slot
            with ThreadPoolExecutor(1) as pool:
                queued = pool.submit(client.completions.create, model=MODEL, prompt="next", max_tokens=8,
                                     extra_body={"ignore_eos": True})
                deadline = time.monotonic() + 30
                while service.scheduler.num_queued < 1:
                    assert time.monotonic() < deadline and not queued.done()
                    time.sleep(0.02)
                with pytest.raises(openai.RateLimitError) as err:
                    client.completions.create(model=MODEL, prompt="one too many", max_tokens=2)
                assert err.value.response.headers["retry-after"] == "1" and "queue full" in err.value.message
                first.close()  # the client goes away mid-stream: the queued request gets its slot
                assert queued.result(timeout=60).usage.completion_tokens == 8
        metrics = httpx.get(url + "/metrics").text
        assert 'cast_requests_finished_total{reason="cancelled"} 1.0' in metrics
        assert 'cast_http_requests_total{endpoint="/v1/completions",status="429"} 1.0' in metrics


def test_a_client_that_stops_waiting_for_a_full_response_is_cancelled(monkeypatch):
    cfg = tiny_config(max_batch=1, max_tokens_limit=480, shutdown_grace_s=5)
    with running(cfg) as (url, service):
        slow_rounds(service, monkeypatch)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url + "/v1/completions", json={**LONG, "prompt": "p"}, timeout=1.0)
        deadline = time.monotonic() + 30
        while 'reason="cancelled"} 1.0' not in httpx.get(url + "/metrics").text:
            assert time.monotonic() < deadline, "the abandoned request was not cancelled"
            time.sleep(0.1)
        assert service.scheduler.num_running == 0 and service.engine.active == []


def test_an_engine_exception_fails_that_rounds_requests_and_the_server_keeps_serving(monkeypatch):
    with running(tiny_config(max_tokens_limit=16, default_max_tokens=8, shutdown_grace_s=5)) as (url, service):
        real_step, failures = service.engine.step, []

        def step_failing_once():
            if not failures:
                failures.append(1)
                raise RuntimeError("injected fault")
            return real_step()

        monkeypatch.setattr(service.engine, "step", step_failing_once)  # the scheduler's next round
        client = client_for(url)
        with pytest.raises(openai.InternalServerError, match="decoding round raised RuntimeError: injected fault"):
            client.completions.create(model=MODEL, prompt="unlucky", max_tokens=8)
        lucky = client.completions.create(model=MODEL, prompt="lucky", max_tokens=8, extra_body={"ignore_eos": True})
        assert lucky.usage.completion_tokens == 8
        assert service.engine.active == []


SERVE = "from cast_trtllm.cli import main; main()"  # `cast-trtllm` with this interpreter


def test_sigterm_stops_admission_and_drains_in_flight_requests():
    port, cfg = free_port(), tiny_config()
    url = f"http://127.0.0.1:{port}"
    args = ["serve", "--api", "openai", "--port", str(port), "--target", cfg.target, "--drafter", cfg.drafter,
            "--device", "cpu", "--threads", "1", "--budget", "6", "--max-batch", "4", "--shutdown-grace", "30",
            "--log-level", "warning"]
    proc = subprocess.Popen([sys.executable, "-c", SERVE, *args], cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health").status_code == 200:
                    break
            time.sleep(0.2)
        body = {**LONG, "prompt": "drain", "stream": True,
                "stream_options": {"include_usage": True}}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            next(lines)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            with contextlib.suppress(httpx.ConnectError):  # refused, or admitted only to get a 503
                late = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "late"})
                assert late.status_code == 503 and late.headers["retry-after"] == "1"
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2].removeprefix("data: "))["usage"]["completion_tokens"] == 480
        assert proc.wait(timeout=60) == 0  # drained, then an orderly exit (was 143: uvicorn re-raised the signal)
    finally:
        if proc.poll() is None:
            proc.kill()
