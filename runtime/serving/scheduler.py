"""Continuous-batching scheduler: a bounded queue in front of the one `LLMEngine`.

One thread owns the engine. Between rounds it fails requests past their deadline,
admits queued requests up to `max_batch` (prefill + first token), runs one batched
round and reports new tokens / finished requests through each request's callbacks.
`submit` never blocks: a full queue raises `Overloaded` at once. `shutdown` stops
admission, fails queued requests, gives in-flight requests `grace_s` to finish and
then fails the rest — every request gets exactly one final callback. `cancel` drops a
request (a client that went away) between rounds, freeing its batch slot.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from runtime.engine import LLMEngine, Request, Sequence

LOG = logging.getLogger(__name__)
CANCELLED = "request cancelled (the client went away)"


class Overloaded(RuntimeError):
    """The request queue is full."""


@dataclass(slots=True)
class Job:
    request: Request
    on_tokens: Callable[[Sequence], None]  # after each round that added tokens
    on_done: Callable[[Sequence | None, str | None], None]  # (finished state, None) or (None, error)
    deadline: float
    live: Sequence | None = None
    sent: int = 0  # tokens already reported through on_tokens


class Scheduler:
    def __init__(self, engine: LLMEngine, max_batch: int, max_queue: int, request_timeout_s: float,
                 on_round: Callable[[list[Sequence], float], None] | None = None) -> None:
        self.engine, self.on_round = engine, on_round  # on_round(the round's requests, its wall ms): stats
        self.max_batch, self.max_queue, self.timeout_s = max_batch, max_queue, request_timeout_s
        self._queue: collections.deque[Job] = collections.deque()
        self._running: list[Job] = []
        self._cv = threading.Condition()
        self._accepting = True
        self._stop_at: float | None = None  # shutdown: fail in-flight work after this time
        self._cancelled: set[str] = set()  # request ids to drop before the next round
        self._thread = threading.Thread(target=self._loop, name="cast-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def num_queued(self) -> int:
        return len(self._queue)

    @property
    def num_running(self) -> int:
        return len(self._running)

    def cancel(self, request_id: str) -> None:
        """Drop a queued or running request before the next round; its `on_done` gets an error.

        An id that is not (or no longer) queued or running is ignored.
        """
        with self._cv:
            self._cancelled.add(request_id)
            self._cv.notify()

    def submit(self, request: Request, on_tokens, on_done) -> None:
        with self._cv:
            if not self._accepting:
                raise Overloaded("server shutting down: not accepting new requests")
            if len(self._queue) >= self.max_queue:
                raise Overloaded(f"server overloaded: queue full (max {self.max_queue}); retry later")
            self._queue.append(Job(request, on_tokens, on_done, time.monotonic() + self.timeout_s))
            self._cv.notify()

    def shutdown(self, grace_s: float, wait: bool = True) -> None:
        """Finish or fail every request explicitly; returns when the loop has exited (`wait`) or
        at once (the loop then finishes in-flight work within `grace_s`).

        Idempotent: a second call only waits for the loop.
        """
        with self._cv:
            first = self._accepting
            self._accepting = False
            queued, self._queue = list(self._queue), collections.deque()
            if first:
                self._stop_at = time.monotonic() + grace_s
            self._cv.notify()
        for job in queued:
            _finish(job, None, "server shutting down: request was still queued")
        if wait and self._thread.is_alive():
            self._thread.join(grace_s + 30.0)

    # ------------------------------------------------------------------ loop
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._running and self._accepting:
                    self._cv.wait()
                if not self._accepting and (not self._running or time.monotonic() >= self._stop_at):
                    break
                cancelled, self._cancelled = self._cancelled, set()
                dropped = [j for j in self._queue if j.request.request_id in cancelled]
                if dropped:
                    self._queue = collections.deque(j for j in self._queue if j not in dropped)
                admit = []
                while self._queue and len(self._running) + len(admit) < self.max_batch:
                    admit.append(self._queue.popleft())
                queued = list(self._queue)
            for job in dropped:
                _finish(job, None, CANCELLED)
            for job in [j for j in self._running if j.request.request_id in cancelled]:
                self._drop(job, CANCELLED)
            self._expire(queued)
            for job in admit:
                self._admit(job)
            self._round()
        for job in list(self._running):
            self._drop(job, "server shutting down: request aborted (it did not finish within the shutdown grace "
                            "period)")

    def _expire(self, queued: list[Job]) -> None:
        now = time.monotonic()
        late = [j for j in queued if now >= j.deadline]
        if late:
            with self._cv:
                self._queue = collections.deque(j for j in self._queue if j not in late)
        for job in late:
            _finish(job, None, f"request timed out after {self.timeout_s:g} s while queued")
        for job in [j for j in self._running if now >= j.deadline]:
            self._drop(job, f"request timed out after {self.timeout_s:g} s")

    def _admit(self, job: Job) -> None:
        try:
            job.live = self.engine.add_request(job.request)
        except Exception as err:  # a bad request must not take the server down
            if getattr(err, "retry", False) and self._running:  # a preallocated KV pool is full: wait for a slot
                with self._cv:
                    self._queue.appendleft(job)
                return
            LOG.exception("prefill failed for %s", job.request.request_id)
            _finish(job, None, f"request failed: {err}")
            return
        if job.live.done:
            _finish(job, job.live, None)
        else:
            self._running.append(job)

    def _round(self) -> None:
        if not self._running:
            return
        began = time.perf_counter()
        try:
            self.engine.step()
        except Exception as err:
            LOG.exception("decoding round failed")
            for job in list(self._running):
                self._drop(job, f"request failed: decoding round raised {type(err).__name__}: {err}")
            return
        if self.on_round is not None:
            try:
                self.on_round([j.live for j in self._running], (time.perf_counter() - began) * 1e3)
            except Exception:
                LOG.exception("round listener failed")
        for job in list(self._running):
            if job.live.done:
                self._running.remove(job)
                _finish(job, job.live, None)
            elif len(job.live.tokens) > job.sent:
                try:
                    job.on_tokens(job.live)
                except Exception:
                    LOG.exception("streaming callback failed for %s", job.request.request_id)
                job.sent = len(job.live.tokens)

    def _drop(self, job: Job, error: str) -> None:
        if job.live is not None:
            self.engine.abort(job.live, error)
        if job in self._running:
            self._running.remove(job)
        _finish(job, None, error)


def _finish(job: Job, live: Sequence | None, error: str | None) -> None:
    try:
        job.on_done(live, error)
    except Exception:
        LOG.exception("completion callback failed for %s", job.request.request_id)
