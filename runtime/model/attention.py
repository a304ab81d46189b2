"""Attention backends for the target's packed forward.

A backend is the one swappable piece of the verify pass: `prepare` runs once per
forward (it sees the pack's tree and prefix length and builds whatever mask form the
kernel wants: additive matrix, packed bitmask, …); `__call__` runs once per layer on
that prepared state. The default `SdpaAttention` uses an additive ancestor mask with
`torch.nn.functional.scaled_dot_product_attention` and runs anywhere; a tree-attention
kernel (plugins/tree_attention) plugs in through the same two methods.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch.nn import functional as F

from cast_trtllm.masks import additive_mask
from cast_trtllm.tree import Tree


class AttentionBackend(Protocol):
    def prepare(
        self, prefix_len: int, num_tokens: int, tree: Tree | None, dtype: torch.dtype, device: torch.device
    ) -> Any:
        """State shared by every layer of one forward. `tree is None` means causal."""
        ...

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prepared: Any) -> torch.Tensor:
        """q: [Hq, n, d]; k, v: [Hkv, P+n, d] (cache view incl. the new rows).
        Returns [Hq, n, d]."""
        ...


def causal_additive_mask(prefix_len: int, num_tokens: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[1, 1, n, P+n]: row i sees the prefix and new tokens 0..i."""
    cols = torch.arange(prefix_len + num_tokens, device=device)
    rows = prefix_len + torch.arange(num_tokens, device=device)
    visible = cols[None, :] <= rows[:, None]
    mask = torch.zeros(visible.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


class SdpaAttention:
    """Reference backend: SDPA (math/flash as torch picks) with an additive mask."""

    def prepare(
        self, prefix_len: int, num_tokens: int, tree: Tree | None, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor | None:
        if tree is None:
            # None = plain causal over a fresh sequence (SDPA's is_causal fast path)
            return None if prefix_len == 0 else causal_additive_mask(prefix_len, num_tokens, dtype, device)
        if tree.num_packed != num_tokens:
            raise ValueError(f"tree packs {tree.num_packed} tokens but {num_tokens} were given")
        return additive_mask(tree, prefix_len, dtype=dtype, device=device)  # [1, 1, n, P+n]

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prepared: torch.Tensor | None
    ) -> torch.Tensor:
        out = F.scaled_dot_product_attention(
            q[None], k[None], v[None], attn_mask=prepared, is_causal=prepared is None, enable_gqa=True
        )
        return out[0]
