"""Scheduler and request validation without a server: overload, timeouts, shutdown, errors."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from runtime.batch_decoder import GenRequest
from runtime.serving.config import ServingConfig
from runtime.serving.engine import build_engine
from runtime.serving.requests import parse_request
from runtime.serving.scheduler import Overloaded, Scheduler

CFG = ServingConfig(model="random", block_size=4, max_tokens_limit=16, default_max_tokens=4)


@pytest.fixture(scope="module")
def engine():
    return build_engine(CFG)


class Outcome:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.live = self.error = None

    def on_done(self, live, error) -> None:
        self.live, self.error = live, error
        self.done.set()


def submit(scheduler: Scheduler, engine, prompt: str, max_tokens: int) -> Outcome:
    out = Outcome()
    scheduler.submit(GenRequest(prompt, tuple(engine.encode(prompt)), max_tokens), lambda live: None, out.on_done)
    return out


def test_full_queue_raises_a_clear_overload_error(engine):
    scheduler = Scheduler(engine.decoder, max_batch=2, max_queue=3, request_timeout_s=30)
    outs = [submit(scheduler, engine, f"p{i}", 2) for i in range(3)]  # loop not started: all stay queued
    with pytest.raises(Overloaded, match=r"server overloaded: queue full \(max 3\); retry later"):
        submit(scheduler, engine, "one too many", 2)
    scheduler.start()
    assert all(o.done.wait(60) and o.error is None for o in outs)
    scheduler.shutdown(grace_s=5)


def test_requests_past_their_deadline_fail_with_a_timeout_error(engine):
    # 1 ms cannot cover the admission prefill plus 64 decode rounds on any machine
    scheduler = Scheduler(engine.decoder, max_batch=1, max_queue=8, request_timeout_s=0.001)
    out = submit(scheduler, engine, "slow", 64)
    scheduler.start()
    assert out.done.wait(60)
    assert out.error is not None and "timed out after 0.001 s" in out.error
    scheduler.shutdown(grace_s=1)


def test_shutdown_fails_queued_and_unfinished_requests_explicitly(engine):
    scheduler = Scheduler(engine.decoder, max_batch=1, max_queue=8, request_timeout_s=60)
    outs = [submit(scheduler, engine, f"long {i}", 16) for i in range(3)]
    scheduler.start()
    scheduler.shutdown(grace_s=0.0)
    assert all(o.done.is_set() for o in outs)
    errors = [o.error for o in outs if o.error is not None]
    assert errors and all(e.startswith("server shutting down") for e in errors)
    with pytest.raises(Overloaded, match="shutting down"):
        submit(scheduler, engine, "late", 2)
    assert engine.decoder.active == []


BYTES = np.array([b"hello"], dtype=np.object_)


@pytest.mark.parametrize(
    "inputs, message",
    [
        ({"max_tokens": np.array([4], np.int32)}, "missing required input 'text_input'"),
        ({"text_input": np.array([1.0], np.float32)}, "'text_input' must be BYTES"),
        ({"text_input": BYTES, "max_tokens": np.array([4.0], np.float32)}, "'max_tokens' must be INT32"),
        ({"text_input": np.array([b"  "], dtype=np.object_)}, "'text_input' is empty"),
        ({"text_input": BYTES, "max_tokens": np.array([17], np.int32)}, r"max_tokens=17 is out of range: must be in \[1, 16\]"),
        ({"text_input": BYTES, "temperature": np.array([-1.0], np.float32)}, "temperature must be"),
        ({"text_input": BYTES, "top_p": np.array([1.5], np.float32)}, "top_p must be in"),
        ({"text_input": BYTES, "top_k": np.array([-2], np.int32)}, "top_k must be"),
        ({"text_input": BYTES, "budget": np.array([b"lots"], dtype=np.object_)}, "budget='lots' must be 'auto'"),
        ({"text_input": BYTES, "method": np.array([b"beam"], dtype=np.object_)}, "method='beam' is not one of"),
        ({"text_input": BYTES, "stop_words": np.array([b""], dtype=np.object_)}, "stop word must be non-empty"),
    ],
)
def test_malformed_inputs_raise_errors_that_name_the_problem(engine, inputs, message):
    with pytest.raises(ValueError, match=message):
        parse_request("r", inputs, CFG, engine.encode, engine.decoder.context_window)


def test_valid_inputs_become_a_request_with_their_sampling_parameters(engine):
    inputs = {"text_input": BYTES, "max_tokens": np.array([3], np.int32), "temperature": np.array([0.7], np.float32),
              "seed": np.array([2**64 - 1], np.uint64), "budget": np.array([b"5"], dtype=np.object_)}
    req = parse_request("r", inputs, CFG, engine.encode, engine.decoder.context_window)
    assert req.prompt_ids == tuple(b"hello") and req.max_new_tokens == 3 and req.budget == 5
    assert req.sampling.temperature == pytest.approx(0.7) and req.sampling.seed is not None
