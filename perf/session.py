"""Load the engine once and hand the harness a `decode` callable.

The engine is the one every command and the server run (`runtime.engine.build`): any
target and drafter the loader accepts, the one `SpecConfig`. Each benchmarked method is a
per-request override (method, budget, draft gate) of that engine; an outside peer
(`perf.peers`: `hf`, `dflash`) runs on the same target weights in a process of its own,
started on first use.

`latency --round-parts` times the parts of the engine's own round in place
(`time_round_parts`): the drafter's feature-cache update, the draft, the tree choice, the
verify pass and the commit, per method, over the decode rounds (a round that starts with the
request's prompt still prefilling is not one).
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
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
    round_parts: dict[str, dict[str, float]] | None = None  # label -> part -> s (and "round", "rounds")
    _tally: dict[str, float] = field(default_factory=dict)  # the running method's, under round_parts

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
        request = Request(tuple(prompt_ids), max_new_tokens, sampling, ignore_eos=self.ignore_eos,
                          **spec.request_options())
        engine = self.built.engine
        if self.round_parts is not None:
            self._tally = self.round_parts.setdefault(spec.label, defaultdict(float))
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


    def time_round_parts(self) -> None:
        """From now on tally each part of every decode round by method (wrappers set on the engine instance)."""
        engine, self.round_parts = self.built.engine, {}
        parts = {"feature cache": (engine, "_append_contexts"), "draft": (engine, "_draft"),
                 "trees (host)": (engine, "_trees"), "verify": (engine.target, "verify_trees"),
                 "commit (host)": (engine, "_commit"), "round": (engine, "step")}
        decoding = [False]

        def timed(part: str, fn):
            def call(*args, **kwargs):
                if part == "round":  # a decode round: no live request is still prefilling its prompt
                    decoding[0] = not any(s.prefilling for s in engine.active)
                    self._tally["rounds"] += decoding[0]
                start = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    if decoding[0]:
                        self._tally[part] += time.perf_counter() - start
            return call

        for part, (obj, name) in parts.items():
            setattr(obj, name, timed(part, getattr(obj, name)))

    def round_parts_ms(self) -> dict[str, dict[str, float]]:
        """ms per decode round of each part and of the whole round, per method (then the tally restarts)."""
        out = {label: {part: (v if part == "rounds" else 1e3 * v / t["rounds"]) for part, v in t.items()}
               for label, t in (self.round_parts or {}).items() if t["rounds"]}
        self.round_parts = None if self.round_parts is None else {}
        return out


def load_session(engine: dict[str, Any], params: dict[str, Any], relaxed: bool = False) -> DecodeSession:
    """The one engine the servers run (`engine`: options for `runtime.options.engine_options`; `params`:
    the run options). `relaxed` swaps in the relaxed-rule engine."""
    from runtime.options import engine_from_options, engine_options

    built = engine_from_options(engine_options(**engine))
    if relaxed:
        from perf.relaxed_eval import RelaxedEngine

        built.engine.__class__ = RelaxedEngine
        built.engine.rule, built.engine.rounds = None, []
    return DecodeSession(built, not params["stop_at_eos"], not params["no_chat"])
