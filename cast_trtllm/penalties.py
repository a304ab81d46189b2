"""Occurrence penalties and min-p: deterministic transforms of the target's logit rows.

TensorRT-LLM's `repetition_penalty`, `presence_penalty`, `frequency_penalty` and `min_p`
change the target's law, so a lossless speculative walk must see them on every row it
verifies, exactly as an autoregressive step at that row's position would (Theorem 3 holds
for the target law after fixed processors). A pack row's context is the prompt, the
emitted tokens and its tree path (`cast_trtllm.logit_processing`); its counts c(x) are
over that whole context, as TensorRT-LLM counts the whole sequence:

    repetition  z(x) -> z(x) / r  if z(x) > 0 else z(x) * r     (for c(x) > 0; r = 1 off)
    presence    z(x) -> z(x) - p                                   (for c(x) > 0; p = 0 off)
    frequency   z(x) -> z(x) - f * c(x)                            (f = 0 off)
    min_p       z(x) -> -inf  if p_T(x) < min_p * max_y p_T(y)     (min_p = 0 off)

min_p is on the temperature-T law (z / T), i.e. z(x) < max z + T ln(min_p); it never
removes the argmax, so it is a no-op for greedy requests. It runs last, after the bans
and penalties, before temperature / top-k / top-p (`cast_trtllm.sampling`), as vLLM orders it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from cast_trtllm.tree import Tree


@dataclass(frozen=True, slots=True)
class Penalties:
    repetition: float = 1.0
    presence: float = 0.0
    frequency: float = 0.0
    min_p: float = 0.0

    def __post_init__(self) -> None:
        checks = (("repetition_penalty", self.repetition, self.repetition > 0, "a number > 0 (1 = off)"),
                  ("presence_penalty", self.presence, True, "a finite number (0 = off)"),
                  ("frequency_penalty", self.frequency, True, "a finite number (0 = off)"),
                  ("min_p", self.min_p, 0.0 <= self.min_p <= 1.0, "a number in [0, 1] (0 = off)"))
        for name, value, ok, what in checks:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok:
                raise ValueError(f"{name} must be {what}, got {value!r}")

    @property
    def counts_tokens(self) -> bool:
        """Whether any occurrence penalty is on (they need each row's context)."""
        return self.repetition != 1.0 or self.presence != 0.0 or self.frequency != 0.0

    def active(self, temperature: float) -> bool:
        """Whether anything changes the rows of a request sampled at `temperature` (0: greedy)."""
        return self.counts_tokens or (self.min_p > 0.0 and temperature > 0.0)

    def apply(self, logits: torch.Tensor, tree: Tree, history: Sequence[int], temperature: float) -> torch.Tensor:
        """logits: [n, V] one row per packed token of `tree` (row 0 the pending root, the last
        token of `history`); returns the transformed rows (a copy where anything changed)."""
        out = logits
        if self.counts_tokens:
            out = self._penalize(logits, tree, history)
        if self.min_p > 0.0 and temperature > 0.0:
            z = out.to(torch.float32) if out.dtype != torch.float32 else out
            floor = z.max(dim=1, keepdim=True).values + temperature * math.log(self.min_p)  # [n, 1]
            out = out.masked_fill(z < floor, float("-inf"))
        return out

    def _penalize(self, logits: torch.Tensor, tree: Tree, history: Sequence[int]) -> torch.Tensor:
        n = tree.num_packed
        paths: list[list[int]] = [[]]  # per pack row: its tree path's tokens (root row: none)
        for token, parent in zip(tree.tokens.tolist(), tree.parent.tolist()):  # parents come first
            paths.append(paths[parent + 1] + [int(token)])
        hist = np.asarray(list(history), dtype=np.int64)
        cols = np.unique(np.concatenate([hist, tree.tokens.astype(np.int64)]))  # [u] tokens any row has seen
        if not len(cols):
            return logits
        where = {t: j for j, t in enumerate(cols.tolist())}
        counts = np.zeros((n, len(cols)), dtype=np.float32)  # [n, u] occurrences in each row's context
        hist_cols, hist_counts = np.unique(hist, return_counts=True)
        counts[:, [where[t] for t in hist_cols.tolist()]] = hist_counts
        for r, path in enumerate(paths):
            for t in path:
                counts[r, where[t]] += 1.0
        index = torch.as_tensor(cols, device=logits.device)
        c = torch.as_tensor(counts, device=logits.device, dtype=logits.dtype)  # [n, u]
        z = logits[:, index]  # [n, u]
        present = c > 0
        if self.repetition != 1.0:
            z = torch.where(present, torch.where(z > 0, z / self.repetition, z * self.repetition), z)
        z = z - self.presence * present.to(z.dtype) - self.frequency * c
        out = logits.clone()
        out[:, index] = z
        return out
