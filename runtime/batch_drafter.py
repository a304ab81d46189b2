"""Batched DFlash drafting: per-request feature caches, one drafter pass per round.

Each request keeps its own feature cache (a `KVCache` over its committed context, plus
room for one scratch block); `draft` scores the blocks [b_r, mask…] of all B requests
in ONE batched forward (`runtime.batch_forward.batched_draft`).
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch

from runtime.batch_forward import batched_draft
from runtime.drafter.executor import bind_to_target
from runtime.drafter.model import DFlashDrafter
from runtime.drafter.vocab import DraftHead
from runtime.kv_cache import KVCache
from runtime.model.llama import LlamaTarget


class BatchDraftSource(Protocol):
    """What the batched loop needs from a drafter. `state` is per request, opaque."""

    tap_layer_ids: tuple[int, ...]
    num_draft_positions: int  # L

    def new_state(self, capacity: int) -> object: ...
    def append_context(self, state: object, taps: torch.Tensor) -> None: ...  # taps [m, F]
    def draft(self, states: Sequence[object], roots: Sequence[int]) -> torch.Tensor: ...  # [B, L, V]


class DFlashBatchDrafter:
    def __init__(self, drafter: DFlashDrafter, target: LlamaTarget) -> None:
        self.drafter, self.rotary = bind_to_target(drafter, target)
        cfg = self.drafter.config
        self.device, self.dtype = target.lm_head.weight.device, target.lm_head.weight.dtype
        self.target = target
        self.head = DraftHead(target.lm_head.weight, self.drafter.d2t)
        self.tap_layer_ids = tuple(cfg.target_layer_ids)
        self.num_draft_positions = cfg.num_draft_positions

    def new_state(self, capacity: int) -> KVCache:
        """An empty feature cache: `capacity` context rows plus one scratch block."""
        cfg = self.drafter.config
        rows = capacity + cfg.block_size
        return KVCache(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, rows, self.dtype, self.device)

    def append_context(self, state: KVCache, taps: torch.Tensor) -> None:
        positions = torch.arange(state.length, state.length + taps.shape[0], device=self.device)
        self.drafter.append_context(taps, self.rotary(positions, self.dtype), state)

    @torch.inference_mode()
    def draft(self, states: Sequence[KVCache], roots: Sequence[int]) -> torch.Tensor:
        """Logits [B, L, V] of the marginals q_1..q_L of every request's block."""
        cfg = self.drafter.config
        block = torch.full((len(roots), cfg.block_size), cfg.mask_token_id, dtype=torch.int64, device=self.device)
        block[:, 0] = torch.as_tensor(list(roots), dtype=torch.int64, device=self.device)
        hidden = batched_draft(self.drafter, self.rotary, states, self.target.embed(block))  # [B, L, H]
        return self.head(hidden)
