"""Execution variants of one benchmark session: the same checkpoint run on another
backend, dtype or thread count, side by side with the session's default engine.

A method label may carry `@VARIANT`, VARIANT = `fp32` | `bf16` | `ort`, optionally
`-t<threads>` (e.g. `ar@bf16`, `ar@ort-t2`, `cast:auto@fp32-t2`). Each variant gets its
own engine over a converted copy of the target (and drafter), its own learned cost
table, and runs with its own torch thread count, restored afterwards.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

import torch

VARIANT = re.compile(r"^(fp32|bf16|ort)(?:-t([1-9][0-9]*))?$")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "ort": torch.float32}


def check_variant(text: str) -> str:
    if not VARIANT.match(text):
        raise ValueError(f"execution variant {text!r}: expected fp32, bf16 or ort, optionally -t<threads> "
                         "(e.g. bf16-t2)")
    return text


@dataclass(slots=True)
class Variant:
    engine: Any  # runtime.engine.LLMEngine
    threads: int | None
    description: str


def build_variant(text: str, built: Any) -> Variant:
    """The engine of variant `text` next to `built` (runtime.engine.build.Built)."""
    from runtime.engine import LLMEngine
    from runtime.engine.autoconfig import make_backend, make_drafter
    from runtime.engine.build import drafter_identity, online_cost

    kind, threads = VARIANT.match(check_variant(text)).groups()
    threads = int(threads) if threads else None
    base = built.engine
    model = base.target.model
    dtype = DTYPES[kind]
    if model.lm_head.weight.dtype != dtype:
        model = copy.deepcopy(model).to(dtype)
    taps = base.target.tap_layer_ids
    backend = make_backend("onnxruntime" if kind == "ort" else "torch", model, taps,
                           threads or torch.get_num_threads())
    drafter, cost, width = None, None, None
    if base.drafter is not None:
        drafter = make_drafter(backend.name, copy.deepcopy(built.models.drafter), model, threads or torch.get_num_threads())
        previous = torch.get_num_threads()
        torch.set_num_threads(threads or previous)
        try:
            cost, _, _ = online_cost(base.spec, built.models.name, dtype, built.device, backend.name,
                                     drafter.mass_exponent, base.spec.max_nodes(drafter.num_draft_positions), None,
                                     drafter_identity(built.models.drafter))
        finally:
            torch.set_num_threads(previous)
        width = lambda prefix_len: cost
    engine = LLMEngine(backend, drafter, base.tokenizer, base.eos_token_ids, base.spec, width, cost)
    return Variant(engine, threads, f"{backend.name} {str(dtype).removeprefix('torch.')}"
                                    f"{'' if threads is None else f', {threads} thread(s)'}")
