"""Helpers of the OpenAI server tests: the real server (`build_service`, the one engine
build) on the tiny checkpoint (`tiny_model`), run by uvicorn on a free 127.0.0.1 port."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import uvicorn

from runtime.serving.config import ServingConfig
from runtime.serving.openai.app import create_app
from runtime.serving.openai.launch import build_service


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(cfg: ServingConfig):
    """(base URL, Service) of a server run in a thread; stopped (and drained) on exit."""
    service = build_service(cfg)
    server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=free_port(),
                                           log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the server failed to start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{server.config.port}", service
    finally:
        server.should_exit = True
        thread.join(60)
