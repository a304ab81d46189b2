"""Run the OpenAI-compatible server: build the engine once, serve it with uvicorn.

SIGTERM / Ctrl-C: admission stops at once (new requests get 503, queued ones fail with
503), in-flight requests get `shutdown_grace_s` to finish and are then failed, and the
process exits when every response is complete: with status 0 after SIGTERM (an orderly
stop for a process manager), by the signal after Ctrl-C.
"""

from __future__ import annotations

import signal
from types import FrameType

import uvicorn

from runtime.serving.config import ServingConfig
from runtime.serving.openai.app import create_app
from runtime.serving.openai.service import Service

SHUTDOWN_MARGIN_S = 10.0  # uvicorn waits this much past the grace period for responses to complete


class DrainingServer(uvicorn.Server):
    """uvicorn that starts the scheduler's drain at the first exit signal."""

    def __init__(self, config: uvicorn.Config, service: Service) -> None:
        super().__init__(config)
        self.service = service

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.service.begin_shutdown()
        super().handle_exit(sig, frame)
        if sig == signal.SIGTERM:  # a drained SIGTERM is an orderly stop: exit 0, not re-raised (143)
            self._captured_signals.remove(sig)


def build_service(cfg: ServingConfig, model_name: str | None = None) -> Service:
    """Load the models a ServingConfig names (the one engine build of the server). The default
    name clients send is the target's label without its annotation ("SmolLM2-135M-Instruct
    (Q4_1 gguf, dequantized)" -> "SmolLM2-135M-Instruct")."""
    built = cfg.build()
    label = built.models.name
    return Service(built.engine, cfg, model_name or label.split(" (")[0].strip() or label)


def serve(service: Service, host: str, port: int, log_level: str = "info") -> None:
    """Serve until SIGTERM / Ctrl-C, then drain (blocks)."""
    config = uvicorn.Config(create_app(service), host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=int(service.cfg.shutdown_grace_s + SHUTDOWN_MARGIN_S))
    DrainingServer(config, service).run()
