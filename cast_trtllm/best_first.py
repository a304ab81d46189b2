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

The enumeration is a plain loop over Python floats: each row is sorted, so a parent's
children are visited best first and the loop stops at the first child below τ; the work
is about twice the number of nodes kept, with no per-level array calls (which cost more
than the whole level on trees of a few hundred nodes). This module knows arrays only;
`cast_trtllm.tree` turns a selection into `Tree`s.
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
        kth = np.array([_kth_best(family.ravel(), keep)])
    elif family.shape[1] < keep:
        return [FLOOR] * B
    else:
        m = family.shape[1] - keep
        family.partition(m, axis=1)
        kth = family[:, m]
    return np.maximum(kth - ROUNDING_SLACK * (1.0 + np.abs(kth)), FLOOR).tolist()


def _tighten(score: list[float], counts: list[int], tau: list[float], keep: int) -> list[float]:
    """Raise τ to the keep-th best score enumerated so far (per request when len(tau) > 1)."""
    scores = np.array(score)
    if len(tau) == 1:
        return [max(tau[0], _kth_best(scores, keep))]
    req = np.repeat(np.arange(len(counts)) % len(tau), counts)
    return [max(t, _kth_best(scores[req == r], keep)) for r, t in enumerate(tau)]


def best_first_pool(lp: np.ndarray, keep: int, per_request: bool) -> Pool:
    """Candidates of the top-`keep` set of the disjoint union of B universes.

    lp: [B, L, K] sorted log-probabilities. With `per_request`, `keep` applies to each
    request's own universe (used with a per-request cap); otherwise to the union
    (Proposition 2). Candidates are enumerated in (depth, request, rank path) order, so a
    stable sort on score alone yields the full Theorem 1 order.
    """
    B, L, K = lp.shape
    if L == 0 or K == 0:  # an empty universe
        return _sorted_pool(np.zeros(0), np.zeros(0, np.int64), [0] * B, [0], max(K, 1))
    tau = seed_bound(lp, keep, per_request)
    score, code, counts, sizes = _enumerate(lp.tolist(), tau, keep)
    return _sorted_pool(score, code, counts, sizes, K)


def _enumerate(rows: list, tau: list[float], keep: int) -> tuple[np.ndarray, np.ndarray, list[int], list[int]]:
    """Every node scoring >= τ, in (depth, request, rank path) order.

    rows: [B][L][K] Python floats; tau: one bound per request, or one for all. Returns
    scores [M], codes [M] (parent entry * K + rank; entries 0..B-1 are the pending roots,
    entry B + i is candidate i), counts [level * B + request] and sizes [level].
    """
    B, L, K = len(rows), len(rows[0]), len(rows[0][0])
    score = [0.0] * B  # the pending roots' entries, then candidates as enumerated
    code = [0] * B
    counts: list[int] = []
    sizes: list[int] = []
    spans = [(r, r + 1) for r in range(B)]  # [request] its entries of the level being expanded
    grown = 0
    add_score, add_code = score.append, code.append
    for d in range(L):
        for r in range(B):
            row, t, begin = rows[r][d], tau[r % len(tau)], len(score)
            best = row[0]
            for i in range(*spans[r]):
                s0 = score[i]
                if s0 + best < t:  # not even the rank-0 child reaches τ
                    continue
                c = i * K
                for v in row:
                    s = s0 + v
                    if s < t:  # the row is sorted: every later sibling is below τ too
                        break
                    add_score(s)
                    add_code(c)
                    c += 1
            spans[r] = (begin, len(score))
            counts.append(len(score) - begin)
        sizes.append(sum(counts[-B:]))
        if not sizes[-1]:
            break
        grown += sizes[-1]
        if grown > GROWTH * keep * (B if len(tau) > 1 else 1):  # the seed was loose: tighten
            tau, grown = _tighten(score[B:], counts, tau, keep), 0
    return np.array(score[B:]), np.array(code[B:], np.int64), counts, sizes


def _sorted_pool(score: np.ndarray, code: np.ndarray, counts: list[int], sizes: list[int], K: int) -> Pool:
    """Decode the enumeration (depth-major, request, rank path) and sort it best first.

    code: [M] parent entry * K + rank, where entries 0..B-1 are the pending roots and
    entry B + i is candidate i. counts: [level * B + request]; sizes: [level] candidates.
    """
    B = len(counts) // len(sizes)
    order = np.argsort(-score, kind="stable")
    position = np.full(B + len(score), -1)  # entry -> pool position; -1 for the roots
    position[B + order] = np.arange(len(order))
    parent, rank = np.divmod(code[order], K)
    depth = np.repeat(np.arange(1, len(sizes) + 1, dtype=np.int32), sizes)
    if B == 1:
        request = np.zeros(len(score), np.int64)
    else:
        request = np.repeat(np.arange(len(counts)) % B, counts)[order]
    return Pool(request, depth[order], rank, position[parent], score[order])


def rank_within_request(pool: Pool, B: int) -> np.ndarray:
    """[M] position of each candidate in its own request's best-first order."""
    by_req = np.argsort(pool.request, kind="stable")
    counts = np.bincount(pool.request, minlength=B)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank = np.empty(len(by_req), np.int64)
    rank[by_req] = np.arange(len(by_req)) - np.repeat(starts, counts)
    return rank
