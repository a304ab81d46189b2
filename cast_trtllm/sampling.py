"""Sampling parameters and the fixed logit processors of the target's sampling law.

Autoregressive sampling and tree verification must sample the SAME law (Theorem 3 holds
for "the target distribution after temperature scaling and the fixed baseline logit
processors"). Both therefore go through `processed_logits` / `target_probs` here:

    logits --temperature--> logits / T --top-k--> keep the k largest (ties kept)
           --top-p--> keep the smallest head of mass >= top_p --> softmax (float64)

Temperature 0 is greedy decoding: the law is a point mass on the argmax (lowest id on
ties, as `torch.argmax`), and callers should take the greedy path (`verify.greedy_walk`).
The acceptance math runs in float64 whatever the logits' dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Target sampling law: temperature, top-k (0 = off), top-p (1 = off), seed."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0) or self.temperature == float("inf"):
            raise ValueError(
                f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}"
            )
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 disables top-k), got {self.top_k!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1] (1 disables top-p), got {self.top_p}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def generator(self, device: str | torch.device = "cpu") -> torch.Generator:
        """A generator seeded with `seed` (a fresh nondeterministic seed when None)."""
        gen = torch.Generator(device=device)
        if self.seed is None:
            gen.seed()
        else:
            gen.manual_seed(self.seed)
        return gen


def _check_logits(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must be a floating-point tensor [n, V], got {shape}")


def processed_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, top-k and top-p applied to logits; removed tokens get -inf.

    logits: [n, V] any float dtype. Returns [n, V] float64 (for T = 0: 0 at the argmax,
    -inf elsewhere).
    """
    _check_logits(logits)
    if params.greedy:
        z = logits.to(torch.float64)
        out = torch.full_like(z, float("-inf"))
        return out.scatter_(1, z.argmax(dim=1, keepdim=True), 0.0)
    return processed_rows(logits, [params] * logits.shape[0])


def processed_rows(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """`processed_logits` with its own law per row: row i under params[i] (every temperature > 0).

    logits: [n, V] on any device; the per-row settings go up in one copy, and which steps
    run is decided from the host-side params (no device read). Returns [n, V] float64.
    """
    if len(params) != logits.shape[0] or any(p.greedy for p in params):
        raise ValueError(f"processed_rows needs one SamplingParams with temperature > 0 per row: "
                         f"{len(params)} params for {logits.shape[0]} rows")
    z, V = logits.to(torch.float64), logits.shape[1]
    top_k = [p.top_k if 0 < p.top_k < V else 0 for p in params]
    knobs = torch.tensor([[p.temperature, k, p.top_p] for p, k in zip(params, top_k)], dtype=torch.float64)
    knobs = knobs.to(z.device, non_blocking=True)
    z = z / knobs[:, :1]
    if any(top_k):
        k = knobs[:, 1:2].long()  # [n, 1]
        kth = torch.topk(z, max(top_k), dim=1).values.gather(1, (k - 1).clamp_min(0))  # [n, 1]
        z = z.masked_fill((k > 0) & (z < kth), float("-inf"))
    if any(p.top_p < 1.0 for p in params):
        top_p = knobs[:, 2:]  # [n, 1]
        sorted_z, order = torch.sort(z, dim=1, descending=True)
        probs = torch.softmax(sorted_z, dim=1)
        mass_before = torch.cumsum(probs, dim=1) - probs  # [n, V]
        drop_sorted = (mass_before >= top_p) & (top_p < 1.0)  # the top token always stays
        drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
        z = z.masked_fill(drop, float("-inf"))
    return z


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The target's sampling law p at each row. logits: [n, V]; returns [n, V] float64."""
    return torch.softmax(processed_logits(logits, params), dim=1)


def sample_from(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw of one token per row.

    probs: [B, V] nonnegative rows (need not be normalized); uniforms: [B] in [0, 1).
    Returns [B] int64. Tokens of zero mass are never drawn.
    """
    cdf = torch.cumsum(probs, dim=1)  # [B, V]
    total = cdf[:, -1:]
    # kept below the total (u * total may round up to it), the first cdf entry above the
    # target is one where the cdf rose: a token of positive mass
    target = torch.minimum(uniforms.to(cdf.dtype)[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True)[:, 0]


def sample_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> torch.Tensor:
    """Autoregressive sampling: one token per row from the target law.

    logits: [n, V]. Returns [n] int64 (the argmax when temperature is 0).
    """
    if params.greedy:
        _check_logits(logits)
        return logits.argmax(dim=1)
    probs = target_probs(logits, params)
    u = torch.rand(probs.shape[0], generator=generator, dtype=torch.float64, device=probs.device)
    return sample_from(probs, u)
