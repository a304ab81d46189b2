"""Acceptance: walk a verified tree and decide what the round commits (paper §2, App. B.1).

Terminology (as in vLLM's rejection sampler):
- accepted tokens: tree nodes on the committed path, root excluded (`Acceptance.path`).
- recovered token: drawn from the final residual at the last accepted node when every
  retained child there was rejected (or, greedily, the target's argmax there).
- bonus token: drawn from the target law at the last accepted node when that node is a
  leaf (no retained children): the walk ran out of tree, not out of agreement.
Either one becomes the next pending root (`Acceptance.next_root`); a round always
commits `len(path) + 1` tokens.

Greedy path (T = 0): from the root descend to the child whose token equals the target
argmax at the current row, while one exists (`greedy_walk`).

Random path (T > 0): the proposal-aware verifier of Theorem 3 (`stochastic_walk`). At a
visited node v the residual starts at mu = p_v (the target law after the fixed logit
processors, `sampling.target_probs`). The proposal q on the retained children C_v is the
drafter marginal at that depth, read back from the tree as exp(score[c] - score[v])
(exp(score[c]) below the root). Repeat: draw c from q~ (q renormalized over the children
not yet tried), accept with probability min(1, mu(c) / q~(c)); on rejection set
mu <- (mu - q~)_+ / ||(mu - q~)_+||_1 with q~ as a full-vocabulary vector, and drop c.
If a child is accepted, continue from its row with mu = p_c; if all are rejected, draw
the recovered token from the final residual. In exact arithmetic the committed tokens
follow autoregressive sampling from p.

Drawing candidates one by one without replacement from q~ is the same as ordering the
children by E_c / q(c) with E_c ~ Exp(1) (exponential race), so each visited node costs
one [B, 2C+1] uniform draw and C vectorized steps over a batch of B walks.

Numerical guard: a rejection happens only where q~(c) > mu(c), so in exact arithmetic the
residual mass ||(mu - q~)_+||_1 is > 0 after any rejection. If rounding leaves it at or
below `RESIDUAL_FLOOR` (an event of probability about that floor), the residual falls
back to p_v, the node's own target law.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from cast_trtllm.sampling import SamplingParams, sample_from, target_probs
from cast_trtllm.tree import Tree

RESIDUAL_FLOOR = 1e-12  # residual mass treated as exhausted (see module docstring)

# Hooks through which `relaxed` changes the first candidate's test (lossless walk: none).
# FirstStep: candidate tokens x [B] -> (acceptance value pi_rej(x) [B], residual base [B, V]).
FirstStep = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# NodeTargets: (pack row, child tokens [C], proposal q~ [C]) -> (mu0 [V], FirstStep | None),
# mu0 being the law the residual starts from (and falls back to).
NodeTargets = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, FirstStep | None]]


@dataclass(frozen=True, slots=True)
class Acceptance:
    """What one verified round commits: `path` tokens, then `next_root`."""

    path: np.ndarray  # [A] int64 pack indices of accepted nodes, root excluded
    tokens: np.ndarray  # [A] int64 accepted token ids
    next_root: int  # recovered or bonus token: the next pending root

    @property
    def num_accepted(self) -> int:
        return len(self.path)

    @property
    def committed(self) -> np.ndarray:
        """[A + 1] int64: accepted tokens followed by the next pending root."""
        return np.append(self.tokens, np.int64(self.next_root))

    @staticmethod
    def from_last(tree: Tree, last: int, next_root: int) -> "Acceptance":
        """The round that accepted the root-to-`last` path (pack index; 0 = none)."""
        path = tree.path_to(last) if last > 0 else np.zeros(0, np.int64)
        return Acceptance(path=path, tokens=tree.tokens[path - 1], next_root=int(next_root))


def _children_csr(tree: Tree) -> tuple[np.ndarray, np.ndarray]:
    """(offsets [n+1], kids [N]): pack indices of row v's children are kids[offsets[v]:offsets[v+1]]."""
    parent_row = tree.parent.astype(np.int64) + 1  # [N] pack index of each node's parent
    kids = np.argsort(parent_row, kind="stable") + 1
    offsets = np.concatenate([[0], np.cumsum(np.bincount(parent_row, minlength=tree.num_packed))])
    return offsets, kids


# ----------------------------------------------------------------------------- greedy path


def greedy_walk(tree: Tree, target_argmax: np.ndarray | torch.Tensor) -> Acceptance:
    """Longest tree path that agrees with the target's argmax, plus the target's next token.

    target_argmax: [n] int, the target argmax at each pack row (n = tree.num_packed).
    Siblings with equal tokens: the first stored (best-scoring) one is followed.
    """
    argmax = target_argmax.cpu().numpy() if isinstance(target_argmax, torch.Tensor) else np.asarray(target_argmax)
    if argmax.shape != (tree.num_packed,) or not np.issubdtype(argmax.dtype, np.integer):
        raise ValueError(f"target_argmax must be integers of shape ({tree.num_packed},), got {argmax.dtype} "
                         f"{argmax.shape}")
    offsets, kids = _children_csr(tree)
    row = 0
    while True:
        children = kids[offsets[row] : offsets[row + 1]]
        match = children[tree.tokens[children - 1] == argmax[row]]
        if len(match) == 0:
            return Acceptance.from_last(tree, row, argmax[row])
        row = int(match[0])


# ----------------------------------------------------------------------------- random path


def _check_siblings_distinct(tree: Tree) -> None:
    key = (tree.parent.astype(np.int64) + 1) * (int(tree.tokens.max(initial=0)) + 1) + tree.tokens
    if len(np.unique(key)) != tree.size:
        raise ValueError("siblings must carry distinct tokens for the stochastic verifier (Theorem 3)")


def _proposal(tree: Tree, row: int, children: np.ndarray) -> np.ndarray:
    """[C] float64 drafter marginal of each retained child, renormalized over the children."""
    parent_score = 0.0 if row == 0 else tree.score[row - 1]
    log_q = tree.score[children - 1] - parent_score
    if not np.all(np.isfinite(log_q)):
        raise ValueError(
            f"tree scores under pack row {row} are not finite: Theorem 3 needs a proposal "
            "positive on every retained child"
        )
    q = np.exp(log_q - log_q.max())
    return q / q.sum()


def residual(base: torch.Tensor, q: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """[B, V] norm((base - q)_+) per row, `fallback` [V] where rounding left no mass (module docstring)."""
    resid = (base - q).clamp(min=0.0)
    mass = resid.sum(1, keepdim=True)
    return torch.where(mass > RESIDUAL_FLOOR, resid / mass.clamp(min=RESIDUAL_FLOOR), fallback.expand_as(resid))


def _resolve_node(
    mu0: torch.Tensor,  # [V] float64 target (or relaxed) law at the node
    child_tokens: torch.Tensor,  # [C] int64 distinct tokens of the retained children
    q: torch.Tensor,  # [C] float64 proposal on the children, sums to 1
    u: torch.Tensor,  # [B, 2C+1] uniforms: race keys, acceptance tests, final draw
    first_step: FirstStep | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Recursive rejection sampling without replacement for B walks at one node.

    Returns (accepted child slot [B] int64, -1 where all were rejected; token [B] int64,
    the accepted child's token or the recovered/bonus token).
    """
    B, C = u.shape[0], len(child_tokens)
    mu = mu0.expand(B, -1).clone()  # [B, V] residual
    slot = torch.full((B,), -1, dtype=torch.int64)
    if C:
        order = torch.argsort(-torch.log(u[:, :C]) / q, dim=1)  # [B, C] exponential race
        q_sorted = q[order]  # [B, C]
        avail = torch.flip(torch.cumsum(torch.flip(q_sorted, [1]), 1), [1])  # [B, C] mass not yet tried
        active = torch.ones(B, dtype=torch.bool)
        for s in range(C):
            cand = order[:, s]
            q_tilde = q_sorted[:, s] / avail[:, s]
            tok = child_tokens[cand]
            if s == 0 and first_step is not None:
                target, base = first_step(tok)
            else:
                target, base = mu.gather(1, tok[:, None])[:, 0], mu
            accept = active & (u[:, C + s] * q_tilde < target)  # w.p. min(1, target / q~)
            slot[accept] = cand[accept]
            active &= ~accept
            # residual of the rejected: (base - q~)_+ with q~ on the children still available
            q_avail = q_sorted[:, s:] / avail[:, s : s + 1]  # [B, C - s]
            q_vec = torch.zeros_like(mu).scatter_(1, child_tokens[order[:, s:]], q_avail)
            mu = torch.where(active[:, None], residual(base, q_vec, mu0), mu)
    accepted_token = child_tokens[slot.clamp(min=0)] if C else slot
    token = torch.where(slot >= 0, accepted_token, sample_from(mu, u[:, -1]))
    return slot, token


def walk_samples(
    tree: Tree,
    node_targets: NodeTargets,
    num_samples: int,
    generator: torch.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Run `num_samples` independent stochastic walks over one verified tree.

    node_targets(row, child_tokens [C], q [C]) -> (mu0 [V], first_step or None) gives the
    law the residual starts from at pack row `row`; `first_step` (used by the lossy rules
    of `relaxed`) overrides the acceptance value and residual base of the first candidate.
    Returns (last accepted pack index [B] int64, 0 = nothing accepted; next root [B] int64).
    """
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    _check_siblings_distinct(tree)
    offsets, kids = _children_csr(tree)
    at = np.zeros(num_samples, np.int64)  # current pack row of each walk
    last = np.zeros(num_samples, np.int64)
    next_root = np.full(num_samples, -1, np.int64)
    for row in range(tree.num_packed):  # parents before children: walks arrive before their row runs
        walks = np.flatnonzero(at == row)
        if len(walks) == 0:
            continue
        children = kids[offsets[row] : offsets[row + 1]]
        child_tokens = torch.from_numpy(tree.tokens[children - 1])
        q = torch.from_numpy(_proposal(tree, row, children) if len(children) else np.zeros(0))
        mu0, first_step = node_targets(row, child_tokens, q)
        u = torch.rand(len(walks), 2 * len(children) + 1, generator=generator, dtype=torch.float64)
        slot, token = _resolve_node(mu0.to(torch.float64).cpu(), child_tokens, q, u, first_step)
        slot, token = slot.numpy(), token.numpy()
        moved = slot >= 0
        at[walks] = np.where(moved, children[np.maximum(slot, 0)] if len(children) else -1, -1)
        last[walks[moved]] = at[walks[moved]]
        stop = walks[~moved]
        last[stop], next_root[stop] = row, token[~moved]
    return last, next_root


def check_target_rows(target_logits: torch.Tensor, tree: Tree) -> None:
    if target_logits.dim() != 2 or target_logits.shape[0] != tree.num_packed:
        raise ValueError(f"target_logits must be [n={tree.num_packed}, V] (one row per packed token), "
                         f"got {tuple(target_logits.shape)}")


def lossless_targets(tree: Tree, target_logits: torch.Tensor, params: SamplingParams) -> NodeTargets:
    """Theorem 3's `NodeTargets`: the residual at pack row r starts from the target law p there.

    target_logits: [n, V] target logits at each pack row. `walk_samples(tree,
    lossless_targets(...), B, generator)` draws B independent rounds at once (for
    acceptance statistics and law tests); `stochastic_walk` is one of them.
    """
    if params.greedy:
        raise ValueError("the stochastic walk needs temperature > 0; at T = 0 use greedy_walk (deterministic)")
    check_target_rows(target_logits, tree)

    def lossless(row: int, child_tokens: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, None]:
        return target_probs(target_logits[row : row + 1], params)[0], None

    return lossless


def stochastic_walk(
    tree: Tree,
    target_logits: torch.Tensor,  # [n, V] target logits at each pack row
    params: SamplingParams,
    generator: torch.Generator,
) -> Acceptance:
    """Theorem 3's distribution-preserving walk (module docstring); T = 0 walks greedily.

    Seeded and reproducible: all randomness comes from `generator` (a CPU generator).
    """
    if params.greedy:
        check_target_rows(target_logits, tree)
        return greedy_walk(tree, target_logits.argmax(dim=1))
    last, next_root = walk_samples(tree, lossless_targets(tree, target_logits, params), 1, generator)
    return Acceptance.from_last(tree, int(last[0]), int(next_root[0]))
