"""Assemble the engine every command runs: ONE place joins target + drafter + width rule.

`build_engine(target, drafter, spec, ...)` loads the models with `runtime.loader`
(`--target embedded | <HF dir> | <file.gguf>`, `--drafter default | <dir> | none`),
picks the device and — unless the caller fixes them — the fastest dtype and thread count
measured for this model on this machine (`runtime.engine.autoconfig`, cached), and gives
`budget: auto` its width rule: the width profile named in the spec, else the
probe-measured profile shipped for this target, dtype and device.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from cast_trtllm.spec_config import SpecConfig
from runtime.engine.engine import LLMEngine
from runtime.engine.trees import WidthSource


@dataclass(frozen=True, slots=True)
class Built:
    engine: LLMEngine
    models: Any  # runtime.loader.LoadedModels
    device: torch.device
    width_profile: str | None  # the profile `auto` uses (None: auto unavailable)
    execution: str = "as asked"  # how dtype/threads were chosen

    def encode(self, prompt: str, chat: bool = True) -> list[int]:
        from runtime.loader import encode_prompt

        return encode_prompt(self.models.tokenizer, prompt, chat)

    def describe(self) -> dict[str, Any]:
        """The report's `engine` block: what ran."""
        drafter = self.engine.drafter
        return {
            "target": self.models.name, "target_source": self.models.source,
            "dtype": str(self.models.dtype).removeprefix("torch."), "device": self.device.type,
            "threads": torch.get_num_threads(),
            "drafter": None if drafter is None else str(getattr(self.models, "drafter_source", "loaded")),
            "block_positions_L": None if drafter is None else drafter.num_draft_positions,
            "rank_cap_K": self.engine.spec.rank_cap, "width_profile": self.width_profile,
            "width_rule": self.engine.spec.width_rule, "draft_gate": self.engine.spec.draft_gate,
            "backend": self.engine.target.name, "execution": self.execution,
        }


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: CUDA is not available on this machine")
    return device


def width_source(spec: SpecConfig, target_name: str, dtype: torch.dtype, device: torch.device,
                 mass_exponent: float) -> tuple[WidthSource | None, str | None]:
    """The per-prefix width rule of `auto`, and the profile it reads (None: none fits)."""
    from cast_trtllm.profile import find_measured_profile, load_profile
    from cast_trtllm.width import WidthPolicy
    from runtime.device import device_name

    path = spec.width_profile
    if path is None:
        found = find_measured_profile(target_name, str(dtype).removeprefix("torch."), device.type, device_name(device))
        path = None if found is None else str(found)
    if path is None:
        return None, None
    profile = load_profile(path)

    @lru_cache(maxsize=None)
    def for_bucket(prefix_bucket: int):
        return WidthPolicy.from_profile(profile, prefix_bucket, rule=spec.width_rule, rank_cap=spec.rank_cap,
                                        mass_exponent=mass_exponent)

    return (lambda prefix_len: for_bucket(profile.prefix_bucket(prefix_len))), path


def _stderr(message: str) -> None:
    print(f"[cast-trtllm] {message}", file=sys.stderr, flush=True)


def build_engine(target: str = "embedded", drafter: str = "default", spec: SpecConfig = SpecConfig(),
                 device: str | torch.device = "auto", dtype: str | torch.dtype | None = None,
                 threads: int | None = None, say=_stderr) -> Built:
    """Load the models once and build the engine every command runs.

    dtype None/"auto" on a CPU: the fastest (dtype, threads) measured for this model on
    this machine, from the cache or a first-use probe (`say` reports which, and why).
    """
    from runtime.device import device_name
    from runtime.drafter.executor import DrafterExecutor
    from runtime.engine import autoconfig
    from runtime.loader import load_models

    dev = resolve_device(device)
    auto = dtype in (None, "auto") and dev.type == "cpu"
    choice, execution = None, "as asked"
    if auto:
        key = autoconfig.cache_key(device_name(dev), target)
        choice = autoconfig.cached_choice(key)
        if choice is not None:
            dtype, execution = choice.dtype, f"cached: {choice.describe()}"
    if threads is not None:
        torch.set_num_threads(threads)
    models = load_models(target, drafter, dev, None if dtype == "auto" else dtype)
    if auto and choice is None:
        say("measuring the fastest execution configuration for this model on this machine (once; cached)")
        choice = autoconfig.measure(models.target, dev, device_name(dev), key, say)
        path = autoconfig.save_choice(choice)
        execution = f"measured now (cache {path}): {choice.describe()}"
        if getattr(torch, choice.dtype) != models.dtype:
            models = dataclasses.replace(models, target=models.target.to(getattr(torch, choice.dtype)),
                                         dtype=getattr(torch, choice.dtype))
    if choice is not None and threads is None:
        torch.set_num_threads(choice.threads)
    if auto:
        say(f"execution: torch {str(models.dtype).removeprefix('torch.')}, {torch.get_num_threads()} thread(s) "
            f"({execution})")
    draft = None if models.drafter is None else DrafterExecutor(models.drafter, models.target)
    width, path = (None, None)
    if draft is not None:
        width, path = width_source(spec, models.name, models.dtype, dev, draft.mass_exponent)
    engine = LLMEngine(models.target, draft, models.tokenizer, models.eos_token_ids, spec, width)
    return Built(engine, models, dev, path, execution)
