"""Drafter executor: per-request feature caches and ONE drafter pass per round.

Each request keeps its own feature cache (a `KVCache` of per-layer context K/V covering
exactly its cache-backed prefix x, plus room for one scratch block); `append_context`
adds the taps of newly committed positions x∘b∘y_1:A; `draft` scores the blocks
[b_r, mask, …, mask] of all B requests at positions P_r..P_r+L in one batched forward
(`DFlashDrafter.forward` over `RaggedCaches`). A single request is B = 1.
"""

from __future__ import annotations

from typing import Sequence

import torch

from runtime.batch_forward import RaggedCaches, RaggedTreeAttention
from runtime.drafter.model import DFlashDrafter
from runtime.drafter.vocab import DraftHead, DraftScores
from runtime.kv_cache import KVCache
from runtime.model.layers import Rotary
from runtime.model.llama import LlamaTarget


def bind_to_target(drafter: DFlashDrafter, target: LlamaTarget) -> tuple[DFlashDrafter, Rotary]:
    """Check that the drafter fits the target, move it to the target's device and dtype,
    and build its RoPE there (embeddings and lm_head stay the target's)."""
    cfg = drafter.config
    cfg.check_fits(target.config)
    weight = target.lm_head.weight
    rotary = cfg.rotary().to(weight.device)
    return drafter.to(device=weight.device, dtype=weight.dtype), rotary


class DrafterExecutor:
    def __init__(self, drafter: DFlashDrafter, target: LlamaTarget) -> None:
        self.drafter, self.rotary = bind_to_target(drafter, target)
        cfg = self.drafter.config
        self.device, self.dtype = target.lm_head.weight.device, target.lm_head.weight.dtype
        self.target = target
        self.head = DraftHead(target.lm_head.weight, self.drafter.d2t)
        self.tap_layer_ids = tuple(cfg.target_layer_ids)
        self.num_draft_positions = cfg.num_draft_positions  # L
        self.backend = RaggedTreeAttention()

    @property
    def mass_exponent(self) -> float:
        return self.drafter.config.mass_exponent

    def new_state(self, capacity: int) -> KVCache:
        """An empty feature cache: `capacity` context rows plus one scratch block."""
        cfg = self.drafter.config
        rows = capacity + cfg.block_size
        return KVCache(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, rows, self.dtype, self.device)

    def append_context(self, state: KVCache, taps: torch.Tensor) -> None:
        """taps: [m, F] target taps of the m newly committed positions, in order."""
        positions = torch.arange(state.length, state.length + taps.shape[0], device=self.device)
        self.drafter.append_context(taps, self.rotary(positions, self.dtype), state)

    def draft(self, states: Sequence[KVCache], roots: Sequence[int]) -> torch.Tensor:
        """Logits [B, L, V] of the marginals q_1..q_L of every request's block."""
        return self.draft_scores(states, roots).full()

    @torch.inference_mode()
    def draft_scores(self, states: Sequence[KVCache], roots: Sequence[int]) -> DraftScores:
        """The marginals q_1..q_L of every request's block, over the draft vocabulary [B, L, Vd]."""
        cfg = self.drafter.config
        B, S = len(roots), cfg.block_size
        block = torch.full((B, S), cfg.mask_token_id, dtype=torch.int64, device=self.device)
        block[:, 0] = torch.as_tensor(list(roots), dtype=torch.int64, device=self.device)
        positions = torch.cat([torch.arange(s.length, s.length + S) for s in states]).to(self.device)  # [B*S]
        caches = RaggedCaches(states, [S] * B)
        prepared = self.backend.prepare_unmasked([S] * B)
        hidden = self.drafter(self.target.embed(block.view(-1)), self.rotary(positions, self.dtype), caches,
                              self.backend, prepared)  # [B*S, H]
        return self.head.scores(hidden.view(B, S, -1)[:, 1:])
