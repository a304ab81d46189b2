"""Reduced draft vocabulary (EAGLE-3 style `d2t` map) and the drafter's output head.

A head may score only a subset of the target vocabulary: the `draft_vocab_size` most
frequent tokens of the target's own outputs. The checkpoint then holds one extra
tensor next to the z-lab keys, `d2t` int64 [Vd], in EAGLE-3's convention: draft id i
is target id `i + d2t[i]`. Logits over the full vocabulary are -inf outside the draft
vocabulary, so every consumer (top-K, tree, stochastic verifier) keeps the [.., V]
contract; a token the head cannot name simply has drafter mass 0, which keeps the
verifier lossless (Theorem 3 holds for any proposal law).
"""

from __future__ import annotations

from typing import Iterable

import torch

D2T_KEY = "d2t"


def d2t_from_ids(target_ids: torch.Tensor) -> torch.Tensor:
    """[Vd] sorted target ids -> EAGLE-3 offsets d2t (target id = i + d2t[i])."""
    return target_ids.long() - torch.arange(target_ids.numel())


def ids_from_d2t(d2t: torch.Tensor) -> torch.Tensor:
    """[Vd] EAGLE-3 offsets -> the target ids of the draft vocabulary."""
    return torch.arange(d2t.numel(), device=d2t.device) + d2t.long()


def frequent_ids(token_lists: Iterable[torch.Tensor], vocab_size: int, size: int,
                 always: Iterable[int] = ()) -> torch.Tensor:
    """The `size` most frequent ids of `token_lists` (ties: lower id), plus `always`
    (e.g. EOS), sorted ascending: [size] int64."""
    if not 1 <= size <= vocab_size:
        raise ValueError(f"draft vocabulary size must be in [1, {vocab_size}], got {size}")
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for ids in token_lists:
        counts += torch.bincount(ids.long(), minlength=vocab_size).double()
    forced = sorted(set(int(i) for i in always))
    counts[forced] = float("inf")
    # stable sort by count descending keeps lower ids first among equal counts
    order = torch.sort(-counts, stable=True).indices[:size]
    return order.sort().values


def coverage(token_lists: Iterable[torch.Tensor], target_ids: torch.Tensor, vocab_size: int) -> float:
    """Fraction of tokens in `token_lists` that the draft vocabulary can name."""
    member = torch.zeros(vocab_size, dtype=torch.bool)
    member[target_ids.long()] = True
    hit = total = 0
    for ids in token_lists:
        hit += int(member[ids.long()].sum())
        total += ids.numel()
    return hit / max(1, total)


def target_to_draft(target_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[V] int64: the draft id of each target id, -1 where the head cannot name it."""
    t2d = torch.full((vocab_size,), -1, dtype=torch.int64, device=target_ids.device)
    t2d[target_ids.long()] = torch.arange(target_ids.numel(), device=target_ids.device)
    return t2d


class DraftHead:
    """The target's lm_head as the drafter uses it: full, or cut to the draft vocabulary.

    The cut weight [Vd, H] is gathered once, so a draft call costs Vd/V of the full head.
    """

    def __init__(self, lm_head_weight: torch.Tensor, d2t: torch.Tensor | None) -> None:
        self.vocab_size = lm_head_weight.shape[0]
        self.target_ids = None if d2t is None else ids_from_d2t(d2t).to(lm_head_weight.device)
        self.weight = lm_head_weight if d2t is None else lm_head_weight[self.target_ids].contiguous()  # [Vd|V, H]

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> logits over the draft vocabulary [..., Vd] (training)."""
        return hidden @ self.weight.T

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> logits over the target vocabulary [..., V], -inf outside it."""
        return spread(self.draft_logits(hidden), self.target_ids, self.vocab_size)


def spread(sub: torch.Tensor, target_ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Draft-vocabulary logits [..., Vd] -> target-vocabulary logits [..., V], -inf elsewhere."""
    if target_ids is None:
        return sub
    full = sub.new_full((*sub.shape[:-1], vocab_size), float("-inf"))
    return full.index_copy_(-1, target_ids.to(full.device), sub)


class DraftScores:
    """One draft call's marginals q_1..q_L for B requests, over the drafter's own vocabulary.

    logits [B, L, Vd]; target_ids [Vd] the target id of each draft id (None: Vd = V, the
    target's vocabulary). The tree builder only needs each position's top K, which is
    taken over the Vd scored rows (log-softmax over Vd equals it over V: the rest are
    -inf); `full()` spreads them over the target vocabulary for callers that want [B, L, V].
    """

    def __init__(self, logits: torch.Tensor, target_ids: torch.Tensor | None, vocab_size: int) -> None:
        if logits.dim() != 3:
            raise ValueError(f"draft logits must be [B, L, Vd], got shape {tuple(logits.shape)}")
        if target_ids is not None and target_ids.numel() != logits.shape[-1]:
            raise ValueError(f"{target_ids.numel()} draft-vocabulary ids for {logits.shape[-1]} logit columns")
        self.logits, self.target_ids, self.vocab_size = logits, target_ids, vocab_size

    @property
    def num_positions(self) -> int:
        return self.logits.shape[1]

    def row(self, b: int) -> "DraftScores":
        """Request b's marginals alone (a view, B = 1)."""
        return DraftScores(self.logits[b: b + 1], self.target_ids, self.vocab_size)

    def topk(self, k: int, positions: int | None = None, host: bool = True):
        """Target ids and log-probs of each position's top k: [B, L', k] each, L' = positions or L;
        numpy arrays, or tensors left on the logits' device with host=False."""
        from cast_trtllm.tree import topk_per_position

        B, L, Vd = self.logits.shape
        L = L if positions is None else min(positions, L)
        ids, lp = topk_per_position(self.logits[:, :L].reshape(B * L, Vd), k)
        if self.target_ids is not None:
            ids = self.target_ids.to(ids.device)[ids]
        ids, lp = ids.reshape(B, L, k), lp.reshape(B, L, k)
        return (ids.cpu().numpy(), lp.cpu().numpy()) if host else (ids, lp)

    def full(self) -> torch.Tensor:
        """Logits over the target vocabulary [B, L, V], -inf outside the draft vocabulary."""
        return spread(self.logits, self.target_ids, self.vocab_size)
