"""Drafter executor: the feature cache and one draft call per round.

The feature cache (per drafter layer K/V of the context) covers exactly the
cache-backed prefix x; `append_context` adds the taps of the committed positions
x∘b∘y_1:A after each round; `draft(b)` scores the L future positions of
[b, mask, …, mask] at positions P..P+L in one forward.
"""

from __future__ import annotations

import torch

from runtime.drafter.model import DFlashDrafter
from runtime.drafter.vocab import DraftHead
from runtime.kv_cache import KVCache
from runtime.model.layers import Rotary, default_inv_freq
from runtime.model.llama import LlamaTarget


def bind_to_target(drafter: DFlashDrafter, target: LlamaTarget) -> tuple[DFlashDrafter, Rotary]:
    """Check that the drafter fits the target, move it to the target's device and dtype,
    and build its RoPE there (embeddings and lm_head stay the target's)."""
    cfg = drafter.config
    cfg.check_fits(target.config)
    weight = target.lm_head.weight
    rotary = Rotary(default_inv_freq(cfg.head_dim, cfg.rope_theta)).to(weight.device)
    return drafter.to(device=weight.device, dtype=weight.dtype), rotary


class DrafterExecutor:
    def __init__(self, drafter: DFlashDrafter, target: LlamaTarget) -> None:
        self.drafter, self.rotary = bind_to_target(drafter, target)
        cfg = self.drafter.config
        self.device, self.dtype = target.lm_head.weight.device, target.lm_head.weight.dtype
        self.target = target
        self.head = DraftHead(target.lm_head.weight, self.drafter.d2t)
        self.cache: KVCache | None = None
        self._mask_ids = torch.full((cfg.block_size,), cfg.mask_token_id, dtype=torch.int64, device=self.device)

    @property
    def tap_layer_ids(self) -> tuple[int, ...]:
        return self.drafter.config.target_layer_ids

    @property
    def num_draft_positions(self) -> int:
        """L: the block scores positions 1..L after the pending root."""
        return self.drafter.config.num_draft_positions

    @property
    def context_len(self) -> int:
        return self.cache.length if self.cache is not None else 0

    def reset(self, capacity: int) -> None:
        """Empty the feature cache; room for `capacity` context rows plus one block."""
        cfg = self.drafter.config
        rows = capacity + cfg.block_size
        if self.cache is None or self.cache.capacity < rows:
            self.cache = KVCache(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, rows, self.dtype, self.device)
        self.cache.reset()

    def _rope(self, start: int, n: int):
        return self.rotary(torch.arange(start, start + n, device=self.device), self.dtype)

    def append_context(self, taps: torch.Tensor) -> None:
        """taps: [m, F] target taps of the m newly committed positions, in order."""
        self.drafter.append_context(taps, self._rope(self.context_len, taps.shape[0]), self.cache)

    @torch.inference_mode()
    def draft(self, root_token: int) -> torch.Tensor:
        """Logits [L, V] of the marginals q_1..q_L given the context and pending root."""
        block = self._mask_ids.clone()
        block[0] = root_token
        hidden = self.drafter(self.target.embed(block), self._rope(self.context_len, block.numel()), self.cache)
        return self.head(hidden)  # [L, V]
