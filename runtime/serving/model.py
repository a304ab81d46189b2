"""Triton Inference Server Python-backend model `cast` (copied to `<repo>/cast/1/model.py`).

`execute` only validates and enqueues: every request is answered through its response
sender by the scheduler thread, so requests arriving while a batch decodes join it at
the next round (continuous batching). Decoupled mode streams one response per round
with the newly committed tokens; default mode sends one response at the end. Invalid
requests, overload, timeouts and shutdown each get an error response for that request
only; the model keeps serving.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _project_on_path(params: dict) -> None:
    root = params.get("project_root", {}).get("string_value", "")
    if root and root not in sys.path:
        sys.path.insert(0, root)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        model_config = json.loads(args["model_config"])
        params = model_config.get("parameters", {})
        _project_on_path(params)
        from runtime.serving.config import ServingConfig
        from runtime.serving.engine import build_engine
        from runtime.serving.scheduler import Scheduler

        logging.basicConfig(level=logging.INFO)
        self.cfg = ServingConfig.from_params(params)
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        self.engine = build_engine(self.cfg)
        self.scheduler = Scheduler(self.engine.engine, self.cfg.max_batch, self.cfg.max_queue, self.cfg.request_timeout_s)
        self.scheduler.start()
        self._count = 0
        drain_file = os.environ.get("CAST_DRAIN_FILE")  # runtime.serving.server.DRAIN_ENV
        if drain_file:
            threading.Thread(target=self._watch_drain, args=(drain_file,), name="cast-drain", daemon=True).start()

    def _watch_drain(self, path: str) -> None:
        """Drain as soon as the launcher signals a graceful shutdown (see server.py)."""
        while not os.path.exists(path):
            time.sleep(0.1)
        self.scheduler.shutdown(self.cfg.shutdown_grace_s)

    # ------------------------------------------------------------------ responses
    def _response(self, live, sent_tokens: int, sent_rounds: int, final: bool):
        """Tokens and round lengths after the first `sent_*` (already streamed) ones."""
        decode = self.engine.tokenizer.decode
        text = decode(live.tokens, skip_special_tokens=True)
        if sent_tokens:  # streaming: the new suffix of the text
            text = text[len(decode(live.tokens[:sent_tokens], skip_special_tokens=True)):]
        reason = (live.finish_reason or "") if final else ""
        return pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_)),
            pb_utils.Tensor("output_ids", np.array(live.tokens[sent_tokens:], dtype=np.int32)),
            pb_utils.Tensor("accept_lengths", np.array(live.accept_lengths[sent_rounds:], dtype=np.int32)),
            pb_utils.Tensor("finish_reason", np.array([reason.encode()], dtype=np.object_)),
        ])

    @staticmethod
    def _error(sender, message: str) -> None:
        sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _callbacks(self, sender):
        sent = {"tokens": 0, "rounds": 0}  # what earlier streamed responses carried

        def on_tokens(live) -> None:
            if self.decoupled:
                sender.send(self._response(live, sent["tokens"], sent["rounds"], final=False))
                sent["tokens"], sent["rounds"] = len(live.tokens), len(live.accept_lengths)

        def on_done(live, error) -> None:
            if error is not None:
                self._error(sender, error)
                return
            response = self._response(live, sent["tokens"], sent["rounds"], final=True)
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

        return on_tokens, on_done

    # ------------------------------------------------------------------ Triton entry points
    def execute(self, requests):
        from runtime.serving.requests import parse_request
        from runtime.serving.scheduler import Overloaded

        for request in requests:
            sender = request.get_response_sender()
            self._count += 1
            request_id = request.request_id() or f"req-{self._count}"
            try:
                inputs = {t.name(): t.as_numpy() for t in request.inputs()}
                gen = parse_request(request_id, inputs, self.cfg, self.engine.encode,
                                    self.engine.engine.context_window)
                self.scheduler.submit(gen, *self._callbacks(sender))
            except (ValueError, Overloaded) as err:
                self._error(sender, str(err))
            except Exception as err:  # never let one request kill the model
                self._error(sender, f"request failed: {type(err).__name__}: {err}")
        return None

    def finalize(self) -> None:
        self.scheduler.shutdown(self.cfg.shutdown_grace_s)
