"""How the `ensemble` model answers one Triton request (imported by `model.py` inside Triton).

A request's batch rows run as separate sequences in the scheduler; the scheduler thread
calls back after each round. `Reply` turns those callbacks into responses through the
request's response sender: streamed pieces (decoupled mode, `stream=true`), one final
response with every row, or one error that ends the request. A client that went away
(`is_cancelled`) has its sequences ended at the next round.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any

import triton_python_backend_utils as pb_utils

from runtime.engine import Request, Sequence
from runtime.serving.outputs import TextStream, response_arrays, spec_stats
from runtime.serving.requests import ResponseOptions
from runtime.serving.scheduler import Overloaded, Scheduler

LOG = logging.getLogger("cast.triton")


class Reply:
    """One Triton request: its batch rows in the scheduler, answered through one sender."""

    def __init__(self, scheduler: Scheduler, tokenizer: Any, pad_id: int, sender: Any,
                 rows: list[tuple[Request, ResponseOptions]], request_id: str) -> None:
        self.scheduler, self.pad_id, self.sender, self.rows = scheduler, pad_id, sender, rows
        self.done: list[Sequence | None] = [None] * len(rows)  # each finished row
        self.texts = [TextStream(tokenizer, "" if o.stream or o.exclude_input else o.prompt) for _, o in rows]
        self.sent = [(0, 0)] * len(rows)  # streaming: (tokens, rounds) already sent
        self.arrival_ns, self.first_ns = time.time_ns(), [0] * len(rows)
        self.closed, self.request_id = False, request_id
        self.lock = threading.Lock()

    def submit(self) -> None:
        for i, (req, _) in enumerate(self.rows):
            try:
                self.scheduler.submit(req, functools.partial(self._on_tokens, i), functools.partial(self._on_done, i))
            except Overloaded as err:
                with self.lock:  # rows already queued are cancelled
                    self._close(str(err))
                return

    # ------------------------------------------------------------------ scheduler callbacks
    def _on_tokens(self, i: int, live: Sequence) -> None:
        with self.lock:
            if self.closed or self.done[i] is not None:
                return
            if getattr(self.sender, "is_cancelled", lambda: False)():  # the client went away
                LOG.info("request %s cancelled by the client after %d tokens", self.request_id, len(live.tokens))
                self._close(None)
                return
            self.first_ns[i] = self.first_ns[i] or time.time_ns()
            if self.rows[i][1].stream and len(live.tokens) > self.sent[i][0]:
                self._send([self._row(i, live, final=False)], final=False)

    def _on_done(self, i: int, live: Sequence | None, error: str | None) -> None:
        with self.lock:
            if self.closed or self.done[i] is not None:
                return
            if error is not None:
                self._close(error)
                return
            self.first_ns[i] = self.first_ns[i] or time.time_ns()
            self._row_done(i, live)

    # ------------------------------------------------------------------ responses (lock held)
    def _row(self, i: int, live: Sequence, final: bool) -> dict[str, Any]:
        """Row i's outputs by name (`requests.OUTPUTS`; the optional ones where asked for)."""
        opts = self.rows[i][1]
        tokens, rounds = self.sent[i]
        self.sent[i] = (len(live.tokens), len(live.accept_lengths)) if opts.stream else (0, 0)
        row = {"text_output": self.texts[i].piece(live.tokens, final), **spec_stats(live),
               "output_ids": list(live.tokens[tokens:]), "accept_lengths": list(live.accept_lengths[rounds:]),
               "finish_reason": (live.finish_reason or "") if final else ""}
        if opts.num_input_tokens:
            row["num_input_tokens"] = len(live.request.prompt_ids)
        if opts.num_output_tokens:
            row["num_output_tokens"] = len(live.tokens)
        if opts.perf_metrics:
            times = (self.arrival_ns, self.first_ns[i], time.time_ns())
            row.update(zip(("arrival_time_ns", "first_token_time_ns", "last_token_time_ns"), times))
        return row

    def _row_done(self, i: int, live: Sequence) -> None:
        self.done[i] = live
        if all(d is not None for d in self.done):
            self._send([self._row(j, d, final=True) for j, d in enumerate(self.done)], final=True)
            self.closed = True

    def _send(self, rows: list[dict[str, Any]], final: bool) -> None:
        pad = next((o.pad_id for _, o in self.rows if o.pad_id is not None), self.pad_id)
        tensors = [pb_utils.Tensor(k, v) for k, v in response_arrays(rows, pad).items()]
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        try:
            self.sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=flags)
        except Exception as err:  # the client went away: drop the request
            LOG.info("request %s: response not delivered (%s); dropping it", self.request_id, err)
            self._close(None)

    def _close(self, message: str | None) -> None:
        """Stop every row still running and end the request: with `message` as its error, or
        (client gone) with a bare final flag, which Triton needs to release the request."""
        self.closed = True
        for (req, _), done in zip(self.rows, self.done):
            if done is None:
                self.scheduler.cancel(req.request_id)
        if message is not None:
            send_error(self.sender, message)
            return
        try:
            self.sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        except Exception as err:
            LOG.info("request %s: final flag not delivered (%s)", self.request_id, err)


def send_error(sender, message: str) -> None:
    """An error response that closes the request (a sender already closed is ignored)."""
    try:
        sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    except Exception as err:
        LOG.info("error response not delivered (%s): %s", err, message)
