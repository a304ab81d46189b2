"""DFlash training losses over the head's draft vocabulary.

Cross-entropy at block slots 1..L with DFlash's position decay weight exp(-(k-1)/gamma)
on slot k; labels the draft vocabulary cannot name are ignored. Optional distillation:
the target's whole next-token law at each labelled position, read for free from the
final-layer tap (HF's last hidden state is already normed, so lm_head(tap) are the
target's logits), mixed with the hard greedy label.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from drafter_builder.blocks import IGNORE
from runtime.drafter.vocab import DraftHead


def position_weights(num_draft: int, gamma: float | None) -> torch.Tensor:
    """[L] DFlash loss weight of slot k: exp(-(k-1)/gamma); uniform when gamma is None."""
    k = torch.arange(num_draft, dtype=torch.float32)
    return torch.ones(num_draft) if gamma is None else torch.exp(-k / gamma)


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
