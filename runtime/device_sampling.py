"""Theorem 3's lossless walk for every sampled request of a round at once, on the engine's device.

The recursive rejection sampling of `cast_trtllm.verify` (its module docstring states the
math and the terminology), written level-synchronously for a batch of walks: at level d
each live walk resolves the node it stands on (its target law p, its retained children's
proposal q~, an exponential race for the order, one acceptance test per child), then
either moves to the accepted child or stops with the recovered / bonus token. A fixed
number of tensor ops per level and per child slot; no host read, no data-dependent shape.

Sparse residual. q~ lives on the node's children only, so the residual mu differs from
the target law p only on the children's tokens: it is kept as its values there
(`mu` [B, C]) and one factor for every other token (`scale` [B]: their mass is p's times
it). A rejection costs O(C) instead of a pass over the vocabulary, and a level costs one
normalizer of the node's law; the full vector is formed once per walk, after the last
level, for its final draw.

Randomness: each walk brings its own uniforms [levels, 2K + 1] (race keys, acceptance
tests, final draw), drawn by the caller from the request's seeded generator, so a seed
reproduces a request's output whatever else shares its batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cast_trtllm.sampling import SamplingParams, processed_rows, sample_from
from cast_trtllm.verify import RESIDUAL_FLOOR
from runtime.device_trees import TreeBatch


def sampled_accept(tree: TreeBatch, logits: torch.Tensor, offsets: torch.Tensor, params: Sequence[SamplingParams],
                   uniforms: torch.Tensor, children: int | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One lossless stochastic walk per row of `tree`, all at once.

    tree: [B, W] the walks' trees (siblings carry distinct tokens, as best-first trees do);
    logits: [R, V] the verify pass's rows, walk b's pack row r at logits[offsets[b] + r];
    params: B sampling laws (temperature > 0); uniforms: [B, levels, 2K + 1] float64 with
    levels >= 1 + the deepest node's depth; children: C <= K, the most children of any node
    (default K). Level d uses uniforms[:, d]: race keys [:C], tests [K:K + C], final draw [2K].
    Returns, like `device_trees.greedy_accept`: rows [B, levels] (pack rows of the path,
    root first; then the last one repeated), accepted [B] node count, committed [B, levels]
    (the accepted tokens, then the next pending root at column `accepted`).
    """
    B, depth = tree.tokens.shape[0], min(tree.max_depth, tree.width)
    levels, K = uniforms.shape[1], (uniforms.shape[2] - 1) // 2
    C = K if children is None else children
    if uniforms.shape[0] != B or uniforms.shape[2] != 2 * K + 1 or not 1 <= C <= K or levels <= depth:
        raise ValueError(f"uniforms must be [B={B}, levels > {depth}, 2K + 1] with 1 <= children <= K, got "
                         f"{tuple(uniforms.shape)} and children {children}")
    tree = tree.widen(1)  # an AR step's empty tree: one absent node, so every gather has a column
    W = tree.width
    dev = logits.device
    present = tree.score > -torch.inf  # [B, W]
    first = torch.arange(W, 0, -1, device=dev)  # ranks the first stored node highest
    slots = torch.arange(C, device=dev)
    row = torch.zeros(B, dtype=torch.int64, device=dev)  # the pack row each walk stands on
    live = torch.ones(B, dtype=torch.bool, device=dev)
    accepted = torch.zeros_like(row)
    committed = torch.zeros(B, levels, dtype=torch.int64, device=dev)
    rows = []
    # each walk's final residual (where it stopped), drawn from after the loop
    stop = {"row": row, "at": row, "u": uniforms[:, 0, 2 * K], "scale": torch.ones(B, dtype=torch.float64, device=dev),
            "mu": torch.zeros(B, C, dtype=torch.float64, device=dev), "tok": row.new_zeros(B, C),
            "valid": torch.zeros(B, C, dtype=torch.bool, device=dev)}
    for d in range(levels):  # a live walk has accepted d nodes at level d
        rows.append(row)
        z = processed_rows(logits[offsets + row], params)  # [B, V] the law at the node, as logits
        u = uniforms[:, d]  # [B, 2K + 1]
        # the node's retained children (at most C), their tokens and the proposal q~ on them
        is_kid = present & (tree.parent + 1 == row[:, None])  # [B, W]
        kid = torch.nn.functional.pad((is_kid * first).topk(min(C, W), dim=1).indices, (0, max(0, C - W)))  # [B, C]
        valid = is_kid.gather(1, kid) & (slots < W)
        above = torch.where(row > 0, tree.score.gather(1, (row - 1).clamp_min(0)[:, None])[:, 0], 0.0)
        log_q = torch.where(valid, tree.score.gather(1, kid) - above[:, None], -torch.inf)
        q = torch.nan_to_num(torch.softmax(log_q, dim=1)) * valid  # [B, C] (a childless node: zeros)
        # exponential race: the order children are tried in, without replacement from q~
        order = torch.where(valid, -torch.log(u[:, :C]) / q, torch.inf).argsort(dim=1)
        q_s, valid_s, kid_s = q.gather(1, order), valid.gather(1, order), kid.gather(1, order)
        tok_s = tree.tokens.gather(1, kid_s)
        avail = q_s.flip(1).cumsum(1).flip(1)  # [B, C] proposal mass not yet tried
        p_kids = (z.gather(1, tok_s) - torch.logsumexp(z, dim=1, keepdim=True)).exp() * valid_s  # [B, C] p there
        rest = (1.0 - p_kids.sum(1)).clamp_min(0.0)  # p's mass off the children
        mu, scale = p_kids, torch.ones(B, dtype=torch.float64, device=dev)
        slot, active = torch.full_like(row, -1), live.clone()
        for s in range(C):
            tried = active & valid_s[:, s]
            q_tilde = q_s[:, s] / avail[:, s].clamp_min(RESIDUAL_FLOOR)
            ok = tried & (u[:, K + s] * q_tilde < mu[:, s])  # accept w.p. min(1, mu(c) / q~(c))
            slot = torch.where(ok, s, slot)
            active &= ~ok
            rejected = tried & ~ok  # mu <- norm((mu - q~)_+), q~ renormalized over the untried children
            q_left = torch.where(slots >= s, q_s / avail[:, s:s + 1].clamp_min(RESIDUAL_FLOOR), 0.0)
            cut = (mu - q_left).clamp_min(0.0)
            mass = cut.sum(1) + scale * rest
            spent = mass <= RESIDUAL_FLOOR  # rounding left no mass: back to p (cast_trtllm.verify)
            mu = torch.where((rejected & spent)[:, None], p_kids,
                             torch.where(rejected[:, None], cut / mass.clamp_min(RESIDUAL_FLOOR)[:, None], mu))
            scale = torch.where(rejected & spent, 1.0, torch.where(rejected, scale / mass.clamp_min(RESIDUAL_FLOOR),
                                                                     scale))
        moved = live & (slot >= 0)
        ends = live & ~moved  # every child rejected, or a leaf: keep the residual for the final draw
        for key, value in (("row", row), ("at", torch.full_like(row, d)), ("u", u[:, 2 * K]), ("scale", scale),
                           ("mu", mu), ("tok", tok_s), ("valid", valid_s)):
            stop[key] = torch.where(ends if value.dim() == 1 else ends[:, None], value, stop[key])
        committed[:, d] = torch.where(moved, tok_s.gather(1, slot.clamp_min(0)[:, None])[:, 0], committed[:, d])
        accepted += moved
        row = torch.where(moved, kid_s.gather(1, slot.clamp_min(0)[:, None])[:, 0] + 1, row)
        live = moved
    # the recovered (or, at a leaf, bonus) token: ONE full-vocabulary law per walk, at the row it stopped on
    law = torch.softmax(processed_rows(logits[offsets + stop["row"]], params), dim=1) * stop["scale"][:, None]
    law = law.scatter_add(1, stop["tok"], (stop["mu"] - law.gather(1, stop["tok"])) * stop["valid"]).clamp_min(0.0)
    committed.scatter_(1, stop["at"][:, None], sample_from(law, stop["u"])[:, None])
    return torch.stack(rows, 1), accepted, committed
