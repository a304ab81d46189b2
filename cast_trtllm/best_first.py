"""The best-first search behind every tree (paper §3.2, App. C; Theorem 1, Proposition 2).

Input: B requests' top-K log-probabilities `lp` [B, L, K], each row sorted descending.
A node is a rank path (r_1..r_d) of one request, scored by its path sum
`score = lp[0, r_1] + ... + lp[d-1, r_d]` (log plug-in mass, eq. 1), added root to leaf.
Theorem 1 order: score descending, ties toward shorter prefixes, then request, then
lexicographic in rank. The best `keep` nodes in that order are prefix-closed.

The search enumerates every node whose score reaches a lower bound τ on the final
keep-th best score, level by level (depth-major, then request, then rank path), and sorts
them once. Any τ at or below that score is exact: a node below τ, and with it every
descendant (scores only fall along a path), cannot be in the top set, and ties at τ are
kept. τ decides only how much is enumerated:

- seed τ: the keep-th best score of the *one-deviation family*, the nodes that follow
  the top-1 chain except at one position. They are real nodes, so their keep-th best is a
  lower bound, and on a peaked drafter head it is nearly tight: about `keep` nodes are
  enumerated.
- running τ: the keep-th best score enumerated so far, recomputed when the enumeration
  outgrows the seed's promise (flat marginals, small L or K), which bounds the work there.

The enumeration is level-synchronous and vectorized: a level is a few array calls on
its [P, K] children (P parents), with no loop over nodes. A level wider than `keep` (per
request) is cut to its best `keep` in Theorem 1 order, which is exact (a top-`keep` node
is among the best `keep` of its own depth) and bounds every level at keep * B nodes, even
when all strings tie. This module knows arrays only; `cast_trtllm.tree` turns a
selection into `Tree`s.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

GROWTH = 4  # recompute the running τ once a level takes the count past GROWTH * keep
FLOOR = -sys.float_info.max  # τ never below this: zero-mass (-inf) nodes never qualify
ROUNDING_SLACK = 1e-9  # relative: the seed bound's sum is rounded unlike a node's score


@dataclass(frozen=True, slots=True)
class Pool:
    """Every enumerated candidate, sorted in Theorem 1 order; parents come first.

    Zero-mass (score -inf) strings are never candidates.
    """

    request: np.ndarray  # [M] int64 request of each candidate
    depth: np.ndarray  # [M] int32, 1..L
    rank: np.ndarray  # [M] int64 rank of the node's token within its position's top-K
    parent: np.ndarray  # [M] int64 position (in this pool) of the parent, -1 at depth 1
    score: np.ndarray  # [M] float64 log path mass


def check_topk(topk_ids: np.ndarray, topk_logprobs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Validate [..., L, K] top-k ids / log-probs; returns (int64 ids, float64 logprobs <= 0)."""
    ids = np.asarray(topk_ids)
    if ids.ndim < 2 or ids.shape != np.shape(topk_logprobs):
        raise ValueError(
            f"topk_ids and topk_logprobs must both be [L, K]; got {ids.shape} and {np.shape(topk_logprobs)}"
        )
    return ids.astype(np.int64, copy=False), check_logprobs(topk_logprobs)


def check_logprobs(topk_logprobs: np.ndarray) -> np.ndarray:
    """Validate [..., L, K] top-k log-probs, sorted descending per position; float64, <= 0.

    The search relies on the order: it stops at a parent's first child below τ.
    """
    lp = np.asarray(topk_logprobs, dtype=np.float64)
    if lp.ndim < 2:
        raise ValueError(f"topk_logprobs must be [L, K], got shape {lp.shape}")
    if not (lp.max(initial=-np.inf) <= 1e-6):  # also catches NaN
        raise ValueError("topk_logprobs must be log-probabilities (<= 0, no NaN)")
    if lp.shape[-1] > 1 and (lp[..., 1:] > lp[..., :-1] + 1e-12).any():
        raise ValueError("topk_logprobs must be sorted descending within each position")
    return np.minimum(lp, 0.0)


@lru_cache(maxsize=64)
def _family_index(L: int, K: int) -> np.ndarray:
    """Flat indices into [d, j, k] (L, L, K) of the one-deviation family (see seed_bound)."""
    d, j, k = np.meshgrid(np.arange(L), np.arange(L), np.arange(K), indexing="ij")
    member = ((j <= d) & (k >= 1)) | ((j == 0) & (k == 0))  # deviations, and the chain once
    return np.flatnonzero(member.ravel())


def _kth_best(score: np.ndarray, k: int) -> float:
    """k-th largest of a 1-D scratch array (-inf where it has fewer than k); reorders it."""
    m = len(score) - k
    if m < 0:
        return -np.inf
    score.partition(m)
    return float(score[m])


def seed_bound(lp: np.ndarray, keep: int, per_request: bool) -> list[float]:
    """Lower bound τ on the keep-th best score, from the one-deviation family.

    lp: [B, L, K]. Members: the top-1 chain node of each depth d + 1, and (d, j, k >= 1):
    the chain to depth d + 1 with rank k at position j <= d, scored
    chain[d] + lp[j, k] - lp[j, 0]. Returns B bounds (per request) or one (pooled).
    That sum is associated differently from a node's score (added root to leaf), so the
    bound is lowered by ROUNDING_SLACK: a tie with the keep-th node is never cut by an ulp.
    """
    B, L, K = lp.shape
    top = lp[:, :, 0]  # [B, L]
    chain = top.cumsum(axis=1)  # [B, L] score of the chain node at depth d + 1
    step = lp - np.maximum(top, FLOOR)[:, :, None]  # [B, L, K]; finite even on -inf rows
    family = (chain[:, :, None, None] + step[:, None]).reshape(B, -1).take(_family_index(L, K), axis=1)
    if not per_request:
        kth = _kth_best(family.ravel(), keep)
        return [max(kth - ROUNDING_SLACK * (1.0 + abs(kth)), FLOOR)]
    if family.shape[1] < keep:
        return [FLOOR] * B
    m = family.shape[1] - keep
    family.partition(m, axis=1)
    kth = family[:, m]
    return np.maximum(kth - ROUNDING_SLACK * (1.0 + np.abs(kth)), FLOOR).tolist()


def _tighten(score: np.ndarray, request: np.ndarray | None, tau: float | np.ndarray, keep: int) -> float | np.ndarray:
    """Raise τ to the keep-th best score enumerated so far (per request when τ is an array).

    score, request: [M] every candidate so far (request None with one universe).
    """
    if request is None:
        return max(tau, _kth_best(score, keep))
    order = np.lexsort((-score, request))  # request-major, best first within each
    counts = np.bincount(request, minlength=len(tau))  # [B]
    kth = np.cumsum(counts) - counts + keep - 1  # [B] position of each request's keep-th best
    best = np.where(counts >= keep, score[order[np.minimum(kth, len(order) - 1)]], -np.inf)
    return np.maximum(tau, best)


def _truncate(score: np.ndarray, request: np.ndarray | None, keep: int) -> np.ndarray | None:
    """[P] bool: a level's best `keep` nodes (per request with `request`); None if all are.

    score, request: [P] one level in (request, rank path) order. Within one depth the
    Theorem 1 order is score descending, then that order, so a stable sort decides ties.
    Every top-`keep` node is among its own depth's best `keep`: cutting there is exact.
    """
    kept = np.zeros(len(score), bool)
    if request is None:
        kept[np.argsort(-score, kind="stable")[:keep]] = True
        return kept
    counts = np.bincount(request)
    if counts.max() <= keep:
        return None
    order = np.lexsort((-score, request))  # stable: ties stay in (request, rank path) order
    kept[order[np.arange(len(order)) - np.repeat(np.cumsum(counts) - counts, counts) < keep]] = True
    return kept


def best_first_pool(lp: np.ndarray, keep: int, per_request: bool) -> Pool:
    """Candidates of the top-`keep` set of the disjoint union of B universes.

    lp: [B, L, K] sorted log-probabilities. With `per_request`, `keep` applies to each
    request's own universe (used with a per-request cap); otherwise to the union
    (Proposition 2). Candidates are enumerated in (depth, request, rank path) order, so a
    stable sort on score alone yields the full Theorem 1 order: a boolean selection of a
    level's [P, K] children is row-major (parent, then rank), which keeps that order.
    """
    B, L, K = lp.shape
    if L == 0 or K == 0:  # an empty universe
        return _sorted_pool([], np.zeros(0, np.int64), [], [], B, 1)
    one = B == 1 or not per_request  # one τ for every candidate
    tau = seed_bound(lp, keep, per_request)  # [B] or [1]
    bound = tau[0] if one else np.asarray(tau)
    score, request = np.zeros(B), np.arange(B)  # [P] the level being expanded: first the pending roots
    masks, scores, requests, shifts = [], [], [], []  # per depth: [P * K] kept, [P'] score, request; int
    base, entries, cells, grown = 0, B, 0, 0  # entry of the first parent; entries; cells of earlier levels
    for d in range(L):
        child = score[:, None] + (lp[0, d] if B == 1 else lp[request, d])  # [P, K], summed root to leaf
        mask = child >= (bound if one else bound[request, None])  # [P, K]
        score = child[mask]  # [P'] parent-major: (request, rank path) order
        if not len(score):
            break
        if B > 1:
            request = request.repeat(mask.sum(axis=1))
        if len(score) > keep:
            kept = _truncate(score, None if one else request, keep)
            if kept is not None:
                mask[mask] = kept
                score, request = score[kept], request[kept] if B > 1 else request
        masks.append(mask.ravel())
        scores.append(score)
        requests.append(request)
        shifts.append(base * K - cells)  # cell cells + p * K + k -> code (base + p) * K + k
        base, entries, cells, grown = entries, entries + len(score), cells + mask.size, grown + len(score)
        if grown > GROWTH * keep * (1 if one else B):  # the seed was loose: tighten
            so_far = np.concatenate(scores)
            bound, grown = _tighten(so_far, None if one else np.concatenate(requests), bound, keep), 0
    sizes = [len(s) for s in scores]  # [levels]
    code = np.flatnonzero(np.concatenate(masks)) + np.repeat(shifts, sizes) if masks else np.zeros(0, np.int64)
    return _sorted_pool(scores, code, sizes, requests if B > 1 else [], B, K)


def _sorted_pool(scores: list[np.ndarray], code: np.ndarray, sizes: list[int], requests: list[np.ndarray], B: int,
                 K: int) -> Pool:
    """Sort the enumeration (depth-major, request, rank path) best first.

    scores, requests: per depth, [P] each (requests [] when B = 1); sizes: [levels] P.
    code: [M] parent entry * K + rank, where entries 0..B-1 are the pending roots and
    entry B + i is candidate i.
    """
    score = np.concatenate(scores) if scores else np.zeros(0)  # [M]
    order = np.argsort(-score, kind="stable")
    position = np.full(B + len(score), -1)  # entry -> pool position; -1 for the roots
    position[B + order] = np.arange(len(order))
    parent, rank = np.divmod(code[order], K)
    depth = np.repeat(np.arange(1, len(sizes) + 1, dtype=np.int32), sizes)
    request = np.concatenate(requests)[order] if requests else np.zeros(len(score), np.int64)
    return Pool(request, depth[order], rank, position[parent], score[order])


def rank_within_request(pool: Pool, B: int) -> np.ndarray:
    """[M] position of each candidate in its own request's best-first order."""
    by_req = np.argsort(pool.request, kind="stable")
    counts = np.bincount(pool.request, minlength=B)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(len(by_req), np.int64)
    rank[by_req] = np.arange(len(by_req)) - np.repeat(starts, counts)
    return rank
