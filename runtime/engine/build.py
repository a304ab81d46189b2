"""Assemble the engine every command runs: ONE place joins target + drafter + width rule.

`build_engine(target, drafter, spec, ...)` loads the models with `runtime.loader`
(`--target embedded | <HF dir> | <file.gguf>`, `--drafter default | <dir> | none`),
picks the device and — unless the caller fixes them — the fastest dtype and thread count
measured for this model on this machine (`runtime.engine.autoconfig`, cached), and gives
`budget: auto` its width rule: the width profile named in the spec, else the
probe-measured profile shipped for this target, dtype and device.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import hashlib
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
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
    width_profile: str | None  # what `auto` prices trees with (None: auto unavailable)
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
            "drafter": None if drafter is None else getattr(self.models, "drafter_source", None),
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


def _prior_profile(spec: SpecConfig, target_name: str, dtype: torch.dtype, device: torch.device):
    """(profile, path) the cost model starts from: the one named, else the nearest shipped one."""
    from cast_trtllm.profile import find_measured_profile, load_profile
    from runtime.device import device_name

    path = spec.width_profile
    if path is None:
        found = find_measured_profile(target_name, str(dtype).removeprefix("torch."), device.type, device_name(device))
        path = None if found is None else str(found)
    return (None, None) if path is None else (load_profile(path), path)


def width_source(spec: SpecConfig, target_name: str, dtype: torch.dtype, device: torch.device,
                 mass_exponent: float) -> tuple[WidthSource | None, str | None]:
    """Theorem 2's marginal rule on a fixed width profile (`width_rule: marginal`): the
    per-prefix rule and the profile it reads (None: no profile fits)."""
    from cast_trtllm.width import WidthPolicy

    profile, path = _prior_profile(spec, target_name, dtype, device)
    if profile is None:
        return None, None

    @lru_cache(maxsize=None)
    def for_bucket(prefix_bucket: int):
        return WidthPolicy.from_profile(profile, prefix_bucket, rule=spec.width_rule, rank_cap=spec.rank_cap,
                                        mass_exponent=mass_exponent)

    return (lambda prefix_len: for_bucket(profile.prefix_bucket(prefix_len))), path


def head_identity(drafter: torch.nn.Module) -> str:
    """`head-` + 8 hex digits of the drafter's config and a strided sample of its weights."""
    from runtime.backends.onnx_cache import hash_weights

    digest = hashlib.sha256(repr(drafter.config).encode())
    hash_weights(digest, drafter)
    return "head-" + digest.hexdigest()[:8]


def online_cost(spec: SpecConfig, target_name: str, dtype: torch.dtype, device: torch.device, backend: str,
                mass_exponent: float, max_budget: int, probe_ms: dict[str, float] | None, drafter: str,
                draft_rows: int):
    """The live cost curve of `auto` (table rule): the cached model learned on this machine
    and configuration, else a new one whose prior is this run's first-use probe, else the
    named or nearest profile. Returns (model, cache path, where the prior came from)."""
    from cast_trtllm.cost_cache import cost_cache_key, default_cache_dir
    from cast_trtllm.cost_model import DEFAULT_BUCKETS, OnlineCostModel
    from runtime.device import device_name

    key = cost_cache_key(device_name(device), backend, str(dtype).removeprefix("torch."), torch.get_num_threads(),
                         target_name, drafter)
    path = default_cache_dir() / f"{key}.json"
    knobs = {"mass_exponent": mass_exponent, "rank_cap": spec.rank_cap, "draft_rows": draft_rows,
             "max_budget": min(max_budget, DEFAULT_BUCKETS[-1] - 1)}
    if path.is_file() and spec.width_profile is None:
        try:
            return OnlineCostModel.load(path, **knobs), path, f"learned on this machine ({path})"
        except (ValueError, OSError):
            pass  # a cache from another version: learn again
    profile, profile_path = _prior_profile(spec, target_name, dtype, device)
    if profile is not None and (spec.width_profile is not None or not probe_ms):
        row = profile.latency_ms[profile.prefix_bucket(256)][profile.batch_sizes[0]]
        prior, draft, source = dict(zip(profile.packed_counts, row)), profile.fixed_ms(1), f"profile {profile_path}"
    elif probe_ms:
        prior = {int(k.removeprefix("n=")): v for k, v in probe_ms.items()}
        draft, source = 0.0, "first-use probe on this machine"
    else:
        prior, draft, source = None, 0.0, "no prior (learning from the first rounds)"
    return OnlineCostModel(prior=prior, prior_draft_ms=draft, **knobs), path, source


def _stderr(message: str) -> None:
    print(f"[cast-trtllm] {message}", file=sys.stderr, flush=True)


def build_engine(target: str = "embedded", drafter: str = "default", spec: SpecConfig = SpecConfig(),
                 device: str | torch.device = "auto", dtype: str | torch.dtype | None = None,
                 threads: int | None = None, say=_stderr, engine_dir: str | Path | None = None,
                 max_num_tokens: int = 512) -> Built:
    """Load the models once and build the engine every command runs.

    dtype None/"auto" on a CPU: the fastest (dtype, threads) measured for this model on
    this machine, from the cache or a first-use probe (`say` reports which, and why).
    engine_dir: a built engine directory to run (`runtime.engine.engine_dir`): its
    onnxruntime graphs, fp32 on the CPU, checked against the loaded checkpoints.
    max_num_tokens: tokens per round's target pass (`LLMEngine`; TensorRT-LLM's max_num_tokens).
    """
    from runtime.device import device_name
    from runtime.engine import autoconfig
    from runtime.loader import load_models

    graphs = None
    if engine_dir is not None:
        from runtime.engine.engine_dir import runtime_graphs

        graphs, _ = runtime_graphs(engine_dir)
        if resolve_device(device).type != "cpu" or dtype not in (None, "auto", "float32", torch.float32):
            raise ValueError(f"--engine {engine_dir} runs onnxruntime fp32 graphs on the CPU; drop --device/--dtype")
        device, dtype = "cpu", "float32"
    dev = resolve_device(device)
    auto = dtype in (None, "auto") and dev.type == "cpu"
    choice, execution = None, "as asked" if graphs is None else f"engine directory {engine_dir}"
    if auto:
        key = autoconfig.cache_key(device_name(dev), target)
        choice = autoconfig.cached_choice(key)
        if choice is not None:
            dtype, execution = choice.dtype, f"cached: {choice.describe()}"
    if threads is not None:
        torch.set_num_threads(threads)
    models = load_models(target, drafter, dev, None if dtype == "auto" else dtype)
    taps = () if models.drafter is None else tuple(models.drafter.config.target_layer_ids)
    if auto and choice is None:
        say("measuring the fastest execution configuration for this model on this machine (once; cached)")
        choice = autoconfig.measure(models.target, dev, device_name(dev), key, taps, say)
        path = autoconfig.save_choice(choice)
        execution = f"measured now (cache {path}): {choice.describe()}"
        wanted = getattr(torch, choice.dtype)
        if wanted != models.dtype:
            # a converted copy: Module.to is in place, and the loaded model may be shared (a caller's, a test
            # session's); converted in place, a bf16 pick turned every later fp32 user of it into bf16 rows
            models = dataclasses.replace(models, target=copy.deepcopy(models.target).to(wanted), dtype=wanted)
    if choice is not None and threads is None:
        torch.set_num_threads(choice.threads)
    backend = "onnxruntime" if graphs is not None else "torch" if choice is None else choice.backend
    num_threads = torch.get_num_threads()  # as asked, as chosen, or torch's
    if auto or graphs is not None:
        say(f"execution: {backend} {str(models.dtype).removeprefix('torch.')}, {num_threads} thread(s) ({execution})")
    target = autoconfig.make_backend(backend, models.target, taps, num_threads, graphs)
    draft = None if models.drafter is None else autoconfig.make_drafter(backend, models.drafter, models.target,
                                                                          num_threads, graphs)
    width, path, cost = None, None, None
    if draft is not None and spec.width_rule == "marginal":
        width, path = width_source(spec, models.name, models.dtype, dev, draft.mass_exponent)
    elif draft is not None:
        probe = None if choice is None else choice.measured_ms.get(f"{backend}/{choice.dtype}/{num_threads}")
        cost, cache, source = online_cost(spec, models.name, models.dtype, dev, backend, draft.mass_exponent,
                                          spec.max_nodes(draft.num_draft_positions), probe,
                                          head_identity(models.drafter), draft.num_draft_positions + 1)
        atexit.register(_save_quietly, cost, cache)
        width, path = (lambda prefix_len: cost), f"online cost model; prior: {source}"
    engine = LLMEngine(target, draft, models.tokenizer, models.eos_token_ids, spec, width, cost, max_num_tokens)
    return Built(engine, models, dev, path, execution)


def _save_quietly(model, path) -> None:
    """Keep what this run learned for the next one (best effort at exit)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        model.save(path)
    except OSError:
        pass
