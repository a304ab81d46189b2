"""The serving core behind the HTTP routes: one `Scheduler` over the engine, and a bridge
from its thread to asyncio.

The scheduler thread calls `Generation.on_tokens` / `on_done`; each hands a snapshot to
the server's event loop with `call_soon_threadsafe` into the request's asyncio.Queue, and
records the metrics on the way.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from runtime.engine import LLMEngine, Request
from runtime.serving.config import ServingConfig
from runtime.serving.openai.errors import APIError
from runtime.serving.openai.metrics import ServerMetrics
from runtime.serving.requests import RequestError
from runtime.serving.scheduler import Overloaded, Scheduler

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}  # engine → OpenAI


@dataclass(frozen=True, slots=True)
class Update:
    """What a request has produced so far (all tokens, not a delta)."""

    tokens: list[int]
    finished: bool = False
    finish_reason: str | None = None  # OpenAI's: "stop" | "length"
    error: str | None = None
    logprobs: list[float] = field(default_factory=list)  # per token, when the request asked for them
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    rounds: int = 0  # engine rounds that committed its tokens (the prefill's first token not counted)

    @property
    def avg_decoded_tokens_per_iter(self) -> float:
        """trtllm-serve's figure: tokens per iteration, the prefill (first token) one included."""
        return len(self.tokens) / (1 + self.rounds) if self.tokens else 0.0


class Generation:
    """One submitted request as the event loop sees it."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop, metrics: ServerMetrics) -> None:
        self.request_id, self.metrics = request_id, metrics
        self.queue: asyncio.Queue[Update] = asyncio.Queue()
        self.cancelled = False
        self._loop = loop
        self._arrival = self._last = time.monotonic()
        self._delivered = self._rounds = 0

    # --- scheduler thread
    def on_tokens(self, live: Any, finish_reason: str | None = None) -> None:
        self._account(live)
        self._put(Update(list(live.tokens), finish_reason is not None, finish_reason, logprobs=list(live.logprobs),
                         top_logprobs=list(live.top_logprobs), rounds=len(live.accept_lengths)))

    def on_done(self, live: Any, error: str | None) -> None:
        if live is None:
            self.metrics.finished.labels("cancelled" if self.cancelled else "error").inc()
            self._put(Update([], True, None, error or "request failed"))
            return
        reason = FINISH_REASONS[live.finish_reason]
        self.metrics.finished.labels(reason).inc()
        self.metrics.e2e.observe(time.monotonic() - self._arrival)
        self.on_tokens(live, reason)

    def _account(self, live: Any) -> None:
        now, new = time.monotonic(), len(live.tokens) - self._delivered
        if new > 0:
            if self._delivered == 0:
                self.metrics.ttft.observe(now - self._arrival)
            else:
                for _ in range(new):
                    self.metrics.itl.observe((now - self._last) / new)
            self.metrics.generated_tokens.inc(new)
            self._delivered, self._last = len(live.tokens), now
        seen = self._rounds
        self.metrics.record_rounds(live.accept_lengths[seen:], live.budgets[seen:], live.drafted[seen:])
        self._rounds = len(live.accept_lengths)

    def _put(self, update: Update) -> None:
        try:
            self._loop.call_soon_threadsafe(self.queue.put_nowait, update)
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            pass


class Service:
    """Engine + scheduler + metrics of one server; `draining` once shutdown has begun."""

    def __init__(self, engine: LLMEngine, cfg: ServingConfig, model_name: str) -> None:
        self.engine, self.tokenizer = engine, engine.tokenizer
        self.cfg, self.model_name = cfg, model_name
        self.created = int(time.time())
        self.metrics = ServerMetrics()
        self.scheduler = Scheduler(self.engine, cfg.max_batch, cfg.max_queue, cfg.request_timeout_s)
        self.metrics.queue_depth.set_function(lambda: self.scheduler.num_queued)
        self.metrics.running.set_function(lambda: self.scheduler.num_running)
        self.draining = False

    @property
    def context_window(self) -> int:
        return self.engine.context_window

    def begin_shutdown(self) -> None:
        """Stop admission now; in-flight requests get `shutdown_grace_s` to finish (returns at once)."""
        self.draining = True
        self.scheduler.shutdown(self.cfg.shutdown_grace_s, wait=False)

    def close(self) -> None:
        """Blocking: drain (if not begun) and wait for the scheduler loop to exit."""
        self.begin_shutdown()
        self.scheduler.shutdown(self.cfg.shutdown_grace_s)

    def submit(self, request: Request) -> Generation:
        if self.draining:
            raise APIError(503, "server shutting down: not accepting new requests", code="shutting_down")
        try:  # method / budget this engine cannot run: the client's error, before queueing
            self.engine.check_request(request)
        except ValueError as err:
            raise RequestError(str(err), "cast") from err
        gen = Generation(request.request_id, asyncio.get_running_loop(), self.metrics)
        try:
            self.scheduler.submit(request, gen.on_tokens, gen.on_done)
        except Overloaded as err:
            if self.draining:
                raise APIError(503, str(err), code="shutting_down") from err
            raise APIError(429, str(err), code="queue_full") from err
        self.metrics.prompt_tokens.inc(len(request.prompt_ids))
        return gen

    def cancel(self, gen: Generation) -> None:
        """The client went away: free its batch slot before the next round."""
        gen.cancelled = True
        self.scheduler.cancel(gen.request_id)

    def failure(self, update: Update) -> APIError:
        """The error a failed request returns: 503 while draining, else 500."""
        if self.draining:
            return APIError(503, update.error, code="shutting_down")
        return APIError(500, update.error, code="generation_failed")
