"""Load the engine once and hand the harness a `decode` callable.

The engine is the one every command and the server run (`runtime.engine.build`): any
target and drafter the loader accepts, the one `SpecConfig`. Each benchmarked method is a
per-request override (method, budget, draft gate) of that engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from cast_trtllm.sampling import SamplingParams
from perf.harness import MethodSpec


@dataclass(slots=True)
class DecodeSession:
    built: Any  # runtime.engine.build.Built
    ignore_eos: bool = False
    chat: bool = True
    variants: dict[str, Any] = field(default_factory=dict)  # perf.variants.Variant per name, built on first use

    @property
    def engine(self) -> dict[str, Any]:
        """The report's `engine` block."""
        return {**self.built.describe(), "ignore_eos": self.ignore_eos, "chat_template": self.chat,
                "variants": {k: v.description for k, v in self.variants.items()}}

    def _run(self, spec: MethodSpec, request: Any):
        if spec.variant is None:
            return self.built.engine.generate([request])[0]
        import torch

        from perf.variants import build_variant

        if spec.variant not in self.variants:
            self.variants[spec.variant] = build_variant(spec.variant, self.built)
        variant, threads = self.variants[spec.variant], torch.get_num_threads()
        torch.set_num_threads(variant.threads or threads)
        try:
            return variant.engine.generate([request])[0]
        finally:
            torch.set_num_threads(threads)

    def encode(self, prompt: str) -> list[int]:
        return self.built.encode(prompt, self.chat)

    def __call__(self, prompt_ids: Sequence[int], spec: MethodSpec, max_new_tokens: int,
                 sampling: SamplingParams):
        """Decode one prompt: (GenerationResult, per-step TVs for a relaxed spec else None)."""
        from runtime.engine import Request

        auto = spec.method == "cast" and spec.budget is None
        request = Request(tuple(prompt_ids), max_new_tokens, sampling, method=spec.method,
                          budget="auto" if auto else spec.budget, draft_gate=spec.draft_gate if auto else None,
                          ignore_eos=self.ignore_eos)
        engine = self.built.engine
        if spec.relaxed is None:
            return self._run(spec, request), None
        from perf.relaxed_eval import RelaxedEngine, step_tvs

        if not isinstance(engine, RelaxedEngine):
            raise ValueError("relaxed rules need a session loaded with relaxed=True")
        if sampling.greedy:
            raise ValueError("relaxed rules are sampling rules: pass --temperature > 0")
        engine.rule, engine.rounds = spec.relaxed, []
        try:
            result = engine.generate([request])[0]
        finally:
            engine.rule = None
        tvs = step_tvs(spec.relaxed, engine.rounds, sampling)
        engine.rounds = []
        return result, tvs


def load_session(opts: Any, ignore_eos: bool = False, chat: bool = True, relaxed: bool = False) -> DecodeSession:
    """`opts`: `runtime.options.EngineOptions`. `relaxed` swaps in the relaxed-rule engine."""
    from runtime.options import engine_from_options

    built = engine_from_options(opts)
    if relaxed:
        from perf.relaxed_eval import RelaxedEngine

        built.engine.__class__ = RelaxedEngine
        built.engine.rule, built.engine.rounds = None, []
    return DecodeSession(built, ignore_eos, chat)
