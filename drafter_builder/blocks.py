"""DFlash blocks of one training sequence: anchors, labels, the batched block pass, the losses.

Anchors a are sampled in the response; each block is `[ids[a], mask, …, mask]` (block
size L+1) and sees the taps of ids[:a] only (the prefix before the root: the drafter
never sees the future); its labels are ids[a+1:a+L+1]. Many blocks of one sequence share
one context pass (each block masks the context at its own anchor).

Losses, over the head's draft vocabulary: cross-entropy at block slots 1..L with DFlash's
position decay weight exp(-(k-1)/gamma) on slot k; labels the draft vocabulary cannot name
are ignored. Optional distillation: the target's whole next-token law at each labelled
position, read for free from the final-layer tap (HF's last hidden state is already normed,
so lm_head(tap) are the target's logits), mixed with the hard greedy label.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

from runtime.drafter.vocab import DraftHead
from runtime.model.layers import Rotary

IGNORE = -100  # label of a slot past the end of the response, or outside the draft vocabulary


@dataclass(frozen=True, slots=True)
class FrozenTarget:
    """The pieces of the target the drafter borrows (never trained)."""

    embed_weight: torch.Tensor  # [V, H]
    lm_head_weight: torch.Tensor  # [V, H]

    @staticmethod
    def from_hf(model: Any) -> "FrozenTarget":
        return FrozenTarget(
            model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
        )


def sample_anchors(prompt_len: int, length: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """[n] sorted anchor positions a in [prompt_len, length-2] (each has >= 1 label)."""
    lo, hi = prompt_len, length - 2
    if hi < lo:
        return torch.empty(0, dtype=torch.long)
    pick = torch.randperm(hi - lo + 1, generator=gen)[:count] + lo
    return pick.sort().values


def block_labels(ids: torch.Tensor, anchors: torch.Tensor, num_draft: int) -> torch.Tensor:
    """[n, L] target-id labels ids[a+1..a+L]; IGNORE past the end of the sequence."""
    idx = anchors[:, None] + torch.arange(1, num_draft + 1, device=ids.device)[None, :]  # [n, L]
    labels = torch.full(idx.shape, IGNORE, dtype=torch.long, device=ids.device)
    ok = idx < ids.numel()
    labels[ok] = ids.long()[idx[ok]]
    return labels


def to_draft_labels(labels: torch.Tensor, t2d: torch.Tensor | None) -> torch.Tensor:
    """[n, L] target-id labels -> draft-vocabulary labels (IGNORE where it cannot name them)."""
    if t2d is None:
        return labels
    out = torch.full_like(labels, IGNORE)
    ok = labels != IGNORE
    mapped = t2d[labels[ok]]
    out[ok] = torch.where(mapped >= 0, mapped, torch.full_like(mapped, IGNORE))
    return out


class ContextKV:
    """Training's feature "cache" for `DFlashDrafter.forward`: nothing is stored. `write`
    returns the layer's context K/V, projected from the taps' features, with the block
    rows' own k/v appended: [Hkv, m + T, d] (the serving cache returns the same layout)."""

    def __init__(self, drafter: Any, context: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.drafter, self.context, self.rope = drafter, context, rope  # context [m, H]; rope cos, sin [m, d]

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v: [Hkv, T, d] of the block rows -> keys, values [Hkv, m + T, d]."""
        ck, cv = self.drafter.layers[layer].self_attn.key_value(self.context, self.rope)  # [Hkv, m, d]
        return torch.cat([ck, k], 1), torch.cat([cv, v], 1)


class VisibleSDPA:
    """Training's attention backend: SDPA under a boolean visibility mask [T, m + T] (True = attend)."""

    @staticmethod
    def prepare(anchors: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
        """Row r of block j sees the context before its root (columns < a_j) and its own
        block, non-causally: [n*(L+1), m + n*(L+1)] bool."""
        dev = anchors.device
        owner = torch.arange(anchors.numel(), device=dev).repeat_interleave(block_size)  # block of each row
        before_root = torch.arange(context_len, device=dev)[None, :] < anchors[owner][:, None]
        return torch.cat([before_root, owner[:, None] == owner[None, :]], dim=1)

    def __call__(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor
                 ) -> torch.Tensor:
        """q: [Hq, T, d]; keys, values: [Hkv, m + T, d] -> [Hq, T, d]."""
        keys, values = keys.to(q.dtype), values.to(q.dtype)  # autocast: normed q, k and bare v may differ in dtype
        return F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=visible, enable_gqa=True)[0]


def block_hidden(
    drafter: Any,  # runtime.drafter.DFlashDrafter (trainable)
    embed_weight: torch.Tensor,  # [V, H] frozen target embeddings
    rotary: Rotary,  # of the drafter
    taps: torch.Tensor,  # [m, F] target taps of ids[:m]
    ids: torch.Tensor,  # [T] token ids of the sequence
    anchors: torch.Tensor,  # [n] root positions, each <= m
) -> torch.Tensor:
    """Normed hidden states [n, L, H] of n blocks of one sequence in one pass.

    Runs the serving layer stack, `DFlashDrafter.forward`, on the n blocks laid end to
    end, over the whole sequence's context features (`ContextKV`) with each block masked
    at its own root (`VisibleSDPA`): block j sees exactly what a feature cache holding
    taps[:a_j] shows the runtime's draft call.
    """
    cfg, dev = drafter.config, taps.device  # ids and anchors live on the taps' device
    n, width, m = anchors.numel(), cfg.block_size, taps.shape[0]
    block_ids = torch.full((n, width), cfg.mask_token_id, dtype=torch.long, device=dev)
    block_ids[:, 0] = ids.long()[anchors]
    embeds = F.embedding(block_ids, embed_weight).reshape(n * width, -1)  # [n*(L+1), H]
    pos = (anchors[:, None] + torch.arange(width, device=dev)[None, :]).reshape(-1)  # [n*(L+1)]
    context = ContextKV(drafter, drafter.hidden_norm(drafter.fc(taps)),  # features [m, H]
                        rotary(torch.arange(m, device=dev), embeds.dtype))
    backend = VisibleSDPA()
    hidden = drafter(embeds, rotary(pos, embeds.dtype), context, backend, backend.prepare(anchors, m, width))
    return hidden.view(n, width, -1)[:, 1:]  # [n, L, H]: slot 0 of each block is its root


def block_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted mean cross-entropy. logits [n, L, Vd]; labels [n, L] (draft ids); weights [L]."""
    ce = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE, reduction="none")
    w = (weights[None, :] * (labels != IGNORE)).flatten()
    return (ce * w).sum() / w.sum().clamp_min(1e-9)


@torch.no_grad()
def target_block_logprobs(final_taps: torch.Tensor, head: DraftHead, anchors: torch.Tensor, num_draft: int
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's law over the draft vocabulary at every slot of n blocks.

    final_taps [m, H]: the final-layer taps (normed last hidden states) of ids[:m+1];
    slot k of the block at anchor a predicts ids[a+k], the target's law at position a+k-1.
    Returns log-probs [n, L, Vd] (renormalized over the draft vocabulary) and valid [n, L]
    (False past the end of the sequence). The lm_head runs once per distinct position.
    """
    pos = anchors[:, None] + torch.arange(num_draft, device=anchors.device)[None, :]  # [n, L] positions a+k-1
    valid = pos < final_taps.shape[0]
    lo, hi = int(anchors.min()), int(pos[valid].max()) + 1
    logp = torch.log_softmax(head.draft_logits(final_taps[lo:hi].float()), dim=-1)  # [hi-lo, Vd]
    return logp[(pos.clamp(max=hi - 1) - lo)], valid


def soft_block_loss(logits: torch.Tensor, target_logp: torch.Tensor, valid: torch.Tensor, weights: torch.Tensor
                    ) -> torch.Tensor:
    """Weighted mean cross-entropy against the target's law (forward KL + its entropy).

    logits [n, L, Vd]; target_logp [n, L, Vd]; valid [n, L]; weights [L]."""
    ce = -(target_logp.exp() * torch.log_softmax(logits.float(), dim=-1)).sum(-1)  # [n, L]
    w = weights[None, :] * valid
    return (ce * w).sum() / w.sum().clamp_min(1e-9)


def final_tap_columns(drafter: Any, num_target_layers: int) -> slice:
    """Columns of the final-layer tap inside the drafter's taps (distillation reads them)."""
    ids = list(drafter.config.target_layer_ids)
    hidden, last = drafter.fc.in_features // len(ids), num_target_layers - 1
    if last not in ids:
        raise ValueError(f"distillation (kd_weight > 0) reads the target's law from the tap of its final layer "
                         f"{last}; the head taps layers {ids}: add {last} to its target_layer_ids or set kd_weight 0")
    j = ids.index(last)
    return slice(j * hidden, (j + 1) * hidden)
