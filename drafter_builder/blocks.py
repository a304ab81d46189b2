"""DFlash blocks of one training sequence: anchors, labels, and the batched block pass.

Anchors a are sampled in the response; each block is `[ids[a], mask, …, mask]` (block
size L+1) and sees the taps of ids[:a] only (the prefix before the root: the drafter
never sees the future); its labels are ids[a+1:a+L+1]. Many blocks of one sequence share
one context pass (each block masks the context at its own anchor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F

from runtime.model.layers import Rotary, default_inv_freq

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


def drafter_rotary(drafter: Any) -> Rotary:
    cfg = drafter.config
    return Rotary(default_inv_freq(cfg.head_dim, cfg.rope_theta))


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
