"""Where N is chosen: the tree of every drafted request in one round.

Per request: `chain` → the top-1 block chain; `cast` with a fixed budget N → the exact
best-first top-N tree; `cast` with budget `auto` → the width rule on the round's sorted
prefix masses (B = 1), or, with several auto requests in the round, ONE shared budget
M from the batched rule over their pooled masses (Proposition 3) split by global
best-first mass (Proposition 2), each request capped at `max_request_width`.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import numpy as np
import torch

from cast_trtllm.spec_config import AUTO, SpecConfig
from cast_trtllm.tree import Tree, build_chain, build_trees
from runtime.device import upload
from runtime.device_trees import TreeBatch, best_first, chain


class WidthChooser(Protocol):
    """A per-round width rule (`cast_trtllm.width.WidthPolicy` or the online cost model)."""

    max_budget: int
    mass_exponent: float  # calibration beta: a node's acceptance ~= rho ** beta

    def choose(self, masses_desc: np.ndarray, batch: int = 1,
               drafting: int | None = None) -> Any: ...  # -> object with `.budget`


WidthSource = Callable[[int], WidthChooser]  # prefix length -> the rule for that prefix bucket


def choose_trees(
    methods: Sequence[str],
    budgets: Sequence[int | str],
    prefix_lens: Sequence[int],
    ids: np.ndarray,  # [B, L, K]
    lp: np.ndarray,  # [B, L, K]
    spec: SpecConfig,
    width: WidthSource | None,
    scales: Sequence[float],  # per request: realized / forecast acceptance (a gate's correction; 0: one node)
    batch: int | None = None,  # requests the verify pads (the round's; None: these drafting ones)
    depths: Sequence[int] | None = None,  # per request: the deepest node that can still commit (`cap_depth`)
) -> tuple[list[Tree], list[np.ndarray | None]]:
    """One tree per drafted request (same order as `methods`), and the sorted prefix masses
    each `auto` request's tree was chosen from, as drafted, before its scale (None for the others). auto's widths are
    `device_trees`' (`_auto_sizes`), from each request's best-first candidates on the host."""
    lp = cap_depth(lp, depths)
    trees: list[Tree | None] = [None] * len(methods)
    masses: list[np.ndarray | None] = [None] * len(methods)
    auto = [b for b, (m, n) in enumerate(zip(methods, budgets)) if m != "chain" and n == AUTO]
    fixed = [b for b, (m, n) in enumerate(zip(methods, budgets)) if m != "chain" and n != AUTO]
    for b in (b for b, m in enumerate(methods) if m == "chain"):
        trees[b] = build_chain(ids[b], lp[b], min(ids.shape[1], depths[b]) if depths is not None else None)
    for b, tree in zip(fixed, build_trees(ids[fixed], lp[fixed], [int(budgets[b]) for b in fixed])):
        trees[b] = tree  # one search for every fixed budget of the round
    if auto:
        rule, widest = _auto_rule(width, prefix_lens, auto, spec, ids.shape[1])
        score, depth = np.full((len(auto), widest), -np.inf), np.zeros((len(auto), widest))
        wide = build_trees(ids[auto], lp[auto], [widest] * len(auto))  # best first: each top-n tree is a head
        for j, tree in enumerate(wide):
            score[j, :tree.size], depth[j, :tree.size] = tree.score, tree.depth
        sizes = [0] * len(methods)
        _auto_sizes(auto, score, depth, rule, spec, ids.shape[1], scales, sizes, masses, batch or len(methods))
        for b, tree in zip(auto, wide):
            trees[b] = tree.head(min(sizes[b], tree.size))
    return trees, masses  # type: ignore[return-value]


def _auto_rule(width: WidthSource | None, prefix_lens: Sequence[int], auto: list[int], spec: SpecConfig,
               L: int) -> tuple[WidthChooser, int]:
    """auto's width rule (at its longest prefix) and how many best-first candidates each
    auto request needs: its own reach alone, the per-request cap in a shared budget."""
    if width is None:
        raise ValueError("budget 'auto' needs a width rule (a width profile or the online cost model)")
    rule = width(max(prefix_lens[b] for b in auto))
    # several share one budget, and `_split` gives none more than max_request_width: candidates past it
    # could only inflate the pooled masses the budget is priced on (and cost a wider search each round)
    reach = rule.max_budget if len(auto) == 1 else spec.max_request_width
    return rule, min(reach, spec.max_nodes(L))


def cap_depth(lp, depths: Sequence[int] | None):
    """lp [B, L, K] (numpy or torch) with request b's positions from depths[b] on at -inf, never proposed: a
    round commits at most the tokens a request may still emit (its accepted nodes and the bonus token), so a
    node deeper than that less one could never commit (a request 2 tokens from max_tokens verifies 1 level)."""
    L = lp.shape[1]
    if depths is None or min(depths, default=L) >= L:
        return lp
    if isinstance(lp, np.ndarray):
        return np.where((np.arange(L)[None, :] >= np.asarray(depths)[:, None])[:, :, None], -np.inf, lp)
    past = torch.arange(L, device=lp.device)[None, :] >= upload(list(depths), lp.device)[:, None]
    return lp.masked_fill(past[:, :, None], -torch.inf)


def reachable(depth: int, K: int, most: int) -> int:
    """Nodes a K-ary tree holds down to `depth` levels, at most `most` (a fixed budget past it is capped)."""
    total, level = 0, 1
    for _ in range(depth):
        level *= K
        total += level
        if total >= most:
            return most
    return total


def expected_committed(tree: Tree, beta: float) -> float:
    """Forecast committed length of a drafted round: 1 + sum of calibrated node masses."""
    return 1.0 + float((np.exp(tree.score) ** beta).sum())


class MeanBudget:
    """A width rule with no cost model: M = `per_request` × B nodes per round, shared by
    global best-first mass (the paper's App. F `best_first` baseline; also for tests)."""

    mass_exponent = 1.0

    def __init__(self, per_request: int) -> None:
        if per_request < 0:
            raise ValueError(f"per_request must be >= 0, got {per_request}")
        self.max_budget = self.per_request = per_request

    def choose(self, masses_desc: np.ndarray, batch: int = 1, drafting: int | None = None) -> Any:
        from types import SimpleNamespace

        return SimpleNamespace(budget=min(self.per_request * (drafting or batch), len(masses_desc)))


def device_trees(methods: Sequence[str], budgets: Sequence[int | str], prefix_lens: Sequence[int],
                 ids: torch.Tensor, lp: torch.Tensor, spec: SpecConfig, width: WidthSource | None,
                 scales: Sequence[float], read: Callable[[torch.Tensor], np.ndarray], batch: int | None = None,
                 depths: Sequence[int] | None = None, predicted: Sequence[np.ndarray | None] | None = None,
                 ) -> tuple[TreeBatch, list[int], list[np.ndarray | None]]:
    """`choose_trees` on the device: ids, lp [B, L, K] stay there; -> the trees (TreeBatch),
    each request's size and auto's masses. Fixed budgets and chains read nothing. `auto` sizes its
    trees on the host: where every auto request has `predicted` masses (its gate's typical masses, as
    drafted) and `read` can carry a rider, from those, before the round (`_ahead`: nothing is read
    mid-round; its masses land with the round's one read); else from its candidates' scores, read now."""
    B, L, K = ids.shape
    lp, deep = cap_depth(lp, depths), [L] * B if depths is None else [min(L, d) for d in depths]
    cast = [b for b, m in enumerate(methods) if m == "cast"]
    auto = [b for b in cast if budgets[b] == AUTO]
    sizes = [deep[b] if m == "chain" else 0 if b in auto else reachable(deep[b], K, int(budgets[b]))
             for b, m in enumerate(methods)]
    rule, reach = _auto_rule(width, prefix_lens, auto, spec, L) if auto else (None, 0)
    widest = max([sizes[b] for b in cast if b not in auto] + [reach])  # one search for all
    trees = chain(ids, lp) if len(cast) < B else None
    if widest > 0:
        searched = best_first(ids, lp, widest)
        is_cast = upload([b in cast for b in range(B)], ids.device, torch.bool)
        trees = searched if trees is None else TreeBatch.where(is_cast, searched, trees)
    elif trees is None:  # every cast request asked for N = 0
        trees = chain(ids, lp)
    masses: list[np.ndarray | None] = [None] * B
    if auto and predicted is not None and hasattr(read, "ride") and all(predicted[b] is not None for b in auto):
        _ahead(auto, [predicted[b] for b in auto], trees.score, deep, K, widest, rule, spec, L, scales, sizes, masses,
               batch or B, read)
    elif auto:
        pick = upload(auto, ids.device)
        host = read(torch.cat([trees.score[pick, :widest], trees.depth[pick, :widest].double()], 1))
        _auto_sizes(auto, host[:, :widest], host[:, widest:], rule, spec, L, scales, sizes, masses, batch or B)
    return trees.head(upload(sizes, ids.device)), sizes, masses


def _auto_sizes(auto: list[int], score: np.ndarray, depth: np.ndarray, rule: WidthChooser, spec: SpecConfig, L: int,
                scales: Sequence[float], sizes: list[int], masses: list, batch: int) -> None:
    """auto's widths from its requests' best-first scores [A, W] (and depths, for the tie
    order): one request by its own masses; several by ONE shared budget from their pooled
    masses, split by global best-first mass (Proposition 2), each capped at max_request_width and at
    the per-request width the rule priced. The rule prices the round as it runs: `batch` requests
    padded to the widest pack, the budget spread over the A drafting ones."""
    limit = _limit(rule, spec, L, len(auto))
    scaled = []
    for j, b in enumerate(auto):
        masses[b] = np.exp(score[j][np.isfinite(score[j])][: limit // len(auto)])  # as drafted: a gate
        scaled.append(np.minimum(masses[b] * scales[b], 1.0))  # scales them by its own correction (once)
    if len(auto) == 1:
        sizes[auto[0]] = min(int(rule.choose(scaled[0], batch=batch, drafting=1).budget), len(scaled[0]))
    else:
        _split(auto, score, depth, rule, spec, scaled, limit, sizes, batch)
    for b in auto:  # scale 0, a screen: one node, the cheapest verify that still reads acceptance
        sizes[b] = min(1, len(masses[b])) if scales[b] == 0 else sizes[b]


def _limit(rule: WidthChooser, spec: SpecConfig, L: int, requests: int) -> int:
    """The most nodes `requests` auto requests may share in a round (each hands back its share's masses)."""
    return min(rule.max_budget * requests, spec.max_nodes(L) * requests)


def _split(auto: list[int], score: np.ndarray, depth: np.ndarray, rule: WidthChooser, spec: SpecConfig,
           scaled: list[np.ndarray], limit: int, sizes: list[int], batch: int) -> None:
    """Several auto requests: ONE budget from their pooled scaled masses, split by global best-first mass."""
    pooled = np.sort(np.concatenate(scaled))[::-1][:limit]
    choice = rule.choose(pooled, batch=batch, drafting=len(auto))
    total, bucket = int(choice.budget), getattr(choice, "bucket", None)
    # the rule priced every pack padded to `bucket` tokens: none may be wider, since the pass pads every
    # request to its widest pack (B = 4, 16 packed tokens: 79.5 ms as 4 x 4, 96.1 ms as 13 + 1 + 1 + 1)
    cap = min(spec.max_request_width, score.shape[1], bucket - 1 if bucket else score.shape[1])
    s, d = score[:, :cap], depth[:, :cap]
    request = np.broadcast_to(np.arange(len(auto))[:, None], s.shape)
    finite = np.isfinite(s)
    order = np.lexsort((request[finite], d[finite], -s[finite]))[:total]  # score, shorter, request
    counts = np.bincount(request[finite][order], minlength=len(auto))
    for j, b in enumerate(auto):
        sizes[b] = int(counts[j])


def _ahead(auto: list[int], predicted: list[np.ndarray], score: torch.Tensor, deep: list[int], K: int, widest: int,
           rule: WidthChooser, spec: SpecConfig, L: int, scales: Sequence[float], sizes: list[int], masses: list,
           batch: int, read) -> None:
    """auto's sizes from each request's predicted masses, so the round reads the device once (sized on
    its own masses, the round reads them back mid-round and the device waits for the host's rule). The
    table rule's best budget always fills its bucket (mass inside it costs nothing), so only the bucket
    can differ: at B = 1 on this project's CPU, the same table priced the rounds sized ahead 0-2% lower
    in tokens per ms (`perf/results/auto_ahead_cpu.md`). Sizes are capped at the nodes a request's
    depth can hold; its masses as drafted land with the round's read (`HostReads.ride`)."""
    guess = np.full((len(auto), widest), -np.inf)
    with np.errstate(divide="ignore"):
        for j, m in enumerate(predicted):
            guess[j, :min(widest, len(m))] = np.log(m[:widest])
    _auto_sizes(auto, guess, np.zeros_like(guess), rule, spec, L, scales, sizes, [None] * len(sizes), batch)
    share = _limit(rule, spec, L, len(auto)) // len(auto)  # the masses a request hands back (`_auto_sizes`)
    for b in auto:
        held = reachable(deep[b], K, widest)
        sizes[b], masses[b] = min(sizes[b], held), np.zeros(min(share, held))

    def landed(scores: np.ndarray) -> None:  # [A, widest] best first, as drafted
        for j, b in enumerate(auto):
            masses[b][:] = np.exp(scores[j, :len(masses[b])])
    read.ride(score[upload(auto, score.device), :widest], landed)
