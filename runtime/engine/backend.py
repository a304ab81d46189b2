"""Target executor backends: what the engine calls to run the target.

A backend owns how a forward runs (framework, dtype, graphs); the engine owns the round.
Contract (the round contract of ARCHITECTURE.md, per request `seq`):
  new_sequence(capacity) -> seq   a request's target state (KV cache of `capacity` rows)
  prefill(seq, ids [P])           runs the prompt, commits it; -> (last-row logits [1, V], taps [P, F])
  verify(seqs, packs, trees)      ONE pass over every pack; leaves n_b pending rows per seq;
                                  -> (logits [Σn, V], taps [Σn, F] | None), rows in pack order
  commit(seq, kept_rows)          keeps pack rows [0] + accepted path: KV -> x∘b∘y_1:A
  prefix_len(seq)                 P = committed rows
  release(seq)                    the request is done: its cache rows may be reused
`TorchTarget` is the reference (torch eager, fp32 or bf16, CPU or CUDA).
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np
import torch

from cast_trtllm.tree import Tree
from runtime.batch_forward import ragged_verify
from runtime.model.llama import LlamaTarget, TargetConfig
from runtime.target import TargetExecutor


class TargetBackend(Protocol):
    name: str
    config: TargetConfig
    device: torch.device
    dtype: torch.dtype

    def new_sequence(self, capacity: int) -> Any: ...
    def prefill(self, seq: Any, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]: ...
    def verify(self, seqs: Sequence[Any], packs: Sequence[np.ndarray], trees: Sequence[Tree]
               ) -> tuple[torch.Tensor, torch.Tensor | None]: ...
    def commit(self, seq: Any, kept_rows: np.ndarray) -> None: ...
    def prefix_len(self, seq: Any) -> int: ...
    def release(self, seq: Any) -> None: ...


class TorchTarget:
    """The target's own torch forward (`runtime.model.llama.LlamaTarget`)."""

    name = "torch"

    def __init__(self, model: LlamaTarget, tap_layer_ids: Sequence[int] = ()) -> None:
        self.model = model
        self.tap_layer_ids = tuple(tap_layer_ids)
        self.config = model.config
        self.device, self.dtype = model.lm_head.weight.device, model.lm_head.weight.dtype

    def new_sequence(self, capacity: int) -> TargetExecutor:
        seq = TargetExecutor(self.model, self.tap_layer_ids)
        seq.reset(capacity)
        return seq

    def prefill(self, seq: TargetExecutor, token_ids: torch.Tensor):
        out = seq.prefill(token_ids)
        return out.logits, out.taps

    def verify(self, seqs: Sequence[TargetExecutor], packs: Sequence[np.ndarray], trees: Sequence[Tree]):
        return ragged_verify(self.model, [s.cache for s in seqs], packs, trees, self.tap_layer_ids)

    def commit(self, seq: TargetExecutor, kept_rows: np.ndarray) -> None:
        seq.cache.compact(kept_rows)

    def prefix_len(self, seq: TargetExecutor) -> int:
        return seq.prefix_len

    def release(self, seq: TargetExecutor) -> None:
        """Nothing to do: a request's cache is its own and is freed with it."""
