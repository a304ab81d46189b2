"""The whole round loop on a GPU: AR / chain / CAST@15 / CAST auto at B = 1 and B = 32.

A random-weight Qwen3-8B-shaped target (36 layers, hidden 4096, 32/8 heads of 128,
MLP 12288, vocab 151936; bf16) runs through the one engine with a drafter of CONTROLLED,
CALIBRATED acceptance (`OracleDrafter`, a measurement tool for a random-weight target that
no trained head can fit, named as such): at every drafted position it offers K candidate
tokens with probabilities q = (1 - c, c/(K-1), ..., c/(K-1)) over them (-inf elsewhere),
and the target's own greedy continuation sits at rank r drawn from q. The drafter is thus
exactly as confident as it is right: the top-1 chain is accepted per position with
probability 1 - c, and a tree finds the truth in the ranks below. Greedy output must equal AR.

Each row reports ms per token, R (committed per round), N (mean nodes), and the round's
split into draft / verify / host (App. D timings from the engine's own clock).
Shape `tiny` runs the same code on a 2-layer model (the CPU dry run).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import torch

from cast_trtllm.spec_config import SpecConfig
from runtime.engine import LLMEngine, Request
from runtime.model.layers import Rotary, default_inv_freq
from runtime.model.llama import LlamaTarget, TargetConfig

SHAPES = {  # the GPU check's target shapes (random weights)
    "qwen3-8b": TargetConfig(vocab_size=151936, hidden_size=4096, num_layers=36, num_heads=32, num_kv_heads=8,
                             head_dim=128, intermediate_size=12288, rms_norm_eps=1e-6, context_window=40960,
                             qk_norm=True, rope_theta=1e6),
    "tiny": TargetConfig(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                         intermediate_size=128, rms_norm_eps=1e-6, context_window=1024, qk_norm=True, rope_theta=1e6),
}
SIZES = {"qwen3-8b": {"batches": (1, 32), "prompt_len": 256, "new_tokens": 48, "corruption": 0.2,
                      "block_positions": 15},
         "tiny": {"batches": (1, 3), "prompt_len": 16, "new_tokens": 12, "corruption": 0.2, "block_positions": 7}}
METHODS = (("chain", None), ("cast", 15), ("cast", "auto"))
CANDIDATES = 4  # tokens the oracle offers per position (<= the engine's rank cap K = 8)


def random_target(cfg: TargetConfig, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LlamaTarget:
    """Random weights allocated directly on `device` in `dtype`, shaped so that greedy decoding
    has a wide margin: the residual writes (o_proj, down_proj) are damped to std 1e-5, so each
    hidden state stays near its token's embedding, and lm_head is the embedding under a fixed
    random permutation pi, so the next token is pi(current) by a margin bf16 cannot flip.
    Without it (std 0.02 everywhere) a random model's logits are near-ties, a bf16 pass of
    another shape flips one, and every later position of a precomputed continuation is wrong:
    the oracle drafter would measure nothing (the first H200 run read R = 1.0 for the chain).
    Every kernel does the same work whatever the weights' values."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaTarget(cfg, Rotary(default_inv_freq(cfg.head_dim, cfg.rope_theta)))
    model = model.to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            damped = name.endswith(("o_proj.weight", "down_proj.weight"))
            p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0.0, 1e-5 if damped else 0.02)
        perm = torch.randperm(cfg.vocab_size, generator=torch.Generator().manual_seed(seed)).to(device)
        model.lm_head.weight.copy_(model.embed_tokens.weight[perm.argsort()])  # row pi(x) = embedding of x
    return model.eval().requires_grad_(False)


class OracleDrafter:
    """A calibrated drafter of controlled acceptance over known greedy continuations (module
    docstring); the drafter interface of `runtime.drafter.DrafterExecutor`. One upload per
    round: the [B, L, K] candidates are drawn on the host and scattered into -inf logits."""

    tap_layer_ids = (1,)
    mass_exponent = 1.0

    def __init__(self, continuations: Sequence[Sequence[int]], vocab: int, block_positions: int,
                 corruption: float, device: torch.device, seed: int = 0, candidates: int = CANDIDATES) -> None:
        if not 0.0 <= corruption < 1.0:
            raise ValueError(f"corruption must be in [0, 1), got {corruption}")
        self.pending = [list(c) for c in continuations]  # prompt + greedy continuation, per request in order
        self.vocab, self.num_draft_positions, self.device = vocab, block_positions, device
        self.rng, self.k = np.random.default_rng(seed), candidates
        q = np.array([1.0 - corruption] + [corruption / (candidates - 1)] * (candidates - 1))
        self.q, self.logq = q, np.log(np.maximum(q, 1e-30))

    def new_state(self, capacity: int) -> dict:
        return {"ref": self.pending.pop(0), "length": 0}

    def append_context(self, state: dict, taps: torch.Tensor) -> None:
        state["length"] += taps.shape[0]

    def draft(self, states: Sequence[dict], roots: Sequence[int]) -> torch.Tensor:
        B, L, K = len(states), self.num_draft_positions, self.k
        ids = self.rng.integers(self.vocab, size=(B, L, K))  # distractors (a clash with the truth is harmless)
        rank = self.rng.choice(K, size=(B, L), p=self.q)  # where the truth sits
        for b, state in enumerate(states):
            ref, start = state["ref"], state["length"] + 1
            truth = [ref[p] if p < len(ref) else 0 for p in range(start, start + L)]
            ids[b, np.arange(L), rank[b]] = truth
        logits = torch.full((B, L, self.vocab), -torch.inf, device=self.device)
        index = torch.from_numpy(ids).to(self.device, non_blocking=True)
        values = torch.from_numpy(np.broadcast_to(self.logq, (B, L, K)).astype(np.float32)).to(self.device)
        return logits.scatter_(2, index, values)


def engine_for(target, drafter, method: str, budget, block_positions: int, **engine_kwargs) -> LLMEngine:
    """An engine of the method under test; `auto` gets a fresh online cost model (no gate: the
    oracle's acceptance is fixed, so the gate would only add noise to the comparison)."""
    from cast_trtllm.cost_model import OnlineCostModel

    if method == "ar":
        return LLMEngine(target, None, spec=SpecConfig(method="ar"), **engine_kwargs)
    cost = OnlineCostModel(max_budget=block_positions * 8) if budget == "auto" else None
    width = (lambda prefix, c=cost: c) if cost else None
    return LLMEngine(target, drafter, spec=SpecConfig(draft_gate=False), width=width, cost=cost, **engine_kwargs)


def continuations(target, cfg: TargetConfig, batch: int, prompt_len: int, tokens: int, seed: int = 1):
    """Random prompts and their greedy continuations (AR through the same engine)."""
    gen = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, cfg.vocab_size, (prompt_len,), generator=gen).tolist() for _ in range(batch)]
    ar = LLMEngine(target, None, spec=SpecConfig(method="ar")).generate(
        [Request(p, tokens, ignore_eos=True) for p in ids])
    return ids, ar


def row_of(method: str, out: list, ar: list, new_tokens: int, wall: float, batch: int) -> dict[str, Any]:
    tokens = sum(len(r.token_ids) for r in out)
    decode = sum(r.timings.decode_ms for r in out)
    split = {k: sum(getattr(r.timings, f"{k}_ms") for r in out) / max(decode, 1e-9) for k in ("draft", "verify")}
    split["host"] = sum(r.timings.overhead_ms for r in out) / max(decode, 1e-9)
    return {"method": method, "batch": batch, "ms_per_token": float(np.median([r.decode_ms_per_token for r in out])),
            "tokens_per_s": tokens / wall, "mean_R": float(np.mean([r.mean_accept_length for r in out])),
            "mean_N": float(np.mean([np.mean(r.budgets) if r.budgets else 0.0 for r in out])),
            "split": {k: round(v, 4) for k, v in split.items()},
            "greedy_equals_ar": all(r.token_ids == a.token_ids[:new_tokens] for r, a in zip(out, ar)), "wall_s": wall}


def run(shape: str, device: torch.device, dtype: torch.dtype, batches: Sequence[int], prompt_len: int,
        new_tokens: int, corruption: float, block_positions: int = 15, target=None,
        backends: dict[str, Any] | None = None) -> dict[str, Any]:
    """Rows per (backend, batch, method); `backends`: name -> a target backend (reused by every
    engine of that name; None: the torch backend over `target`)."""
    cfg = SHAPES[shape]
    target = random_target(cfg, device, dtype) if target is None else target
    rows = []
    for batch in batches:
        ids, ar_ref = continuations(target, cfg, batch, prompt_len, new_tokens + block_positions + 2)
        conts = [p + r.token_ids for p, r in zip(ids, ar_ref)]
        for name, backend in (backends or {"eager": None}).items():
            for method, budget in (("ar", None), *METHODS):
                drafter = OracleDrafter(conts, cfg.vocab_size, block_positions, corruption, device)
                engine = engine_for(target if backend is None else backend, drafter, method, budget, block_positions)
                requests = [Request(p, new_tokens, method=method, budget=budget, ignore_eos=True) for p in ids]
                start, reads, steps = time.perf_counter(), engine.host_reads.count, 0
                seqs = [engine.add_request(r) for r in requests]  # `generate`, its rounds counted
                while engine.active:
                    engine.step()
                    steps += 1
                out = [s.result(engine.tokenizer) for s in seqs]
                label = f"{method}:{budget}" if budget is not None else method
                rows.append({"backend": name, **row_of(label, out, ar_ref, new_tokens, time.perf_counter() - start,
                                                       batch), "host_reads_per_round": (engine.host_reads.count - reads)
                             / steps})  # auto sized ahead: 1 (`trees._ahead`); sized on its own masses: ~2
            base = rows[-1 - len(METHODS)]["ms_per_token"]
            for row in rows[-1 - len(METHODS):]:
                row["speedup_over_ar"] = round(base / row["ms_per_token"], 4)
    return {"shape": shape, "dtype": str(dtype).removeprefix("torch."), "device": str(device), "corruption": corruption,
            "oracle": f"calibrated, {CANDIDATES} candidates per position, -inf elsewhere", "rows": rows}
