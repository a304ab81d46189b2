"""The whole round loop on a GPU: AR / chain / CAST auto ms per token and host overhead.

A random-weight Qwen3-8B-shaped target (36 layers, hidden 4096, 32/8 heads of 128,
MLP 12288, vocab 151936; bf16) runs through the one engine with a drafter of CONTROLLED
acceptance: `OracleDrafter` proposes the target's own greedy continuation, each proposed
token replaced by a random one with probability `corruption` (so R is set by the rate,
not by a trained head, which random weights cannot have). Greedy output must equal AR.
Shape `tiny` runs the same code on a 2-layer model (the CPU test, `gpu_check --dry-run`).
The `round_loop` section of `perf.gpu_check` (perf/gpu_check.sh runs it on the GPU).
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
SIZES = {"qwen3-8b": {"prompts": 4, "prompt_len": 256, "new_tokens": 64, "corruptions": (0.1, 0.4)},
         "tiny": {"prompts": 2, "prompt_len": 16, "new_tokens": 12, "corruptions": (0.4,), "block_positions": 7}}


def random_target(cfg: TargetConfig, device: torch.device, dtype: torch.dtype, seed: int = 0) -> LlamaTarget:
    """Random weights (std 0.02, norms 1) allocated directly on `device` in `dtype`."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaTarget(cfg, Rotary(default_inv_freq(cfg.head_dim, cfg.rope_theta)))
    model = model.to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0) if name.endswith("norm.weight") else p.normal_(0.0, 0.02)
    return model.eval().requires_grad_(False)


class OracleDrafter:
    """Proposes each request's known greedy continuation, each token corrupted with
    probability `corruption` (the drafter interface of `runtime.drafter.DrafterExecutor`)."""

    tap_layer_ids = (1,)
    mass_exponent = 1.0

    def __init__(self, continuations: Sequence[Sequence[int]], vocab: int, block_positions: int,
                 corruption: float, device: torch.device, seed: int = 0) -> None:
        self.pending = [list(c) for c in continuations]  # prompt + greedy continuation, per request in order
        self.vocab, self.num_draft_positions, self.corruption = vocab, block_positions, corruption
        self.device, self.rng = device, np.random.default_rng(seed)

    def new_state(self, capacity: int) -> dict:
        return {"ref": self.pending.pop(0), "length": 0}

    def append_context(self, state: dict, taps: torch.Tensor) -> None:
        state["length"] += taps.shape[0]

    def draft(self, states: Sequence[dict], roots: Sequence[int]) -> torch.Tensor:
        L = self.num_draft_positions
        logits = torch.zeros(len(states), L, self.vocab, device=self.device)
        for b, state in enumerate(states):
            for j in range(L):
                pos = state["length"] + 1 + j
                true = state["ref"][pos] if pos < len(state["ref"]) else 0
                wrong = self.rng.random() < self.corruption
                token = int(self.rng.integers(self.vocab)) if wrong else true
                logits[b, j, token] = 6.0
                logits[b, j, true] += 2.0  # the truth keeps some mass: a tree can still find it
        return logits


def run(shape: str, device: torch.device, dtype: torch.dtype, prompts: int, prompt_len: int, new_tokens: int,
        corruptions: Sequence[float], block_positions: int = 15) -> dict[str, Any]:
    from cast_trtllm.cost_model import OnlineCostModel

    cfg = SHAPES[shape]
    target = random_target(cfg, device, dtype)
    gen = torch.Generator().manual_seed(1)
    ids = [torch.randint(0, cfg.vocab_size, (prompt_len,), generator=gen).tolist() for _ in range(prompts)]
    ar_engine = LLMEngine(target, None, spec=SpecConfig(method="ar"))
    ar = ar_engine.generate([Request(p, new_tokens + block_positions + 2, ignore_eos=True) for p in ids])
    conts = [p + r.token_ids for p, r in zip(ids, ar)]
    rows = [{"method": "ar", "corruption": None,
             "ms_per_token": float(np.median([r.decode_ms_per_token for r in ar]))}]
    for rate in corruptions:
        for method, budget in (("chain", None), ("cast", 15), ("cast", "auto")):
            cost = OnlineCostModel(max_budget=block_positions * 8) if budget == "auto" else None
            drafter = OracleDrafter(conts, cfg.vocab_size, block_positions, rate, device)
            engine = LLMEngine(target, drafter, spec=SpecConfig(draft_gate=False),
                               width=(lambda prefix, c=cost: c) if cost else None, cost=cost)
            start = time.perf_counter()
            out = engine.generate([Request(p, new_tokens, method=method, budget=budget, ignore_eos=True) for p in ids])
            wall = time.perf_counter() - start
            rows.append({
                "method": f"{method}:{budget}" if budget is not None else method, "corruption": rate,
                "ms_per_token": float(np.median([r.decode_ms_per_token for r in out])),
                "mean_R": float(np.mean([r.mean_accept_length for r in out])),
                "mean_N": float(np.mean([np.mean(r.budgets) for r in out])),
                "host_overhead_share": sum(r.timings.overhead_ms for r in out) / sum(r.timings.decode_ms for r in out),
                "greedy_equals_ar": all(r.token_ids == a.token_ids[:new_tokens] for r, a in zip(out, ar)),
                "wall_s": wall})
    for row in rows[1:]:
        row["speedup_over_ar"] = rows[0]["ms_per_token"] / row["ms_per_token"]
    return {"shape": shape, "dtype": str(dtype).removeprefix("torch."), "device": str(device), "rows": rows}
