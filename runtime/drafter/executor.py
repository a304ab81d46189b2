"""Drafter executor (torch): every request's feature cache in one slot pool, ONE context
pass and ONE block pass per round (`runtime.backends.pooled_drafter`, shared with the
onnxruntime drafter). `append_context(s)` adds the taps of newly committed positions
x∘b∘y_1:A; `draft` scores the blocks [b_r, mask, …, mask] of all B requests at positions
P_r..P_r+L in one batched forward. A single request is B = 1.
"""

from __future__ import annotations

import numpy as np
import torch

from runtime.backends.pooled_drafter import PooledDrafter
from runtime.drafter.model import DFlashDrafter
from runtime.model.batch_draft_graph import BatchDraftGraph
from runtime.model.draft_graphs import ContextGraph
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


class DrafterExecutor(PooledDrafter):
    """The drafter's batched forwards in torch eager, on the target's device and dtype:
    the same code onnxruntime runs exported (`runtime.backends.pooled_drafter`)."""

    name = "torch"

    def __init__(self, drafter: DFlashDrafter, target: LlamaTarget) -> None:
        self.drafter, _ = bind_to_target(drafter, target)
        self.target = target
        self._init_pool(self.drafter, target)
        self.block = BatchDraftGraph(self.drafter, target)
        self.context = ContextGraph(self.drafter, kv_layout="token")

    @torch.inference_mode()
    def _context(self, taps: torch.Tensor, positions: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return self.context(taps.to(self.device, self.dtype), torch.from_numpy(positions).to(self.device))

    @torch.inference_mode()
    def _draft(self, inputs: dict[str, np.ndarray], lo: int, hi: int) -> torch.Tensor:
        return self.block(*self.pool.torch_inputs(inputs, self.block.input_names[:4]), *self.pool.layer_views(lo, hi))
