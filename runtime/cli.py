"""`cast-trtllm generate`: one prompt through AR, DFlash-chain or CAST decoding."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from runtime.drafter import DEFAULT_DRAFTER


class BudgetType(click.ParamType):
    """A tree budget N >= 1, or `auto` (per-round width from a width profile)."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        if isinstance(value, int) or value == "auto":
            budget = value
        else:
            try:
                budget = int(value)
            except ValueError:
                self.fail(f"{value!r} is neither an integer nor 'auto'", param, ctx)
        if budget != "auto" and budget < 1:
            self.fail(f"budget must be >= 1, got {budget}", param, ctx)
        return budget


def _device_and_dtype(device: str, dtype: str):
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise click.BadParameter("CUDA is not available on this machine", param_hint="--device")
    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    return torch.device(device), getattr(torch, dtype)


def _drafter_for(path: Path | None, target, seed: int):
    """The checkpoint at `path`, else the shipped default, else a seeded random head."""
    from runtime.drafter import load_drafter, random_drafter

    if path is None and (DEFAULT_DRAFTER / "config.json").is_file():
        path = DEFAULT_DRAFTER
    if path is None:
        click.echo(
            "warning: no trained drafter is shipped yet; using a seeded random DFlash head, "
            "so acceptance will be near zero (pass --drafter PATH for a trained one)",
            err=True,
        )
        return random_drafter(target.config, seed=seed)
    try:
        return load_drafter(path, target.config)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--drafter") from err


def _width_policy(profile_path: Path | None, prompt_len: int, rule: str, device, dtype, target_name: str,
                  mass_exponent: float):
    """The width policy of `--budget auto`: from --profile, else the shipped measured one."""
    from cast_trtllm.profile import find_measured_profile, load_profile
    from cast_trtllm.width import WidthPolicy
    from runtime.device import device_name

    if profile_path is None:
        profile_path = find_measured_profile(target_name, str(dtype).removeprefix("torch."), device.type,
                                             device_name(device))
    if profile_path is None:
        raise click.BadParameter(
            f"--budget auto needs a width profile measured for this device and target; none is "
            f"shipped for {target_name} / {dtype} / {device.type}. Measure one with "
            "`cast-trtllm probe` and pass it as --profile PATH",
            param_hint="--budget",
        )
    try:
        return WidthPolicy.from_profile(load_profile(profile_path), prefix_len=prompt_len, rule=rule,
                                        mass_exponent=mass_exponent)
    except (ValueError, OSError) as err:
        raise click.BadParameter(str(err), param_hint="--profile") from err


def _apply_llm_api_options(path: Path | None, method: str, budget, drafter_path, profile_path):
    """Overlay a TensorRT-LLM-style `speculative_config` YAML on the flags."""
    if path is None:
        return method, budget, drafter_path, profile_path
    from cast_trtllm.llm_api_options import load_llm_api_options

    try:
        spec = load_llm_api_options(path).speculative_config
    except (ValueError, OSError) as err:
        raise click.BadParameter(str(err), param_hint="--extra-llm-api-options") from err
    if spec is None:
        return method, budget, drafter_path, profile_path
    if spec.method == "cast" and spec.budget != "auto" and spec.budget < 1:
        raise click.BadParameter("speculative_config.budget must be >= 1 or 'auto'",
                                 param_hint="--extra-llm-api-options")
    return (
        spec.method,
        spec.budget,
        Path(spec.speculative_model) if spec.speculative_model else drafter_path,
        Path(spec.width_profile) if spec.width_profile else profile_path,
    )


def _summary(result) -> str:
    t = result.timings
    rows = [
        ("method", result.method),
        ("new tokens", f"{len(result.token_ids)} ({result.finish_reason})"),
        ("rounds", result.num_rounds),
        ("mean committed length R", f"{result.mean_accept_length:.2f}"),
        ("drafted rounds", f"{sum(result.drafted)} of {result.num_rounds}"),
        ("decode ms/token", f"{result.decode_ms_per_token:.1f}"),
        ("tokens/s", f"{result.tokens_per_s:.1f}"),
        ("TTFT ms", f"{t.ttft_ms:.1f}"),
        ("draft / verify / overhead ms", f"{t.draft_ms:.0f} / {t.verify_ms:.0f} / {t.overhead_ms:.0f}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


@click.command("generate", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--prompt", required=True, help="Prompt text (wrapped in the chat template unless --no-chat).")
@click.option("--method", type=click.Choice(["ar", "chain", "cast"]), default="cast", show_default=True,
              help="ar: autoregressive; chain: standard DFlash (top-1 block); cast: best-first tree.")
@click.option("--budget", type=BudgetType(), default="15", show_default=True,
              help="CAST tree budget N (nonroot nodes per verify), or 'auto' for the width policy.")
@click.option("--profile", "profile_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Width profile JSON used by --budget auto.")
@click.option("--width-rule", type=click.Choice(["table", "marginal"]), default="table", show_default=True,
              help="--budget auto rule: 'table' maximizes (1+g(N))/latency over the profile's measured "
                   "buckets (exact at cliffs); 'marginal' is Theorem 2's stopping rule on the fitted slope.")
@click.option("--draft-gate/--no-draft-gate", default=True, show_default=True,
              help="--budget auto: skip drafting in rounds where measured AR rounds commit more tokens per ms "
                   "(T > 0 output then keeps the target law but is not bit-reproducible from the seed).")
@click.option("--extra-llm-api-options", "llm_api_options", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="TensorRT-LLM-style YAML whose speculative_config (decoding_type CAST|DFlash, "
                                 "speculative_model, budget, width_profile) overrides the flags above.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Maximum number of new tokens.")
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="Sampling temperature; 0 is greedy (output identical to AR).")
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True,
              help="Keep only the k most likely tokens (0 = off).")
@click.option("--top-p", type=click.FloatRange(min=0.0, max=1.0, min_open=True), default=1.0, show_default=True,
              help="Nucleus sampling mass in (0, 1] (1 = off).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sampler (and of a random drafter).")
@click.option("--stop", "stop_strings", multiple=True, help="Stop string (repeatable); output ends with it.")
@click.option("--drafter", "drafter_path", type=click.Path(path_type=Path), default=None,
              help="DFlash drafter checkpoint directory (config.json + model.safetensors).")
@click.option("--chat/--no-chat", default=True, show_default=True, help="Apply the tokenizer's chat template.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="Where to run (auto: CUDA when available).")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16"]), default="auto", show_default=True,
              help="Model dtype (auto: bfloat16 on CUDA, float32 on CPU).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch CPU threads (default: torch's choice; 1 is faster on a busy shared CPU).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text + summary.")
def generate(prompt, method, budget, profile_path, width_rule, draft_gate, llm_api_options, max_new_tokens, temperature, top_k, top_p, seed,
             stop_strings, drafter_path, chat, device, dtype, threads, as_json) -> None:
    """Generate text with the embedded SmolLM2-135M target (lossless speculative decoding)."""
    if not prompt.strip():
        raise click.BadParameter("the prompt is empty", param_hint="--prompt")
    if any(not s for s in stop_strings):
        raise click.BadParameter("stop strings must be non-empty", param_hint="--stop")
    method, budget, drafter_path, profile_path = _apply_llm_api_options(
        llm_api_options, method, budget, drafter_path, profile_path)
    from cast_trtllm.sampling import SamplingParams
    from runtime.decoder import DecodeConfig, Decoder
    from runtime.drafter import DrafterExecutor
    from runtime.embedded import EmbeddedModelMissing, encode_prompt, load_embedded
    from runtime.target import TargetExecutor

    torch_device, torch_dtype = _device_and_dtype(device, dtype)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    os.environ.setdefault("TQDM_DISABLE", "1")  # the gguf dequantization bar
    try:
        loaded = load_embedded(torch_device, torch_dtype)
    except EmbeddedModelMissing as err:
        raise click.ClickException(str(err)) from err
    prompt_ids = encode_prompt(loaded.tokenizer, prompt, chat)
    window = loaded.model.config.context_window
    if len(prompt_ids) >= window:
        raise click.BadParameter(
            f"the prompt has {len(prompt_ids)} tokens; the context window holds {window}", param_hint="--prompt"
        )
    drafter = None
    if method != "ar":
        drafter = DrafterExecutor(_drafter_for(drafter_path, loaded.model, seed), loaded.model)
    policy = None
    if method == "cast" and budget == "auto":
        policy = _width_policy(profile_path, len(prompt_ids), width_rule, torch_device, torch_dtype, loaded.name,
                               drafter.drafter.config.mass_exponent)
    target = TargetExecutor(loaded.model, drafter.tap_layer_ids if drafter else ())
    decoder = Decoder(target, drafter, loaded.tokenizer, loaded.eos_token_ids)
    config = DecodeConfig(
        method=method,
        budget=15 if budget == "auto" else budget,
        width_policy=policy,
        draft_gate=draft_gate and policy is not None,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        stop_strings=tuple(stop_strings),
    )
    try:
        result = decoder.generate(prompt_ids, config)
    except ValueError as err:
        raise click.ClickException(str(err)) from err
    if as_json:
        click.echo(json.dumps(result.to_dict()))
    else:
        click.echo(result.text)
        click.echo("")
        click.echo(_summary(result))
