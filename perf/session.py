"""Load the engine once and hand the harness a `decode` callable.

The engine is the one every command and the server run (`runtime.engine.build`): any
target and drafter the loader accepts, the one `SpecConfig`. Each benchmarked method is a
per-request override (method, budget, draft gate) of that engine; an outside peer
(`perf.peers`: `hf`, `dflash`) runs on the same target weights in a process of its own,
started on first use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from cast_trtllm.sampling import SamplingParams
from perf.harness import MethodSpec


@dataclass(slots=True)
class DecodeSession:
    built: Any  # runtime.engine.build.Built
    ignore_eos: bool = False
    chat: bool = True
    peers: Any = None  # perf.peers.PeerProcess, started on first use
    peer_threads: int = 1  # torch threads of the peers' process

    @property
    def engine(self) -> dict[str, Any]:
        """The report's `engine` block."""
        return {**self.built.describe(), "ignore_eos": self.ignore_eos, "chat_template": self.chat}

    def peer(self, name: str, prompt_ids: Sequence[int], max_new_tokens: int):
        if self.peers is None:
            from perf.peers import PeerProcess

            self.peers = PeerProcess(self.built.models.source, getattr(self.built.models, "drafter_source", None),
                                     self.ignore_eos, self.peer_threads)
        return self.peers(name, prompt_ids, max_new_tokens)

    def encode(self, prompt: str) -> list[int]:
        return self.built.encode(prompt, self.chat)

    def __call__(self, prompt_ids: Sequence[int], spec: MethodSpec, max_new_tokens: int,
                 sampling: SamplingParams):
        """Decode one prompt: (GenerationResult, per-step TVs for a relaxed spec else None)."""
        from runtime.engine import Request

        if spec.method in ("hf", "dflash"):
            if not sampling.greedy:
                raise ValueError(f"peer {spec.method} runs greedy only: drop --temperature")
            return self.peer(spec.method, prompt_ids, max_new_tokens), None
        auto = spec.method == "cast" and spec.budget is None
        request = Request(tuple(prompt_ids), max_new_tokens, sampling, method=spec.method,
                          budget="auto" if auto else spec.budget, draft_gate=spec.draft_gate if auto else None,
                          ignore_eos=self.ignore_eos)
        engine = self.built.engine
        if spec.relaxed is None:
            return engine.generate([request])[0], None
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
