"""`cast-trtllm triton-repo` and `cast-trtllm serve`."""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path

import click

from runtime.batch_decoder import POLICIES
from runtime.serving.config import MODELS, ServingConfig
from runtime.serving.repo import write_repo
from runtime.serving.server import TritonServer


@click.command("triton-repo")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Model repository directory to write.")
@click.option("--model", type=click.Choice(MODELS), default="embedded", show_default=True,
              help="Target: the embedded SmolLM2-135M, or a tiny seeded random model (tests).")
@click.option("--drafter", "drafter_dir", default="",
              help="DFlash checkpoint dir (default: the shipped head for the embedded model, else a random one).")
@click.option("--policy", type=click.Choice(POLICIES), default="best_first", show_default=True,
              help="Batch width policy for requests with budget 'auto'.")
@click.option("--mean-budget", type=int, default=4, show_default=True, help="best_first: shared budget per request.")
@click.option("--max-width", type=int, default=32, show_default=True, help="best_first: cap on one request's nodes.")
@click.option("--fixed-width", type=int, default=48, show_default=True, help="fixed policy: nodes per request.")
@click.option("--uniform-width", type=int, default=8, show_default=True, help="uniform policy: nodes per request.")
@click.option("--profile", default="", help="Width-profile JSON: best_first budget from Proposition 3.")
@click.option("--block-size", type=int, default=16, show_default=True, help="Random drafter block size (L+1).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of random weights.")
@click.option("--max-batch", type=int, default=8, show_default=True, help="Requests decoded together.")
@click.option("--max-queue", type=int, default=64, show_default=True, help="Queued requests before overload errors.")
@click.option("--max-tokens-limit", type=int, default=512, show_default=True, help="Largest max_tokens accepted.")
@click.option("--default-max-tokens", type=int, default=64, show_default=True, help="max_tokens when not sent.")
@click.option("--request-timeout", "request_timeout_s", type=float, default=120.0, show_default=True,
              help="Seconds from arrival to the last token before a request fails.")
@click.option("--shutdown-grace", "shutdown_grace_s", type=float, default=10.0, show_default=True,
              help="Seconds in-flight requests get to finish on shutdown.")
@click.option("--extra-llm-api-options", "llm_api_options", type=click.Path(exists=True, dir_okay=False),
              default=None, help="TensorRT-LLM-style YAML: speculative_config.speculative_model and "
                                 "width_profile override --drafter and --profile.")
@click.option("--decoupled/--no-decoupled", default=False, show_default=True,
              help="Streaming mode: one response per decoding round (gRPC stream / generate_stream).")
def triton_repo(out: str, decoupled: bool, llm_api_options: str | None, **settings) -> None:
    """Write a Triton Inference Server model repository serving batched CAST."""
    if llm_api_options:
        from cast_trtllm.llm_api_options import load_llm_api_options

        try:
            spec = load_llm_api_options(llm_api_options).speculative_config
        except (ValueError, OSError) as err:
            raise click.BadParameter(str(err), param_hint="--extra-llm-api-options") from err
        if spec is not None:
            # absolute: the server loads the model from its own working directory
            if spec.speculative_model:
                settings["drafter_dir"] = str(Path(spec.speculative_model).resolve())
            if spec.width_profile:
                settings["profile"] = str(Path(spec.width_profile).resolve())
    try:
        cfg = ServingConfig(**settings)
    except ValueError as err:
        raise click.BadParameter(str(err)) from err
    model_dir = write_repo(out, cfg, decoupled)
    click.echo(f"wrote {model_dir}/config.pbtxt and {model_dir}/1/model.py "
               f"({'decoupled streaming' if decoupled else 'single response'} mode)")


@click.command("serve")
@click.option("--repo", required=True, type=click.Path(exists=True, file_okay=False), help="Model repository.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (HTTP and gRPC).")
@click.option("--http-port", type=int, default=8000, show_default=True, help="HTTP/REST port.")
@click.option("--grpc-port", type=int, default=8001, show_default=True, help="gRPC port.")
@click.option("--exit-timeout", type=int, default=30, show_default=True,
              help="Seconds tritonserver waits for in-flight requests on shutdown.")
@click.option("--workdir", default="", help="Where the backend directory and log go (default: a temp dir).")
def serve(repo: str, host: str, http_port: int, grpc_port: int, exit_timeout: int, workdir: str) -> None:
    """Run the repository with the tritonserver bundled in nvidia-pytriton (Ctrl-C stops it gracefully)."""
    work = Path(workdir or tempfile.mkdtemp(prefix="cast-triton-"))
    work.mkdir(parents=True, exist_ok=True)
    server = TritonServer(repo, work, http_port, grpc_port, host, exit_timeout)
    server.start()
    click.echo(f"tritonserver starting (log: {server.log_path})")
    try:
        server.wait_ready()
    except (RuntimeError, TimeoutError) as err:
        server.stop()
        raise click.ClickException(str(err)) from err
    click.echo(f"ready: HTTP {server.http_url}  gRPC {server.grpc_url}  model 'cast'")
    signal.signal(signal.SIGTERM, lambda *_: server.terminate())  # the wait below sees the exit
    try:
        code = server.process.wait()
    except KeyboardInterrupt:
        code = server.stop()
    click.echo(f"tritonserver exited with code {code}")
