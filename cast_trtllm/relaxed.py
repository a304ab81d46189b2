"""Relaxed (LOSSY) acceptance rules: opt-in only, never the default.

These rules trade the target's sampling law for longer accepted paths. They come from
Xia & Ribar, "A Practical Investigation of Training-free Relaxed Speculative Decoding"
(../shared/papers/relaxed_speculative_decoding_investigation.txt), §4 and Table 2, whose
Algorithm 2 replaces p by relaxed targets at three places of speculative sampling:
- rejection: accept the draft x with probability min(1, pi_rej(x) / q(x));
- residual: on rejection draw from norm((pi_res - q)_+);
- bonus: after the last draft, draw from pi_bonus (= p except for spec-contrastive).

Notation: p = target law after the fixed logit processors (`sampling.target_probs`);
q = drafter marginal at that position, softmax(draft_logits / T) (temperature only: the
top-k/top-p mask belongs to the target); x = the drafted token; alpha = the relaxation
parameter. Rule formulas (Table 2; pi_res = pi_rej unless stated, pi_bonus = p):
- cactus (Hao & Mou 2026): gamma_x = min(p(x) + sqrt(2 alpha p(x) (1 - p(x))), 1);
  pi_x(x) = gamma_x, pi_x(v) = (1 - gamma_x) / (1 - p(x)) * p(v) for v != x.
- mentored (mentored-dec beta = 1, Tran-Thien 2023): pi_rej(v) = min(p(v) / (1 - alpha), 1)
  (an acceptance value, not a law); pi_res = p.
- r-fuzzy (Holsman et al. 2025): pi = q if Div(p, q) < alpha else p. Table 2 leaves Div
  generic; `divergence` picks it: "js" (Jensen-Shannon, nats, default), "tv", "kl" (KL(p||q)).
- spec-casc (spec-casc-opt, Narasimhan et al. 2025): pi = q if max q >= max p - alpha TV(p, q)
  else p.
- ensemble (ens, Wang et al. 2026): pi = alpha q + (1 - alpha) p.
- spec-contrastive (spec-cont-dec, Yuan et al. 2024): pi = softmax(z_p + alpha (z_p - z_q))
  on the top-k/top-p mask M, 0 off it; pi_bonus = pi. With p = softmax(z_p) on M this is
  pi ∝ p^(1+alpha) / q^alpha on supp(p), which is what is computed.

On a tree (`relaxed_walk`): the proposal at a node is q~, the drafter marginal renormalized
over the retained children (as in the lossless walk). The FIRST candidate drawn from q~
is accepted with probability min(1, pi_rej(x) / q~(x)); after a rejection the node runs
Theorem 3's lossless recursion on the relaxed residual norm((pi_res_x - q~)_+), so the
node commits exactly the law of the paper's one-draft rule with q replaced by q~
(`committed_law`; its `total_variation` from p is the per-step loss). For rules whose pi
is a law that does not depend on x this is Theorem 3 applied to pi: the node commits pi
exactly, whatever the tree shape. A leaf commits a bonus token from pi_bonus (p when the
block has no drafter marginal there). On a one-child chain q~ is a point mass on the
drafted token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from cast_trtllm.sampling import SamplingParams, target_probs
from cast_trtllm.tree import Tree
from cast_trtllm.verify import Acceptance, NodeTargets, check_target_rows, residual, walk_samples

# rule -> (valid alpha, its range in words)
_ALPHA = {
    "cactus": (lambda a: a >= 0, ">= 0"),
    "mentored": (lambda a: 0 <= a < 1, "in [0, 1)"),
    "r-fuzzy": (lambda a: a >= 0, ">= 0 (a divergence threshold)"),
    "spec-casc": (math.isfinite, "finite"),
    "ensemble": (lambda a: 0 <= a <= 1, "in [0, 1]"),
    "spec-contrastive": (lambda a: a >= 0, ">= 0"),
}
RULES = tuple(_ALPHA)
DIVERGENCES = ("js", "tv", "kl")
_Q_FLOOR = 1e-300  # keeps log q finite for spec-contrastive


def _kl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    terms = torch.where(a > 0, a * (torch.log(a) - torch.log(b.clamp(min=_Q_FLOOR))), torch.zeros_like(a))
    return terms.sum()


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    """0.5 * ||a - b||_1 of two laws [V]."""
    return 0.5 * float((a - b).abs().sum())


@dataclass(frozen=True, slots=True)
class RelaxedRule:
    """A lossy acceptance rule of Table 2; `lossy=True` is the mandatory opt-in."""

    name: str
    alpha: float
    divergence: str = "js"  # r-fuzzy only
    lossy: bool = False

    def __post_init__(self) -> None:
        if self.lossy is not True:
            raise ValueError(
                f"RelaxedRule({self.name!r}) breaks the target's sampling law: committed tokens "
                "no longer follow autoregressive sampling from the target. Pass lossy=True to opt in."
            )
        if self.name not in RULES:
            raise ValueError(f"unknown relaxed rule {self.name!r}; choose one of {RULES}")
        if self.divergence not in DIVERGENCES:
            raise ValueError(f"divergence must be one of {DIVERGENCES}, got {self.divergence!r}")
        ok, what = _ALPHA[self.name]
        if math.isnan(self.alpha) or not ok(self.alpha):
            raise ValueError(f"alpha for {self.name} must be {what}, got {self.alpha}")

    def relaxed_law(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor | None:
        """pi [V] for rules whose relaxed target is a law independent of the draft; else None."""
        if self.name == "r-fuzzy":  # Div(p, q) of `divergence`
            m = 0.5 * (p + q)
            div = {"tv": lambda: total_variation(p, q), "kl": lambda: float(_kl(p, q)),
                   "js": lambda: float(0.5 * _kl(p, m) + 0.5 * _kl(q, m))}[self.divergence]()
            return q if div < self.alpha else p
        if self.name == "spec-casc":
            return q if q.max() >= p.max() - self.alpha * total_variation(p, q) else p
        if self.name == "ensemble":
            return self.alpha * q + (1.0 - self.alpha) * p
        if self.name == "spec-contrastive":
            log_pi = (1.0 + self.alpha) * torch.log(p) - self.alpha * torch.log(q.clamp(min=_Q_FLOOR))
            return torch.softmax(torch.where(p > 0, log_pi, torch.full_like(p, float("-inf"))), dim=0)
        return None

    def start_law(self, p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """[V] law a node's residual starts from (and falls back to)."""
        pi = self.relaxed_law(p, q)
        return p if pi is None else pi

    def bonus_law(self, p: torch.Tensor, q: torch.Tensor | None) -> torch.Tensor:
        """[V] pi_bonus: p, except spec-contrastive (its pi, when q exists)."""
        if self.name == "spec-contrastive" and q is not None:
            return self.relaxed_law(p, q)
        return p

    def first_step(
        self, p: torch.Tensor, q: torch.Tensor, x: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(pi_rej_x(x) [B], pi_res_x [B, V]) for drafted tokens x [B]; p, q: [V]."""
        B = len(x)
        if self.name == "mentored":
            return (p[x] / (1.0 - self.alpha)).clamp(max=1.0), p.expand(B, -1)
        if self.name == "cactus":
            px = p[x]
            gamma = (px + torch.sqrt(2.0 * self.alpha * px * (1.0 - px))).clamp(max=1.0)
            scale = torch.where(px < 1.0, (1.0 - gamma) / (1.0 - px).clamp(min=1e-300), torch.zeros_like(px))
            pi = scale[:, None] * p.expand(B, -1)
            return gamma, pi.scatter(1, x[:, None], gamma[:, None])
        pi = self.relaxed_law(p, q)
        return pi[x], pi.expand(B, -1)


def committed_law(
    rule: RelaxedRule,
    p: torch.Tensor,  # [V] target law
    q: torch.Tensor,  # [V] drafter marginal used inside the rule's pi
    proposal: torch.Tensor | None = None,  # [V] law the draft is drawn from; default q
) -> torch.Tensor:
    """[V] float64 law of the token a node commits under `rule` (one draft, paper's Algorithm 2).

    With `proposal` = q~ (the drafter marginal over a node's retained children) this is
    also the law `relaxed_walk` commits at that node. Cost O(|supp proposal| * V).
    """
    p, q = p.to(torch.float64), q.to(torch.float64)
    prop = q if proposal is None else proposal.to(torch.float64)
    if not (p.shape == q.shape == prop.shape and p.dim() == 1):
        raise ValueError(
            f"p, q and proposal must be [V] laws of one vocabulary, got {p.shape}, {q.shape}, {prop.shape}"
        )
    law = torch.zeros_like(p)
    drafts = torch.nonzero(prop > 0)[:, 0]
    chunk = max(1, 4_000_000 // len(p))
    for lo in range(0, len(drafts), chunk):
        x = drafts[lo : lo + chunk]
        accept_value, base = rule.first_step(p, q, x)
        a = (accept_value / prop[x]).clamp(max=1.0)  # [b] acceptance probability
        resid = residual(base, prop, rule.start_law(p, q))  # [b, V] as the walk computes it
        weight = prop[x]
        law.index_add_(0, x, weight * a)
        law += ((weight * (1.0 - a))[:, None] * resid).sum(0)
    return law


def relaxed_speedup(
    mean_accepted: float,
    num_draft: int,
    c_rel: float,
    mean_len_ar: float = 1.0,
    mean_len_relaxed: float = 1.0,
) -> float:
    """Eq. 4 speed-up proxy: (L_AR / L_relax) * (l_accept + 1) / (1 + N_draft * c_rel).

    The factor L_AR / L_relax is the change in mean response length (a rule that makes
    answers longer loses speed even at a higher acceptance length).
    """
    if mean_accepted < 0 or num_draft < 0 or c_rel < 0 or mean_len_ar <= 0 or mean_len_relaxed <= 0:
        raise ValueError("mean_accepted, num_draft, c_rel must be >= 0 and the mean lengths > 0")
    return (mean_len_ar / mean_len_relaxed) * (mean_accepted + 1.0) / (1.0 + num_draft * c_rel)


def relaxed_targets(
    tree: Tree,
    target_logits: torch.Tensor,  # [n, V]
    draft_logits: torch.Tensor,  # [L, V]
    params: SamplingParams,
    rule: RelaxedRule,
) -> NodeTargets:
    """`rule`'s `NodeTargets` for `verify.walk_samples` (many walks at once; `relaxed_walk` is one)."""
    if params.greedy:
        raise ValueError("relaxed rules are sampling rules: use temperature > 0")
    check_target_rows(target_logits, tree)
    vocab = target_logits.shape[1]
    if draft_logits.dim() != 2 or draft_logits.shape[1] != vocab or draft_logits.shape[0] < tree.max_depth:
        raise ValueError(
            f"draft_logits must be [L >= {tree.max_depth}, V={vocab}] (row j-1 = block position j), "
            f"got {tuple(draft_logits.shape)}"
        )
    depth = tree.pack_depth

    def targets(row: int, child_tokens: torch.Tensor, q_tilde: torch.Tensor):
        p = target_probs(target_logits[row : row + 1], params)[0].cpu()
        d = int(depth[row])
        q = None
        if d < draft_logits.shape[0]:
            q = torch.softmax(draft_logits[d].to(torch.float64) / params.temperature, dim=0).cpu()
        if len(child_tokens) == 0:
            return rule.bonus_law(p, q), None
        return rule.start_law(p, q), lambda x: rule.first_step(p, q, x)

    return targets


def relaxed_walk(
    tree: Tree,
    target_logits: torch.Tensor,  # [n, V] target logits at each pack row
    draft_logits: torch.Tensor,  # [L, V] drafter logits, row j-1 = block position j
    params: SamplingParams,
    rule: RelaxedRule,
    generator: torch.Generator,
) -> Acceptance:
    """One round under a LOSSY rule (module docstring); same contract as `stochastic_walk`."""
    last, next_root = walk_samples(tree, relaxed_targets(tree, target_logits, draft_logits, params, rule), 1,
                                   generator)
    return Acceptance.from_last(tree, int(last[0]), int(next_root[0]))

