"""trtllm-serve's flags that have no behaviour here: accepted in its spelling so a
`trtllm-serve MODEL ...` command line runs as `cast-trtllm serve MODEL ...`, and each one
given is reported on stderr with the reason it is ignored (parallelism beyond one device is
refused: its results would differ in kind, not just in speed)."""

from __future__ import annotations

from typing import Any, Callable

import click

from runtime.options import option_group

_ONE_DEVICE = "this runtime runs one process on one device"
# dest -> (click decorator, why it is ignored)
IGNORED: dict[str, tuple[Callable, str]] = {
    "backend": (click.option("--backend", type=click.Choice(["pytorch", "tensorrt", "_autodeploy"]), default=None,
                             help="trtllm-serve's backend: accepted, ignored (one engine serves every name)."),
                "one engine serves every backend name"),
    "max_seq_len": (click.option("--max-seq-len", "--max_seq_len", "max_seq_len", type=click.IntRange(min=1),
                                 default=None, help="Accepted, ignored: the context window is the model's."),
                    "the context window is the model's (--max-tokens-limit caps max_tokens)"),
    "kv_cache_free_gpu_memory_fraction": (
        click.option("--kv-cache-free-gpu-memory-fraction", "--kv_cache_free_gpu_memory_fraction",
                     "kv_cache_free_gpu_memory_fraction", type=float, default=None,
                     help="Accepted, ignored: the KV pool grows with the live requests."),
        "the KV pool grows with the live requests (no fixed memory fraction)"),
    "trust_remote_code": (click.option("--trust-remote-code", "--trust_remote_code", "trust_remote_code", is_flag=True,
                                       default=None, help="Accepted, ignored: no remote code runs."),
                          "no remote code runs (supported families load natively)"),
    "tokenizer": (click.option("--tokenizer", default=None, help="Accepted, ignored: the model's own tokenizer."),
                  "the model's own tokenizer is used"),
    "num_postprocess_workers": (click.option("--num-postprocess-workers", "--num_postprocess_workers",
                                             "num_postprocess_workers", type=int, default=None,
                                             help="Accepted, ignored."),
                                "detokenization runs in the server process"),
    "reasoning_parser": (click.option("--reasoning-parser", "--reasoning_parser", "reasoning_parser", default=None,
                                      help="Accepted, ignored: reasoning text stays in `content`."),
                         "no reasoning parser: the reasoning text stays in the message content"),
}
PARALLEL = {name: click.option(f"--{name.replace('_', '-')}", f"--{name}", name, type=click.IntRange(min=1),
                               default=None, help=f"trtllm-serve's {name}: only 1 ({_ONE_DEVICE}).")
            for name in ("tp_size", "pp_size", "ep_size")}
trtllm_serve_options = option_group([decorator for decorator, _ in IGNORED.values()] + list(PARALLEL.values()))


def report_ignored_trtllm_flags(settings: dict[str, Any]) -> None:
    """Remove these flags from `settings`, saying on stderr why each one given is ignored."""
    for name in PARALLEL:
        value = settings.pop(name)
        if value not in (None, 1):
            raise click.UsageError(f"--{name} {value} is not supported: {_ONE_DEVICE}")
    for name, (_, why) in IGNORED.items():
        value = settings.pop(name)
        if value not in (None, False):
            click.echo(f"[serve] --{name} {value}: ignored ({why})", err=True)
