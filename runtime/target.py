"""Target executor: prefill, packed tree verify, and the KV commit of a round.

Round contract (ARCHITECTURE.md, paper App. C): on entry the KV cache covers the
cache-backed prefix x (P = |x| rows). `verify` runs the pack [b, z_1..z_N] at position
ids P + depth under the ancestor mask, writing N+1 pending rows; `commit(path)` keeps
rows [0] + path, so the cache covers x∘b∘y_1:A, and returns the drafter taps of exactly
those committed positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from cast_trtllm.masks import position_ids
from cast_trtllm.tree import Tree
from runtime.kv_cache import KVCache
from runtime.model.attention import AttentionBackend, SdpaAttention
from runtime.model.llama import LlamaTarget


@dataclass(frozen=True, slots=True)
class VerifyOutput:
    logits: torch.Tensor  # [n, V] target logits at each packed row
    taps: torch.Tensor | None  # [n, F] drafter taps at each packed row (None: no taps)


class TargetExecutor:
    """Owns the target's KV cache; one sequence at a time."""

    def __init__(
        self,
        model: LlamaTarget,
        tap_layer_ids: Sequence[int] = (),
        attention_backend: AttentionBackend | None = None,
    ) -> None:
        cfg = model.config
        bad = [i for i in tap_layer_ids if not 0 <= i < cfg.num_layers]
        if bad:
            raise ValueError(f"tap layer ids {bad} are outside the target's {cfg.num_layers} layers")
        self.model = model
        self.tap_layer_ids = tuple(int(i) for i in tap_layer_ids)
        self.backend = attention_backend or SdpaAttention()
        self.cache: KVCache | None = None
        self._pending_taps: torch.Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.lm_head.weight.dtype

    @property
    def prefix_len(self) -> int:
        """P = |x|: committed rows of the KV cache."""
        return self.cache.length if self.cache is not None else 0

    def reset(self, capacity: int) -> None:
        """Empty the cache, reallocating only when `capacity` rows do not fit."""
        cfg = self.model.config
        if self.cache is None or self.cache.capacity < capacity:
            self.cache = KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, capacity, self.dtype, self.device)
        self.cache.reset()
        self._pending_taps = None

    def _forward(self, tokens: torch.Tensor, positions: np.ndarray, tree: Tree | None, logits_rows: slice | None):
        if self.cache is None:
            raise RuntimeError("call reset(capacity) before the first forward")
        n = tokens.shape[0]
        self.cache.check_room(n)
        prepared = self.backend.prepare(self.cache.length, n, tree, self.dtype, self.device)
        pos = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64)).to(self.device)
        return self.model(
            tokens.to(self.device), pos, self.cache, self.backend, prepared, self.tap_layer_ids, logits_rows
        )

    def prefill(self, token_ids: torch.Tensor) -> VerifyOutput:
        """Run the prompt and commit it. token_ids: [P] int64.

        Returns logits of the LAST row only [1, V] and taps of every row [P, F].
        """
        if token_ids.dim() != 1 or token_ids.numel() == 0:
            raise ValueError("prefill needs a non-empty 1-D tensor of token ids")
        start = self.prefix_len
        positions = np.arange(start, start + token_ids.numel())
        logits, taps = self._forward(token_ids, positions, None, slice(-1, None))
        self.cache.advance(token_ids.numel())
        return VerifyOutput(logits, taps)

    def verify(self, pack_tokens: torch.Tensor, tree: Tree) -> VerifyOutput:
        """One ancestor-masked pass over the pack [b, z_1..z_N]. pack_tokens: [N+1] int64.

        Leaves N+1 pending cache rows until `commit`.
        """
        if pack_tokens.shape != (tree.num_packed,):
            raise ValueError(f"pack_tokens must be [{tree.num_packed}], got {tuple(pack_tokens.shape)}")
        logits, taps = self._forward(pack_tokens, position_ids(tree, self.prefix_len), tree, None)
        self._pending_taps = taps
        return VerifyOutput(logits, taps)

    def commit(self, accepted_path: np.ndarray) -> torch.Tensor | None:
        """Keep the root and the accepted path: KV cache -> x∘b∘y_1:A.

        accepted_path: [A] pack indices (root excluded, increasing).
        Returns the taps of the committed rows [1+A, F] (None without taps).
        """
        keep = np.concatenate([[0], np.asarray(accepted_path, dtype=np.int64)])
        self.cache.compact(keep)
        taps, self._pending_taps = self._pending_taps, None
        if taps is None:
            return None
        return taps[torch.from_numpy(keep).to(taps.device)]
