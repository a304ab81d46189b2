"""Scheduler without a server: overload, timeouts, shutdown, cancel (request validation: test_requests.py)."""

from __future__ import annotations

import threading

import pytest

from runtime.engine import Request
from runtime.serving.scheduler import Overloaded, Scheduler
from tests.runtime.serving.tiny_model import tiny_config

CFG = tiny_config(max_tokens_limit=16, default_max_tokens=4)


@pytest.fixture(scope="module")
def engine():
    return CFG.build()  # runtime.engine.build.Built: .engine is the LLMEngine


class Outcome:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.live = self.error = None

    def on_done(self, live, error) -> None:
        self.live, self.error = live, error
        self.done.set()


def submit(scheduler: Scheduler, engine, prompt: str, max_tokens: int) -> Outcome:
    out = Outcome()
    scheduler.submit(Request(tuple(engine.encode(prompt)), max_tokens, ignore_eos=True), lambda live: None, out.on_done)
    return out


def test_full_queue_raises_a_clear_overload_error(engine):
    scheduler = Scheduler(engine.engine, max_batch=2, max_queue=3, request_timeout_s=30)
    outs = [submit(scheduler, engine, f"p{i}", 2) for i in range(3)]  # loop not started: all stay queued
    with pytest.raises(Overloaded, match=r"server overloaded: queue full \(max 3\); retry later"):
        submit(scheduler, engine, "one too many", 2)
    scheduler.start()
    assert all(o.done.wait(60) and o.error is None for o in outs)
    scheduler.shutdown(grace_s=5)


def test_requests_past_their_deadline_fail_with_a_timeout_error(engine):
    # 1 ms cannot cover the admission prefill plus 64 decode rounds on any machine
    scheduler = Scheduler(engine.engine, max_batch=1, max_queue=8, request_timeout_s=0.001)
    out = submit(scheduler, engine, "slow", 64)
    scheduler.start()
    assert out.done.wait(60)
    assert out.error is not None and "timed out after 0.001 s" in out.error
    scheduler.shutdown(grace_s=1)


def test_shutdown_fails_queued_and_unfinished_requests_explicitly(engine):
    scheduler = Scheduler(engine.engine, max_batch=1, max_queue=8, request_timeout_s=60)
    outs = [submit(scheduler, engine, f"long {i}", 16) for i in range(3)]
    scheduler.start()
    scheduler.shutdown(grace_s=0.0)
    assert all(o.done.is_set() for o in outs)
    errors = [o.error for o in outs if o.error is not None]
    assert errors and all(e.startswith("server shutting down") for e in errors)
    with pytest.raises(Overloaded, match="shutting down"):
        submit(scheduler, engine, "late", 2)
    assert engine.engine.active == []


def test_cancel_drops_a_running_and_a_queued_request_before_the_next_round(engine):
    from runtime.engine import Request
    from runtime.serving.scheduler import CANCELLED

    scheduler = Scheduler(engine.engine, max_batch=1, max_queue=8, request_timeout_s=60)
    running, queued, reports = Outcome(), Outcome(), []

    def on_tokens(live) -> None:  # on the scheduler thread, between rounds
        reports.append(len(live.tokens))
        scheduler.cancel("running")
        scheduler.cancel("queued")

    ids = tuple(engine.encode("cancel me"))
    scheduler.submit(Request(ids, 64, ignore_eos=True, request_id="running"), on_tokens, running.on_done)
    scheduler.submit(Request(ids, 64, ignore_eos=True, request_id="queued"), lambda live: None, queued.on_done)
    scheduler.start()
    assert running.done.wait(60) and queued.done.wait(60)
    assert running.error == queued.error == CANCELLED
    assert len(reports) == 1  # no round ran after the cancel
    assert engine.engine.active == [] and scheduler.num_queued == scheduler.num_running == 0
    scheduler.cancel("unknown")  # ids that are not queued or running are ignored
    scheduler.shutdown(grace_s=1)
