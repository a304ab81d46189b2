"""Run AR / DFlash-chain / CAST on one prompt set through the one decoding loop.

Timing protocol (paper App. D): every method runs the same prompts, the same token
budget and the same engine (`runtime.engine.LLMEngine`); the decode-only window of
`runtime.result.Timings` (prefill and the first draft excluded) gives ms/token. Methods
are interleaved per prompt and their order rotates from prompt to prompt (prompt 1: ar,
chain, cast; prompt 2: chain, cast, ar; ...), so slow drift of a shared machine, and
whatever one method leaves behind for the next (allocator, caches), hits every method
alike. Every method is warmed up once on the first prompt before anything is timed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from tqdm import tqdm

from cast_trtllm.sampling import SamplingParams
from perf.datasets import Request

WARMUP_TOKENS = 16


@dataclass(frozen=True, slots=True)
class MethodSpec:
    """One benchmarked configuration: `ar`, `chain`, `cast:N`, `cast:auto` (width policy
    plus the draft gate, `cast_trtllm.draft_gate`) or `cast:auto-ungated` (width policy
    only), optionally with a LOSSY relaxed acceptance rule (`cast_trtllm.relaxed.RelaxedRule`);
    or an outside peer on the same target (`perf.peers`): `hf` (transformers `generate`,
    greedy AR) or `dflash` (z-lab's reference chain decoding with the same drafter head);
    or, in throughput mode, `best-first:W` (one W x B budget shared by best-first mass)."""

    method: str              # ar | chain | cast | hf | dflash | best-first
    budget: int | None = None  # cast: fixed N, None = auto (width profile); best-first: W
    relaxed: Any = None      # RelaxedRule | None
    draft_gate: bool = False  # cast:auto: skip drafting where AR measures faster

    def __post_init__(self) -> None:
        if self.draft_gate and not (self.method == "cast" and self.budget is None):
            raise ValueError("the draft gate belongs to cast:auto")

    @property
    def base_label(self) -> str:
        if self.method == "best-first":
            return f"best-first:{self.budget}"
        if self.method != "cast":
            return self.method
        if self.budget is not None:
            return f"cast:{self.budget}"
        return "cast:auto" if self.draft_gate else "cast:auto-ungated"

    def request_options(self) -> dict[str, Any]:
        """The `runtime.engine.Request` overrides that run this method (best-first:W: `cast` auto, gate
        off, under the caller's shared W x B width rule)."""
        if self.method == "best-first":
            return {"method": "cast", "budget": "auto", "draft_gate": False}
        auto = self.method == "cast" and self.budget is None
        return {"method": self.method, "budget": "auto" if auto else self.budget,
                "draft_gate": self.draft_gate if auto else None}

    @property
    def label(self) -> str:
        if self.relaxed is None:
            return self.base_label
        return f"{self.base_label}+{self.relaxed.name}:{self.relaxed.alpha:g}"


def parse_methods(text: str) -> list[MethodSpec]:
    """`ar,chain,cast:15,cast:auto,cast:auto-ungated,hf,dflash,best-first:8` -> specs; bare `cast` means
    `cast:auto`."""
    specs = []
    for item in (s.strip() for s in text.split(",")):
        name, _, arg = item.partition(":")
        if name in ("ar", "chain", "hf", "dflash") and not arg:
            specs.append(MethodSpec(name))
        elif name == "cast" and arg in ("", "auto", "auto-ungated"):
            specs.append(MethodSpec("cast", draft_gate=arg != "auto-ungated"))
        elif name in ("cast", "best-first") and arg.isdigit() and int(arg) >= 1:
            specs.append(MethodSpec(name, int(arg)))
        else:
            raise ValueError(f"--methods item {item!r}: expected ar, chain, cast, cast:auto, cast:auto-ungated, "
                             "cast:N (N >= 1), best-first:W, or a peer: hf, dflash")
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"--methods lists a method twice: {labels}")
    return specs


@dataclass(slots=True)
class RequestRun:
    task_id: int
    prompt_tokens: int
    result: Any  # runtime.result.GenerationResult
    step_tvs: list[float] | None = None  # relaxed methods only


@dataclass(slots=True)
class BenchRun:
    specs: list[MethodSpec]
    runs: dict[str, list[RequestRun]] = field(default_factory=dict)  # label -> per request


def run_bench(
    requests: Sequence[Request],
    specs: Sequence[MethodSpec],
    decode: Callable[..., tuple[Any, list[float] | None]],
    encode: Callable[[str], list[int]],
    sampling: SamplingParams,
    warmup: bool = True,
    progress: bool = True,
    after_warmup: Callable[[], Any] = lambda: None,
) -> BenchRun:
    """Decode every request with every method (interleaved per prompt, order rotated) and collect results.

    decode(prompt ids, spec, max new tokens, sampling) -> (`runtime.result.GenerationResult`, per-step
    TV from the target law of every committed token, or None for a lossless method). At T > 0 each
    request gets the same seed for every method (seed + task index), so runs are reproducible.
    """
    if not requests or not specs:
        raise ValueError("run_bench needs at least one request and one method")
    prompts = [list(r.input_ids) if r.input_ids is not None else encode(r.prompt) for r in requests]
    budgets = [r.output_tokens for r in requests]
    base_seed = sampling.seed if sampling.seed is not None else 0
    if warmup:
        for spec in specs:
            decode(prompts[0], spec, min(WARMUP_TOKENS, budgets[0]), replace(sampling, seed=base_seed))
        after_warmup()
    out = BenchRun(list(specs), {s.label: [] for s in specs})
    bar = tqdm(total=len(requests) * len(specs), desc="bench", unit="run", disable=not progress)
    for i, (request, ids) in enumerate(zip(requests, prompts)):
        shift = i % len(specs)
        for spec in [*specs[shift:], *specs[:shift]]:
            bar.set_postfix_str(f"task {request.task_id} {spec.label}")
            result, tvs = decode(ids, spec, budgets[i], replace(sampling, seed=base_seed + i))
            out.runs[spec.label].append(RequestRun(request.task_id, len(ids), result, tvs))
            bar.update()
    bar.close()
    return out
