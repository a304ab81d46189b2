"""`cast-trtllm generate`: one prompt through the engine (AR, DFlash chain or CAST)."""

from __future__ import annotations

import json
import os

import click

from runtime.options import engine_from_options, engine_options, model_options, spec_options


def _summary(result, built) -> str:
    t = result.timings
    d = built.describe()
    rows = [
        ("target", f"{d['target']} ({d['dtype']}, {d['device']}, {d['threads']} threads)"),
        ("method", result.method),
        ("new tokens", f"{len(result.token_ids)} ({result.finish_reason})"),
        ("rounds", result.num_rounds),
        ("mean committed length R", f"{result.mean_accept_length:.2f}"),
        ("drafted rounds", f"{sum(result.drafted)} of {result.num_rounds}"),
        ("mean tree size N", f"{sum(result.budgets) / max(len(result.budgets), 1):.1f}"),
        ("decode ms/token", f"{result.decode_ms_per_token:.1f}"),
        ("tokens/s", f"{result.tokens_per_s:.1f}"),
        ("TTFT ms", f"{t.ttft_ms:.1f}"),
        ("draft / verify / overhead ms", f"{t.draft_ms:.0f} / {t.verify_ms:.0f} / {t.overhead_ms:.0f}"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


@click.command("generate", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--prompt", required=True, help="Prompt text (wrapped in the chat template unless --no-chat).")
@model_options
@spec_options
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Maximum number of new tokens.")
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="Sampling temperature; 0 is greedy (output identical to AR).")
@click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True,
              help="Keep only the k most likely tokens (0 = off).")
@click.option("--top-p", type=click.FloatRange(min=0.0, max=1.0, min_open=True), default=1.0, show_default=True,
              help="Nucleus sampling mass in (0, 1] (1 = off).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the sampler: a run repeats exactly with a fixed --budget N (auto's widths follow "
                   "measured timings, so its sampled stream may vary; its law does not).")
@click.option("--stop", "stop_strings", multiple=True, help="Stop string (repeatable); output ends with it.")
@click.option("--ignore-eos", is_flag=True, help="Keep generating past end-of-sequence tokens.")
@click.option("--min-tokens", type=click.IntRange(min=0), default=0, show_default=True,
              help="No end-of-sequence token before this many new tokens (applied to the target's logits).")
@click.option("--bad-word", "bad_words", multiple=True, help="A word never generated (repeatable).")
@click.option("--logprobs", type=click.IntRange(0, 20), default=None,
              help="Keep each token's logprob and its K most likely alternatives (--json prints them).")
@click.option("--repetition-penalty", type=float, default=None,
              help="TensorRT-LLM's repetition penalty (> 0; 1 = off), on the target's rows.")
@click.option("--presence-penalty", type=float, default=None, help="Presence penalty (0 = off), on the target's rows.")
@click.option("--frequency-penalty", type=float, default=None,
              help="Frequency penalty (0 = off), on the target's rows.")
@click.option("--min-p", type=float, default=None, help="min-p in [0, 1] (0 = off; no effect when greedy).")
@click.option("--chat/--no-chat", default=True, show_default=True, help="Apply the tokenizer's chat template.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text + summary.")
def generate(prompt, max_new_tokens, temperature, top_k, top_p, seed, stop_strings, ignore_eos, min_tokens,
             bad_words, logprobs, repetition_penalty, presence_penalty, frequency_penalty, min_p, chat, as_json,
             **options) -> None:
    """Generate text with lossless speculative decoding (greedy output == autoregressive output)."""
    if not prompt.strip():
        raise click.BadParameter("the prompt is empty", param_hint="--prompt")
    if any(not s for s in stop_strings):
        raise click.BadParameter("stop strings must be non-empty", param_hint="--stop")
    if any(not w for w in bad_words):
        raise click.BadParameter("a bad word has no tokens: send non-empty words", param_hint="--bad-word")
    from cast_trtllm.sampling_params import SamplingParams
    from runtime.llm.requests import engine_request

    try:  # the one SamplingParams every surface builds its requests through
        params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_k=top_k or None, top_p=top_p,
                                seed=seed, stop=list(stop_strings) or None, ignore_eos=ignore_eos,
                                min_tokens=min_tokens, bad=list(bad_words) or None, logprobs=logprobs,
                                repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                                frequency_penalty=frequency_penalty, min_p=min_p)
    except ValueError as err:
        raise click.BadParameter(str(err)) from err
    opts = engine_options(**options)
    os.environ.setdefault("TQDM_DISABLE", "1")  # the gguf dequantization bar
    built = engine_from_options(opts)
    try:
        request = engine_request(params, built.encode(prompt, chat), built.models.tokenizer)
        result = built.engine.generate([request])[0]
    except ValueError as err:
        raise click.ClickException(str(err)) from err
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "engine": built.describe()}))
    else:
        click.echo(result.text)
        click.echo("")
        click.echo(_summary(result, built))
