"""Triton Python-backend model with the interface of TensorRT-LLM's `ensemble`
(copied to `<repo>/ensemble/1/model.py`; inputs and outputs: `runtime.serving.requests`).

`execute` only validates and enqueues: every request is answered through its response
sender by the scheduler thread (`runtime.serving.reply`), so requests arriving while a
batch decodes join it at the next round (continuous batching). Decoupled mode streams
one response per round to `stream=true` requests and gives the others one final
response; default mode (no streaming) answers each request once. Invalid requests,
overload, timeouts and shutdown each get an error response for that request only; a
client that goes away has its sequences dropped at the next round. The model keeps
serving. Project modules are imported after `initialize` puts the project root on
`sys.path` (this file runs from the model repository).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
import time

import triton_python_backend_utils as pb_utils

LOG = logging.getLogger("cast.triton")


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        model_config = json.loads(args["model_config"])
        params = model_config.get("parameters", {})
        root = params.get("project_root", {}).get("string_value", "")
        if root and root not in sys.path:  # the project's modules are imported from here on
            sys.path.insert(0, root)
        from runtime.serving.config import ServingConfig
        from runtime.serving.scheduler import Scheduler

        logging.basicConfig(level=logging.INFO)
        self.cfg = ServingConfig.from_params(params)
        if args.get("model_instance_kind") == "GPU":  # instance_group KIND_GPU: this instance's device
            self.cfg = dataclasses.replace(self.cfg, device=f"cuda:{args['model_instance_device_id']}")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(model_config)
        self.built = self.cfg.build()
        self.engine = self.built.engine
        tokenizer, eos = self.engine.tokenizer, self.engine.eos_token_ids
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
        self.scheduler = Scheduler(self.engine, self.cfg.max_batch, self.cfg.max_queue, self.cfg.request_timeout_s)
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

    def _parse(self, request, request_id: str) -> list:
        from runtime.serving.requests import parse_request, split_batch

        rows = split_batch({t.name(): t.as_numpy() for t in request.inputs()})
        engine, tokenizer, chat = self.engine, self.engine.tokenizer, self.cfg.chat
        parsed = [parse_request(f"{request_id}/{i}", row, self.cfg, lambda text: self.built.encode(text, chat),
                                engine.context_window, engine.target.config.vocab_size, tokenizer)
                  for i, row in enumerate(rows)]
        if any(o.stream for _, o in parsed):
            if not self.decoupled:
                raise ValueError("input 'stream'=true needs a decoupled model: write the repository with "
                                 "`cast-trtllm triton-repo --decoupled` (as TensorRT-LLM's decoupled_mode)")
            if len(parsed) > 1:
                raise ValueError(f"input 'stream'=true takes one prompt per request, got a batch of {len(parsed)}")
        return parsed

    def execute(self, requests):
        from runtime.serving.reply import Reply, send_error

        for request in requests:
            sender = request.get_response_sender()
            self._count += 1
            request_id = f"{request.request_id() or 'req'}#{self._count}"  # unique: clients may reuse ids
            try:
                rows = self._parse(request, request_id)
                Reply(self.scheduler, self.engine.tokenizer, self.pad_id, sender, rows, request_id).submit()
            except ValueError as err:
                send_error(sender, str(err))
            except Exception as err:  # never let one request kill the model
                LOG.exception("request %s failed", request_id)
                send_error(sender, f"request failed: {type(err).__name__}: {err}")
        return None

    def finalize(self) -> None:
        self.scheduler.shutdown(self.cfg.shutdown_grace_s)
