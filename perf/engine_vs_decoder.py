"""No-regression check of the one engine against the single-request `Decoder` it replaced.

The old loop (`runtime/decoder.py` with its single-request drafter, as of commit
LEGACY_COMMIT) is read from git history into a temporary package and run side by side
with `LLMEngine` at B = 1 in ONE process, interleaved per prompt (order alternating), on
the same target weights, drafter weights, width profile and prompts. Greedy outputs must
be identical; decode ms/token is compared as a ratio.

    python -m perf.engine_vs_decoder --num-prompts 5 --max-new-tokens 64 \
        --out perf/results/engine_vs_decoder.json
"""

from __future__ import annotations

import importlib
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import click
import torch

LEGACY_COMMIT = "505090a"
LEGACY_FILES = {"decoder": "runtime/decoder.py", "executor": "runtime/drafter/executor.py",
                "model": "runtime/drafter/model.py"}
REPO = Path(__file__).resolve().parents[1]


def load_legacy(commit: str = LEGACY_COMMIT):
    """(Decoder, DecodeConfig, DrafterExecutor, DFlashDrafter) of the old single-request loop."""
    root = Path(tempfile.mkdtemp(prefix="legacy-cast-"))
    pkg = root / "legacy_cast"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, path in LEGACY_FILES.items():
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{path}"], check=True,
                              capture_output=True, text=True).stdout
        text = text.replace("from runtime.drafter.model import", "from legacy_cast.model import")
        (pkg / f"{name}.py").write_text(text)
    sys.path.insert(0, str(root))
    dec, ex, model = (importlib.import_module(f"legacy_cast.{n}") for n in ("decoder", "executor", "model"))
    return dec.Decoder, dec.DecodeConfig, ex.DrafterExecutor, model.DFlashDrafter


@click.command()
@click.option("--dataset", default="gsm8k", show_default=True)
@click.option("--num-prompts", type=int, default=5, show_default=True)
@click.option("--max-new-tokens", type=int, default=64, show_default=True)
@click.option("--threads", type=int, default=1, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), default="perf/results/engine_vs_decoder.json", show_default=True)
def main(dataset, num_prompts, max_new_tokens, threads, out) -> None:
    """ms/token of the one engine vs the old Decoder (ar, chain, cast:auto), side by side."""
    from cast_trtllm.spec_config import SpecConfig
    from perf.datasets import load_dataset
    from perf.report import machine_info
    from runtime.drafter import DrafterExecutor
    from runtime.engine import LLMEngine, Request
    from runtime.engine.build import width_source
    from runtime.loader import encode_prompt, load_models
    from runtime.target import TargetExecutor

    torch.set_num_threads(threads)
    Decoder, DecodeConfig, OldExecutor, OldDrafter = load_legacy()
    models = load_models("embedded", "default", "cpu", "float32")
    target, spec = models.target, SpecConfig()
    new_drafter = DrafterExecutor(models.drafter, target)
    width, profile = width_source(spec, models.name, torch.float32, torch.device("cpu"), new_drafter.mass_exponent)
    old = OldDrafter(models.drafter.config)
    old.load_state_dict(models.drafter.state_dict())
    old_executor = OldExecutor(old.eval(), target)
    engine = LLMEngine(target, new_drafter, models.tokenizer, models.eos_token_ids, spec, width)
    decoder = Decoder(TargetExecutor(target, old_executor.tap_layer_ids), old_executor, models.tokenizer,
                      models.eos_token_ids)
    prompts = [encode_prompt(models.tokenizer, r.prompt, True)
               for r in load_dataset(dataset, num_prompts + 1, max_new_tokens)]
    methods = ("ar", "chain", "cast:auto")
    rows: dict[str, dict[str, list[float]]] = {m: {"engine": [], "decoder": []} for m in methods}
    equal = {m: True for m in methods}

    def run_engine(ids, method):
        m, _, b = method.partition(":")
        return engine.generate([Request(ids, max_new_tokens, method=m, budget=b or None, ignore_eos=True)])[0]

    def run_decoder(ids, method):
        m, _, b = method.partition(":")
        policy = width(len(ids)) if b == "auto" else None
        cfg = DecodeConfig(method=m, budget=15, width_policy=policy, draft_gate=b == "auto",
                           max_new_tokens=max_new_tokens)
        decoder.eos_token_ids = ()
        return decoder.generate(ids, cfg)

    for i, ids in enumerate(prompts):
        for method in methods:
            order = [("engine", run_engine), ("decoder", run_decoder)][:: 1 if i % 2 else -1]
            outs = {name: fn(ids, method) for name, fn in order}
            if i == 0:
                continue  # warm-up prompt
            for name, res in outs.items():
                rows[method][name].append(res.decode_ms_per_token)
            equal[method] &= outs["engine"].token_ids == outs["decoder"].token_ids
    summary = {m: {"engine_ms_per_token": statistics.median(r["engine"]),
                   "decoder_ms_per_token": statistics.median(r["decoder"]),
                   "engine_over_decoder": statistics.median(r["engine"]) / statistics.median(r["decoder"]),
                   "greedy_outputs_equal": equal[m]} for m, r in rows.items()}
    report = {"summary": summary, "per_prompt_ms": rows, "width_profile": profile,
              "settings": {"dataset": dataset, "num_prompts": num_prompts, "max_new_tokens": max_new_tokens,
                           "threads": threads, "legacy_commit": LEGACY_COMMIT, "machine": machine_info()}}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report, indent=2) + "\n")
    for m, s in summary.items():
        click.echo(f"{m:10s} engine {s['engine_ms_per_token']:.1f} ms/token, decoder {s['decoder_ms_per_token']:.1f}"
                   f" -> ratio {s['engine_over_decoder']:.3f}; outputs equal: {s['greedy_outputs_equal']}")


if __name__ == "__main__":
    main()
