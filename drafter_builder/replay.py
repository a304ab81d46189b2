"""Offline greedy replay of decoding rounds on held-out target continuations (paper §2, App. G).

Greedy CAST output equals the target's greedy continuation, so a round can be replayed
without running the target: at pending root position p the drafter scores the block
from the taps of ids[:p] (exactly what the feature cache holds in decoding), the
method builds its tree, and the greedy walk accepts the longest tree path equal to
ids[p+1..]. The round commits R = A + 1 tokens (accepted path + the target's next
token, the new pending root), capped by what is left of the continuation, and the
next round starts at p + R. This measures the committed round length R of any tree
rule at the cost of drafter passes only.

Also: depth-1 reliability of the drafter scores (Fig. 4b: a candidate is a hit when it
equals the target's greedy token) and the draft rank of the target's token at the
first chain rejection (Fig. 4a).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch

from cast_trtllm.tree import Tree, build_chain, build_tree
from drafter_builder.blocks import FrozenTarget, block_hidden
from runtime.drafter.vocab import DraftHead

TreeRule = Callable[[np.ndarray, np.ndarray], Tree]  # (topk ids [L, K], logprobs [L, K]) -> tree


def chain_rule(ids: np.ndarray, lp: np.ndarray) -> Tree:
    """Standard DFlash: the top-1 chain over the whole block."""
    return build_chain(ids[:, :1], lp[:, :1])


def budget_rule(budget: int) -> TreeRule:
    """CAST at a fixed budget N: the exact best-first top-N tree."""
    return lambda ids, lp: build_tree(ids, lp, budget)


@dataclass(frozen=True, slots=True)
class AnchorScores:
    """The drafter's top-K marginals at every response anchor of one continuation."""

    ids: np.ndarray  # [T] token ids of the sequence
    prompt_len: int
    topk_ids: np.ndarray  # [A, L, K] target ids, anchors prompt_len .. T-2
    topk_logprobs: np.ndarray  # [A, L, K] float32, descending per position


@torch.no_grad()
def score_anchors(drafter: Any, target: FrozenTarget, rec: dict[str, Any], rank_cap: int = 8, chunk: int = 32
                  ) -> AnchorScores:
    """Top-`rank_cap` marginals of the block at every anchor p in [prompt_len, T-2] (run where
    the target's weights are; the record may sit on the CPU)."""
    rotary, head = drafter.config.rotary(), DraftHead(target.lm_head_weight, drafter.d2t)
    dev = target.lm_head_weight.device
    ids, taps = rec["ids"].to(dev), rec["taps"].to(dev).float()
    anchors = torch.arange(rec["prompt_len"], ids.numel() - 1, device=dev)
    out_ids, out_lp = [], []
    for part in anchors.split(chunk):
        logits = head.draft_logits(block_hidden(drafter, target.embed_weight, rotary, taps, ids, part))  # [n, L, Vd]
        lp, top = torch.topk(torch.log_softmax(logits.float(), -1), rank_cap, dim=-1)
        out_ids.append(top if head.target_ids is None else head.target_ids[top])
        out_lp.append(lp)
    return AnchorScores(rec["ids"].numpy().astype(np.int64), int(rec["prompt_len"]),
                        torch.cat(out_ids).cpu().numpy(), torch.cat(out_lp).cpu().numpy().astype(np.float32))


def accepted_path(tree: Tree, continuation: np.ndarray) -> list[int]:
    """Node indices of the longest tree path equal to the start of `continuation`."""
    path: list[int] = []
    node = -1  # the pending root
    while len(path) < len(continuation):
        match = np.flatnonzero((tree.parent == node) & (tree.tokens == continuation[len(path)]))
        if match.size == 0:
            break
        node = int(match[0])
        path.append(node)
    return path


def rounds(scores: AnchorScores, rule: TreeRule) -> Iterator[tuple[int, Tree, int, int]]:
    """(pending root position p, tree, accepted length A, committed length R) of every round of one continuation."""
    p, end = scores.prompt_len, len(scores.ids) - 1  # the last token (EOS or budget) ends decoding
    while p < end:
        a = p - scores.prompt_len
        tree = rule(scores.topk_ids[a], scores.topk_logprobs[a])
        accepted = len(accepted_path(tree, scores.ids[p + 1 :]))
        r = min(accepted + 1, end - p)
        yield p, tree, accepted, r
        p += r


def replay(scores: AnchorScores, rule: TreeRule) -> tuple[list[int], list[int]]:
    """Committed lengths R and tree sizes of every round of one continuation."""
    played = list(rounds(scores, rule))
    return [r for *_, r in played], [tree.size for _, tree, _, _ in played]


def depth1_reliability(all_scores: list[AnchorScores], bins: int = 10) -> dict[str, Any]:
    """Binned reliability of the depth-1 candidate scores (paper Fig. 4b) and its ECE."""
    prob, hit = [], []
    for s in all_scores:
        nxt = s.ids[s.prompt_len + 1 : s.prompt_len + 1 + len(s.topk_ids)]  # [A] target token after each anchor
        prob.append(np.exp(s.topk_logprobs[:, 0, :]).ravel())
        hit.append((s.topk_ids[:, 0, :] == nxt[:, None]).ravel())
    p, h = np.concatenate(prob), np.concatenate(hit).astype(np.float64)
    which = np.minimum((p * bins).astype(int), bins - 1)
    rows, ece = [], 0.0
    for b in range(bins):
        sel = which == b
        if sel.any():
            rows.append({"bin": [b / bins, (b + 1) / bins], "count": int(sel.sum()),
                         "mean_score": round(float(p[sel].mean()), 4), "hit_rate": round(float(h[sel].mean()), 4)})
            ece += sel.sum() / len(p) * abs(p[sel].mean() - h[sel].mean())
    return {"bins": rows, "ece": round(float(ece), 4), "candidates": int(len(p))}


def first_rejection_ranks(all_scores: list[AnchorScores]) -> dict[str, float]:
    """Where the target's token sits in the drafter marginal at the first chain rejection
    (paper Fig. 4a): shares of rank 1 (impossible by definition), 2-4, 5-K and > K."""
    ranks = []
    for s in all_scores:
        for p, _, accepted, _ in rounds(s, chain_rule):
            block = s.topk_ids[p - s.prompt_len]
            if accepted < block.shape[0] and p + accepted + 1 <= len(s.ids) - 1:
                where = np.flatnonzero(block[accepted] == s.ids[p + accepted + 1])
                ranks.append(int(where[0]) + 1 if where.size else block.shape[1] + 1)
    r, k = np.array(ranks), s.topk_ids.shape[2] if all_scores else 0
    if r.size == 0:
        return {"events": 0}
    return {"events": int(r.size), "rank_2_4": round(float(((r >= 2) & (r <= min(4, k))).mean()), 4),
            f"rank_5_{k}": round(float(((r >= 5) & (r <= k)).mean()), 4), f"beyond_{k}": round(float((r > k).mean()), 4)}


def node_hits(scores: AnchorScores, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """(log plug-in mass, hit) of every node of the top-`budget` tree at every anchor.

    A node hits when its path equals the continuation: exactly the nodes the greedy walk
    accepts, so sum(hits) per anchor is the accepted length A of that tree."""
    logmass, hit = [], []
    for a in range(len(scores.topk_ids)):
        p = scores.prompt_len + a
        tree = build_tree(scores.topk_ids[a], np.minimum(scores.topk_logprobs[a], 0.0), budget)
        on_path = np.zeros(tree.size, dtype=bool)
        on_path[accepted_path(tree, scores.ids[p + 1 :])] = True
        logmass.append(tree.score)
        hit.append(on_path)
    return np.concatenate(logmass), np.concatenate(hit)


def mle_exponent(logmass: np.ndarray, hit: np.ndarray) -> float:
    """Maximum-likelihood beta of P(hit) = exp(beta * logmass) over beta in [1/4, 4]
    (log-spaced grid of 241 points; the Bernoulli log-likelihood is concave in beta)."""
    s = np.minimum(np.asarray(logmass, dtype=np.float64), -1e-9)  # log masses < 0
    h = np.asarray(hit, dtype=bool)
    grid = np.exp(np.linspace(np.log(0.25), np.log(4.0), 241))
    ll = [float(np.sum(np.where(h, b * s, np.log1p(-np.exp(b * s))))) for b in grid]
    return float(grid[int(np.argmax(ll))])


def fit_mass_exponent(all_scores: list[AnchorScores], budget: int = 63) -> dict[str, float]:
    """Calibration P(node accepted) = rho ** beta of the plug-in masses (paper Prop. 1:
    the width rule's g(N) is only as good as they are), fitted over the nodes of the
    top-`budget` trees of every anchor; with predicted vs realized mean accepted length."""
    s, h = (np.concatenate(x) for x in zip(*(node_hits(sc, budget) for sc in all_scores)))
    beta = mle_exponent(s, h)
    anchors = sum(len(sc.topk_ids) for sc in all_scores)
    return {"mass_exponent": round(beta, 4), "budget": budget, "nodes": int(len(s)),
            "realized_accepted": round(float(h.sum()) / anchors, 4),
            "predicted_accepted_raw": round(float(np.exp(s).sum()) / anchors, 4),
            "predicted_accepted_calibrated": round(float(np.exp(beta * s).sum()) / anchors, 4)}
