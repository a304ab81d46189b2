"""Launch the real `tritonserver` shipped in the `nvidia-pytriton` wheel (CPU-only here).

Mirrors what pytriton itself does (pytriton/triton.py `_prepare_triton_inference_server`):
a backend directory whose `python/` holds the wheel's `libtriton_python.so` and
`triton_python_backend_utils.py` plus the Python-backend stub built for THIS
interpreter's version; the wheel's bundled libs on LD_LIBRARY_PATH. The stub embeds
Python, so LD_LIBRARY_PATH must also name this interpreter's own libpython directory,
or model load fails with an `_thread.RLock` AttributeError.

Graceful shutdown: Triton only unloads a model (calling `finalize`) after its exit
timeout when requests are still in flight, and by then it closes client connections
without a response. So `terminate` first creates a drain file (path in the server's
environment) that the model watches: it then finishes or explicitly fails its work
within its own grace period, while Triton is still able to deliver the responses.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from pathlib import Path

import runtime

DRAIN_ENV = "CAST_DRAIN_FILE"  # the model drains (finish or fail in-flight) once this file exists


class TritonServer:
    """A `tritonserver` child process: start, wait until ready, stop gracefully."""

    def __init__(self, repo: str | Path, workdir: str | Path, http_port: int, grpc_port: int,
                 host: str = "127.0.0.1", exit_timeout_s: int = 30) -> None:
        self.repo, self.workdir = Path(repo).resolve(), Path(workdir).resolve()
        self.host, self.http_port, self.grpc_port = host, http_port, grpc_port
        self.exit_timeout_s = exit_timeout_s
        self.log_path = self.workdir / "tritonserver.log"
        self.drain_file = self.workdir / "drain"
        self.process: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    def start(self) -> "TritonServer":
        try:
            import pytriton
        except ImportError as err:
            raise RuntimeError("tritonserver comes from the nvidia-pytriton wheel: "
                               "pip install nvidia-pytriton") from err
        dist = Path(pytriton.__file__).resolve().parent
        cmd = [str(dist / "tritonserver" / "bin" / "tritonserver"), f"--model-repository={self.repo}",
               f"--backend-directory={self._prepare_backends(dist / 'tritonserver')}",
               f"--http-address={self.host}", f"--http-port={self.http_port}",
               f"--grpc-address={self.host}", f"--grpc-port={self.grpc_port}", "--allow-metrics=false",
               f"--exit-timeout-secs={self.exit_timeout_s}", "--strict-readiness=true", "--log-verbose=0"]
        env = os.environ.copy()
        env[DRAIN_ENV] = str(self.drain_file)
        libs = [sysconfig.get_config_var("LIBDIR"), str(dist.parent / "nvidia_pytriton.libs")]
        env["LD_LIBRARY_PATH"] = ":".join([*libs, env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
        root = str(Path(runtime.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = ":".join([root, env.get("PYTHONPATH", "")]).rstrip(":")
        env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
        self.drain_file.unlink(missing_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        return self

    def _prepare_backends(self, dist: Path) -> Path:
        """`<workdir>/backends/python/` with the wheel's Python backend and this Python's stub."""
        version = f"{sys.version_info[0]}.{sys.version_info[1]}"
        stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not stub.is_file():
            raise RuntimeError(f"nvidia-pytriton ships no Python-backend stub for Python {version}")
        python = self.workdir / "backends" / "python"
        python.mkdir(parents=True, exist_ok=True)
        for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
            if not (python / name).exists():
                (python / name).symlink_to(dist / "backends" / "python" / name)
        if not (python / stub.name).exists():
            shutil.copy2(stub, python / stub.name)  # a copy, as pytriton does
        return python.parent

    def ready(self) -> bool:
        try:
            url = f"http://{self.http_url}/v2/health/ready"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with code {self.process.returncode}; log:\n{self.log_tail()}")
            if self.ready():
                return
            time.sleep(0.25)
        raise TimeoutError(f"tritonserver not ready after {timeout_s:g} s; log:\n{self.log_tail()}")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def terminate(self) -> None:
        """Graceful shutdown without waiting: the model stops admitting and finishes or fails
        its in-flight requests with explicit errors (drain file) while Triton, on SIGTERM,
        refuses new requests and waits for those responses before it exits."""
        if self.process is not None and self.process.poll() is None:
            self.drain_file.touch()
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float | None = None) -> int:
        """SIGTERM (graceful: Triton drains in-flight requests), then SIGKILL on timeout.

        Backend stubs left behind (Triton exits without them when its exit timeout
        expires) are killed with it: they are in its process group.
        """
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(timeout_s if timeout_s is not None else self.exit_timeout_s + 15)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL the server and its backend stubs (its own process group): the crash case."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:  # the whole group has exited
            pass
        self.process.wait()
