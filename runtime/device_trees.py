"""A round's trees as tensors on the engine's device: built, masked and walked without a host read.

The same search as `cast_trtllm.best_first` (Theorem 1 order: score descending, ties toward
shorter prefixes, then lexicographic in rank), written for a device: every request at
once, a fixed number of tensor ops per drafted position (no data-dependent shapes, no
loop over nodes), so it can be captured in a CUDA graph and runs eagerly on a CPU.

Level-synchronous: level d holds the best `width` nodes of depth d of each request,
kept in lexicographic rank-path order. A level's children, flattened parent-major, are
in that order too, so a stable sort by score descending ranks them in Theorem 1 order
and a sort of the kept indices restores the lexicographic order. Cutting a level to its
best `width` is exact: a top-`width` node's parent beats it, so every top-`width` node is
among the best `width` of its own depth. The levels, concatenated depth-major, are
stable-sorted once more: the first `width` entries are the top-`width` tree, best first
(parents before children), and its first n entries are the top-n tree.

A `TreeBatch` row is one request's tree; node i sits at pack row i + 1 behind the
pending root at row 0. A node with score -inf is absent (zero drafter mass, or beyond
the request's budget after `head`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cast_trtllm.tree import Tree


@dataclass(frozen=True)
class TreeBatch:
    tokens: torch.Tensor  # [B, W] int64 token of node i
    parent: torch.Tensor  # [B, W] int64 node index of the parent; -1: the pending root
    depth: torch.Tensor  # [B, W] int64 1..L
    score: torch.Tensor  # [B, W] float64 log path mass; -inf: no node here
    max_depth: int  # L: no node is deeper (static: bounds the mask and walk loops)

    @staticmethod
    def from_host(trees: list[Tree], device: torch.device | str) -> "TreeBatch":
        """Host trees padded to the widest (absent nodes after each) -> one upload per field."""
        B, W = len(trees), max((t.size for t in trees), default=0)
        tokens, parent, depth = (np.zeros((B, W), np.int64) for _ in range(3))
        score = np.full((B, W), -np.inf)
        for b, t in enumerate(trees):
            tokens[b, :t.size], parent[b, :t.size], depth[b, :t.size], score[b, :t.size] = (
                t.tokens, t.parent, t.depth, t.score)
        field = [torch.from_numpy(a).to(device) for a in (tokens, parent, depth, score)]
        return TreeBatch(*field, max_depth=max((t.max_depth for t in trees), default=0))

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    def widen(self, width: int) -> "TreeBatch":
        """The same trees with absent nodes appended up to `width` columns."""
        extra = width - self.width
        if extra <= 0:
            return self
        pad = [torch.nn.functional.pad(a, (0, extra), value=v) for a, v in
               ((self.tokens, 0), (self.parent, 0), (self.depth, 1), (self.score, -torch.inf))]
        return TreeBatch(*pad, max_depth=self.max_depth)

    @staticmethod
    def where(rows: torch.Tensor, a: "TreeBatch", b: "TreeBatch") -> "TreeBatch":
        """Row r from `a` where rows[r] ([B] bool), else from `b` (widened to the wider)."""
        width = max(a.width, b.width)
        a, b = a.widen(width), b.widen(width)
        pick = [torch.where(rows[:, None], x, y) for x, y in
                ((a.tokens, b.tokens), (a.parent, b.parent), (a.depth, b.depth), (a.score, b.score))]
        return TreeBatch(*pick, max_depth=max(a.max_depth, b.max_depth))

    def scatter(self, index: torch.Tensor, rows: int) -> "TreeBatch":
        """A batch of `rows` requests holding this batch's row j at row index[j]; the other
        rows hold no node (the empty tree: an AR step)."""
        out = []
        for a, fill in ((self.tokens, 0), (self.parent, 0), (self.depth, 1), (self.score, -torch.inf)):
            full = torch.full((rows, self.width), fill, dtype=a.dtype, device=a.device)
            full[index] = a
            out.append(full)
        return TreeBatch(*out, max_depth=self.max_depth)

    def select(self, index: torch.Tensor) -> "TreeBatch":
        """The rows `index` ([B'] int64) of this batch."""
        return TreeBatch(self.tokens[index], self.parent[index], self.depth[index], self.score[index], self.max_depth)

    def head(self, sizes: torch.Tensor) -> "TreeBatch":
        """Row b keeps its first sizes[b] nodes (its top-sizes[b] tree); sizes: [B] int64."""
        beyond = torch.arange(self.width, device=sizes.device)[None, :] >= sizes[:, None]
        return TreeBatch(self.tokens, self.parent, self.depth, self.score.masked_fill(beyond, -torch.inf), self.max_depth)

    def pack(self, roots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens, parent rows and depths of the packs [B, 1 + W]: the pending roots [B] first."""
        zero = torch.zeros_like(roots)[:, None]
        return (torch.cat([roots[:, None], self.tokens], 1), torch.cat([zero - 1, self.parent + 1], 1),
                torch.cat([zero, self.depth], 1))

    def ancestors(self) -> torch.Tensor:
        """[B, n, n] bool: row t sees packed token t and its ancestors (absent nodes see
        only themselves and the root; nothing reads their rows)."""
        B, n = self.tokens.shape[0], self.width + 1
        parent = self.pack(torch.zeros(B, dtype=torch.int64, device=self.tokens.device))[1].clamp_min(0)
        seen = torch.eye(n, dtype=torch.bool, device=parent.device).expand(B, n, n).clone()
        node = torch.arange(n, device=parent.device).expand(B, n)
        for _ in range(min(self.max_depth, self.width)):  # one level per step
            node = parent.gather(1, node)
            seen.scatter_(2, node[:, :, None], True)
        return seen

    def to_host(self, arrays: dict[str, np.ndarray]) -> list[Tree]:
        """Host `Tree`s from host copies of this batch's tensors (name -> [B, W]); absent
        nodes, which `best_first` and `head` put last, are dropped."""
        trees = []
        for b in range(self.tokens.shape[0]):
            n = int(np.isfinite(arrays["score"][b]).sum())
            trees.append(Tree._trusted(arrays["tokens"][b, :n].copy(), arrays["depth"][b, :n].astype(np.int32),
                                       arrays["parent"][b, :n].astype(np.int32), arrays["score"][b, :n].copy()))
        return trees


def best_first(ids: torch.Tensor, lp: torch.Tensor, width: int) -> TreeBatch:
    """Each request's top-`width` prefix-closed tree by path product, best first.

    ids, lp: [B, L, K] top-K token ids and log-probs per position, sorted descending.
    Scores add root to leaf in float64, as the host search does: equal trees, ties included.
    """
    B, L, K = lp.shape
    if width < 1 or L == 0:
        raise ValueError(f"best_first needs width >= 1 and L >= 1, got width {width}, L {L}")
    lp = lp.to(torch.float64).clamp_max(0.0)
    front = lp.new_zeros(B, 1)  # [B, P] the level being expanded: first the pending roots
    scores, parents, codes = [], [], []  # per level: [B, P'] score, parent (previous level), rank path code
    for d in range(L):
        child = (front[:, :, None] + lp[:, d, None, :]).reshape(B, -1)  # [B, P * K] lexicographic
        if child.shape[1] > width:
            best = torch.sort(child, dim=1, descending=True, stable=True).indices[:, :width]
            best = best.sort(dim=1).values
            child = child.gather(1, best)
        else:
            best = torch.arange(child.shape[1], device=lp.device).expand(B, -1)
        scores.append(child)
        parents.append(best // K)
        codes.append(d * K + best % K)  # flat index into ids[b].reshape(L * K)
        front = child
    sizes = [s.shape[1] for s in scores]
    starts = np.cumsum([0] + sizes[:-1])  # entry of each level's first node
    parent = torch.cat([p + int(starts[d - 1]) if d else torch.full_like(p, -1) for d, p in enumerate(parents)], 1)
    depth = torch.cat([torch.full_like(p, d + 1) for d, p in enumerate(parents)], 1)
    score, code = torch.cat(scores, 1), torch.cat(codes, 1)
    order = torch.sort(score, dim=1, descending=True, stable=True).indices[:, :width]  # Theorem 1 order
    kept = order.shape[1]
    position = torch.full_like(score, -1, dtype=torch.int64)
    position.scatter_(1, order, torch.arange(kept, device=lp.device).expand(B, -1))
    entry = parent.gather(1, order)
    return TreeBatch(
        tokens=ids.reshape(B, L * K).gather(1, code.gather(1, order)),
        parent=torch.where(entry >= 0, position.gather(1, entry.clamp_min(0)), -1),
        depth=depth.gather(1, order),
        score=score.gather(1, order),
        max_depth=L,
    )


def chain(ids: torch.Tensor, lp: torch.Tensor) -> TreeBatch:
    """The top-1 chain of every position (standard DFlash verification). ids, lp: [B, L, K]."""
    B, L, _ = ids.shape
    steps = torch.arange(L, device=ids.device).expand(B, L)
    return TreeBatch(ids[:, :, 0], steps - 1, steps + 1, lp[:, :, 0].to(torch.float64).clamp_max(0.0).cumsum(1), L)


def greedy_accept(tree: TreeBatch, roots: torch.Tensor, argmax: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The greedy walk of every pack at once: the longest path whose tokens equal the
    target's argmax at their parent rows (the first stored of equal siblings).

    roots: [B]; argmax: [B, 1 + W] target argmax per pack row. Returns rows [B, 1 + D]
    (pack rows of the committed path, root first; past the accepted count they repeat the
    last accepted row), accepted [B] node count, committed [B, 1 + D] tokens (the
    accepted ones, then the next pending root: the argmax at the last accepted row).
    """
    tokens, parent_row, _ = tree.pack(roots)
    present = torch.cat([torch.zeros_like(roots[:, None], dtype=torch.bool), tree.score > -torch.inf], 1)
    match = present & (tokens == argmax.gather(1, parent_row.clamp_min(0)))  # [B, n]
    B, n = tokens.shape
    first = torch.arange(n, 0, -1, device=tokens.device)  # ranks the lowest row highest
    row = torch.zeros(B, dtype=torch.int64, device=tokens.device)
    rows, accepted = [row], torch.zeros_like(row)
    for _ in range(min(tree.max_depth, n - 1)):  # one depth per step
        step = match & (parent_row == row[:, None])
        found = step.any(1)
        row = torch.where(found, (step * first).argmax(1), row)
        accepted += found
        rows.append(row)
    rows = torch.stack(rows, 1)  # [B, 1 + D]
    ahead = torch.arange(rows.shape[1] - 1, device=rows.device)[None, :] < accepted[:, None]
    committed = torch.where(ahead, tokens.gather(1, rows[:, 1:]), argmax.gather(1, row[:, None]))
    return rows, accepted, torch.cat([committed, argmax.gather(1, row[:, None])], 1)
