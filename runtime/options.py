"""Command-line options shared by every command that runs the engine (generate, bench,
sweep, probe, triton-repo, serve): the models, and the one `SpecConfig`.

`--extra-llm-api-options` is applied over the flags it names, and each of its fields'
mapping is printed on stderr. `engine_from_options` is the one way a command builds the
engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import click

from cast_trtllm.spec_config import METHODS, WIDTH_RULES, SpecConfig, check_budget


class BudgetType(click.ParamType):
    """A tree budget N >= 0, or `auto` (per-round width from the measured verify cost)."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        try:
            return check_budget(value)
        except ValueError as err:
            self.fail(str(err), param, ctx)


_MODEL_OPTIONS = [
    click.option("--target", default="embedded", show_default=True,
                 help="Target model: embedded (SmolLM2-135M-Instruct) | an HF model directory | a .gguf file."),
    click.option("--drafter", default="default", show_default=True,
                 help="DFlash drafter: default (the head shipped for the embedded target) | a z-lab DFlash "
                      "checkpoint directory | none (autoregressive only)."),
    click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
                 help="Where to run (auto: CUDA when available)."),
    click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
                 show_default=True, help="Model dtype (auto: the checkpoint's own; the embedded GGUF is float32)."),
    click.option("--threads", type=click.IntRange(min=1), default=None,
                 help="torch CPU threads (default: torch's choice)."),
    click.option("--engine", "engine_dir", type=click.Path(file_okay=False), default=None,
                 help="Run a built engine directory (`cast-trtllm build --sku cpu --out DIR`): its onnxruntime "
                      "graphs, checked against --target/--drafter; nothing is exported."),
]

_SPEC_OPTIONS = [
    click.option("--method", type=click.Choice(METHODS), default=None,
                 help="ar: autoregressive; chain: standard DFlash (top-1 block); cast: best-first tree [cast]."),
    click.option("--budget", type=BudgetType(), default=None,
                 help="CAST tree budget N (nonroot nodes per verify, <= L x K) or 'auto' [auto]."),
    click.option("--rank-cap", type=click.IntRange(min=1), default=None,
                 help="K: tokens kept per drafted position [8]."),
    click.option("--profile", "--width-profile", "width_profile", type=click.Path(dir_okay=False), default=None,
                 help="Width profile JSON (verify cost by packed count) used by --budget auto."),
    click.option("--width-rule", type=click.Choice(WIDTH_RULES), default=None,
                 help="auto: 'table' maximizes (1+g(N))/latency over measured buckets; 'marginal' is "
                      "Theorem 2 [table]."),
    click.option("--draft-gate/--no-draft-gate", default=None,
                 help="auto: skip drafting in rounds where AR measures faster [on]."),
    click.option("--extra-llm-api-options", "--extra_llm_api_options", "--config", "llm_api_options",
                 type=click.Path(dir_okay=False), default=None,
                 help="TensorRT-LLM YAML with a speculative_config block (decoding_type DFlash or CAST); "
                      "overrides the flags above; how each field maps is printed on stderr."),
]


def option_group(options: list[Callable]) -> Callable:
    """One decorator applying `options` (click.option decorators) in their listed order."""
    def decorate(fn: Callable) -> Callable:
        for option in reversed(options):
            fn = option(fn)
        return fn
    return decorate


model_options = option_group(_MODEL_OPTIONS)
spec_options = option_group(_SPEC_OPTIONS)


@dataclass(frozen=True, slots=True)
class EngineOptions:
    target: str
    drafter: str
    device: str
    dtype: str | None
    threads: int | None
    spec: SpecConfig
    expect_drafter: dict[str, Any] | None = None
    engine_dir: str | None = None
    engine_limits: dict[str, int] | None = None  # the YAML's honoured top-level keys (max_batch_size, max_num_tokens)


def engine_options(target: str, drafter: str, device: str, dtype: str, threads: int | None, llm_api_options=None,
                   engine_dir: str | None = None, **spec_flags: Any) -> EngineOptions:
    """Flags (+ YAML) -> validated options; bad values raise click.BadParameter. spec_flags:
    the `spec_options` flags (method, budget, ...), each a `SpecConfig` field (None: the default)."""
    try:
        spec = SpecConfig().with_overrides(**spec_flags)
    except ValueError as err:
        raise click.BadParameter(str(err)) from err
    expect = limits = None
    if llm_api_options:
        from cast_trtllm.llm_api_options import load_llm_api_options

        try:
            opts = load_llm_api_options(llm_api_options, spec)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--extra-llm-api-options") from err
        for note in opts.notes:
            click.echo(f"[extra-llm-api-options] {note}", err=True)
        spec = opts.spec or spec
        drafter = opts.speculative_model or drafter
        expect, limits = opts.expect_drafter, opts.engine
    if spec.method == "ar" and drafter == "default":
        drafter = "none"
    return EngineOptions(target, drafter, device, None if dtype == "auto" else dtype, threads, spec, expect, engine_dir,
                         limits)


def engine_from_options(opts: EngineOptions):
    """Build the engine (`runtime.engine.build.Built`); loader errors become click errors."""
    from runtime.loader import EmbeddedModelMissing
    from runtime.engine.build import build_engine

    try:
        built = build_engine(opts.target, opts.drafter, opts.spec, opts.device, opts.dtype, opts.threads,
                             engine_dir=opts.engine_dir, **{k: v for k, v in (opts.engine_limits or {}).items()
                                                            if k == "max_num_tokens"})
    except (EmbeddedModelMissing, ValueError) as err:
        raise click.ClickException(str(err)) from err
    if opts.expect_drafter and built.engine.drafter is not None:
        cfg = built.engine.drafter.config  # every drafter executor's (torch and onnxruntime: PooledDrafter)
        have = {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)}
        for key, want in opts.expect_drafter.items():
            if have[key] != want:
                raise click.ClickException(f"speculative_config.{key} is {want!r} but the drafter's config.json "
                                           f"says {have[key]!r}")
    return built
