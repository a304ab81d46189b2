"""`cast-trtllm triton-repo` and `cast-trtllm serve` (Triton Inference Server or OpenAI API)."""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path

import click
from click.core import ParameterSource

from runtime.options import engine_options, model_options, option_group, spec_options
from runtime.serving.config import ServingConfig
from runtime.serving.trtllm_flags import report_ignored_trtllm_flags, trtllm_serve_options

_LIMIT_OPTIONS = [
    click.option("--max-batch", "--max-batch-size", "--max_batch_size", "max_batch", type=click.IntRange(min=1),
                 default=None, help="Requests decoded together (one round = one verify pass) [default: the YAML's "
                                    "max_batch_size, else 8]."),
    click.option("--max-num-tokens", "--max_num_tokens", "max_num_tokens", type=click.IntRange(min=1), default=None,
                 help="Tokens per round's target pass: decode packs, then prompt chunks [default: the YAML's "
                      "max_num_tokens, else 512]."),
    click.option("--max-queue", type=click.IntRange(min=1), default=64, show_default=True,
                 help="Requests waiting for a batch slot before overload errors (HTTP 429)."),
    click.option("--max-tokens-limit", type=click.IntRange(min=1), default=512, show_default=True,
                 help="Largest max_tokens accepted."),
    click.option("--default-max-tokens", type=click.IntRange(min=1), default=64, show_default=True,
                 help="max_tokens when a request sends none."),
    click.option("--request-timeout", "request_timeout_s", type=click.FloatRange(min=0, min_open=True),
                 default=120.0, show_default=True,
                 help="Seconds from arrival to the last token before a request fails."),
    click.option("--shutdown-grace", "shutdown_grace_s", type=click.FloatRange(min=0), default=10.0,
                 show_default=True, help="Seconds in-flight requests get to finish on shutdown."),
]
TRITON_ONLY = {"repo", "grpc_port", "exit_timeout", "workdir"}  # serve flags of --api triton
SHARED = {"api", "host", "port"}  # every other serve flag belongs to --api openai
limit_options = option_group(_LIMIT_OPTIONS)
LIMITS = ("max_batch", "max_num_tokens", "max_queue", "max_tokens_limit", "default_max_tokens", "request_timeout_s", "shutdown_grace_s")


def serving_config(chat: bool = True, **options) -> ServingConfig:
    """The ONE place a command's flags (+ --extra-llm-api-options YAML) become a ServingConfig.

    Paths (target, drafter, width profile) are made absolute: Triton loads the model from
    its own working directory.
    """
    limits = {key: options.pop(key) for key in LIMITS}
    opts = engine_options(**options)
    yaml_limits = opts.engine_limits or {}
    limits["max_batch"] = limits["max_batch"] or yaml_limits.get("max_batch_size") or ServingConfig().max_batch
    limits["max_num_tokens"] = (limits["max_num_tokens"] or yaml_limits.get("max_num_tokens")
                                or ServingConfig().max_num_tokens)
    target = opts.target if opts.target == "embedded" else _absolute(opts.target)
    drafter = opts.drafter if opts.drafter in ("default", "none") else _absolute(opts.drafter)
    spec = opts.spec
    if spec.width_profile:
        spec = spec.with_overrides(width_profile=_absolute(spec.width_profile))
    try:
        return ServingConfig(target=target, drafter=drafter, device=opts.device, dtype=opts.dtype or "auto",
                             threads=opts.threads or 0, chat=chat, spec=spec,
                             engine_dir=_absolute(opts.engine_dir) if opts.engine_dir else "", **limits)
    except ValueError as err:
        raise click.BadParameter(str(err)) from err


def _absolute(path: str) -> str:
    return str(Path(path).resolve()) if Path(path).exists() else path


@click.command("triton-repo")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Model repository directory to write.")
@model_options
@spec_options
@limit_options
@click.option("--chat/--no-chat", default=True, show_default=True,
              help="Wrap text_input in the tokenizer's chat template.")
@click.option("--decoupled/--no-decoupled", default=False, show_default=True,
              help="Streaming mode: one response per decoding round (gRPC stream / generate_stream).")
@click.option("--instances", type=click.IntRange(min=1), default=1, show_default=True,
              help="Triton instance_group count: model instances (each its own engine) per GPU, or on the CPU.")
@click.option("--kind", type=click.Choice(["cpu", "gpu"]), default="cpu", show_default=True,
              help="Triton instance_group kind.")
@click.option("--gpus", default="", help="--kind gpu: comma-separated GPU ids (default: every visible GPU).")
def triton_repo(out: str, decoupled: bool, instances: int, kind: str, gpus: str, **settings) -> None:
    """Write a Triton Inference Server model repository serving batched CAST."""
    from runtime.serving.repo import InstanceGroup, write_repo

    cfg = serving_config(**settings)
    try:
        group = InstanceGroup(instances, kind, tuple(int(g) for g in gpus.split(",") if g.strip()))
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--instances/--kind/--gpus") from err
    model_dir = write_repo(out, cfg, decoupled, instances=group)
    click.echo(f"wrote {model_dir}/config.pbtxt and {model_dir}/1/model.py "
               f"({'decoupled streaming' if decoupled else 'single response'} mode)")


@click.command("serve")
@click.argument("model", required=False)
@click.option("--api", type=click.Choice(["triton", "openai"]), default=None,
              help="triton: run a model repository in tritonserver; openai: an OpenAI-compatible HTTP server "
                   "(/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics, /version) like "
                   "trtllm-serve [default: openai when MODEL is given, else triton].")
@click.option("--repo", type=click.Path(exists=True, file_okay=False), default=None,
              help="--api triton: the model repository (cast-trtllm triton-repo).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", "--http-port", "port", type=int, default=8000, show_default=True, help="HTTP port.")
@click.option("--grpc-port", type=int, default=8001, show_default=True, help="--api triton: gRPC port.")
@click.option("--exit-timeout", type=int, default=30, show_default=True,
              help="--api triton: seconds tritonserver waits for in-flight requests on shutdown.")
@click.option("--workdir", default="", help="--api triton: where the backend directory and log go (default: temp).")
@model_options
@spec_options
@limit_options
@trtllm_serve_options
@click.option("--served-model-name", "--served_model_name", "served_model_name", default=None,
              help="--api openai: the model name clients send (default: the target's name, "
                   "e.g. SmolLM2-135M-Instruct).")
@click.option("--log-level", "--log_level", "log_level",
              type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True, help="--api openai: uvicorn log level.")
@click.pass_context
def serve(ctx: click.Context, model: str | None, api: str | None, repo: str | None, host: str, port: int,
          grpc_port: int, exit_timeout: int, workdir: str, served_model_name: str | None, log_level: str,
          **settings) -> None:
    """Serve CAST: a Triton model repository, or the OpenAI API from this process (Ctrl-C / SIGTERM drains).

    `cast-trtllm serve MODEL` is `trtllm-serve MODEL`: the OpenAI server of MODEL (= --target),
    with trtllm-serve's flag spellings. Model, speculative and limit flags apply to --api
    openai (a Triton repository holds its own).
    """
    api = api or ("openai" if model is not None and repo is None else "triton")
    if model is not None:
        if ctx.get_parameter_source("target") is ParameterSource.COMMANDLINE:
            raise click.UsageError("give the model once: as MODEL or as --target, not both")
        if api != "openai":
            raise click.UsageError("MODEL serves the OpenAI API; a Triton repository (--repo) holds its own model")
        settings["target"] = model
    report_ignored_trtllm_flags(settings)
    _reject_flags_of_the_other_api(ctx, api)
    if api == "triton":
        if repo is None:
            raise click.UsageError("--api triton needs --repo (write one with cast-trtllm triton-repo)")
        _serve_triton(repo, host, port, grpc_port, exit_timeout, workdir)
        return
    from runtime.loader import EmbeddedModelMissing
    from runtime.serving.openai.launch import build_service, serve as serve_openai

    cfg = serving_config(**settings)
    click.echo(f"loading {cfg.target} (drafter: {cfg.drafter}) ...")
    try:
        service = build_service(cfg, served_model_name)
    except (EmbeddedModelMissing, ValueError) as err:
        raise click.ClickException(str(err)) from err
    click.echo(f"serving '{service.model_name}' at http://{host}:{port}/v1 (OpenAI API; metrics at /metrics)")
    serve_openai(service, host, port, log_level)


def _reject_flags_of_the_other_api(ctx: click.Context, api: str) -> None:
    for param in ctx.command.params:
        if param.name in SHARED or ctx.get_parameter_source(param.name) is not ParameterSource.COMMANDLINE:
            continue
        owner = "triton" if param.name in TRITON_ONLY else "openai"
        if owner != api:
            hint = " (the Triton repository holds its own engine settings)" if owner == "openai" else ""
            raise click.UsageError(f"{param.opts[0]} applies to --api {owner} only{hint}")


def _serve_triton(repo: str, host: str, http_port: int, grpc_port: int, exit_timeout: int, workdir: str) -> None:
    """Run the repository with the tritonserver bundled in nvidia-pytriton (Ctrl-C stops it gracefully)."""
    from runtime.serving.server import TritonServer

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
    click.echo(f"ready: HTTP {server.http_url}  gRPC {server.grpc_url}")
    signal.signal(signal.SIGTERM, lambda *_: server.terminate())  # the wait below sees the exit
    try:
        code = server.process.wait()
    except KeyboardInterrupt:
        code = server.stop()
    click.echo(f"tritonserver exited with code {code}")
