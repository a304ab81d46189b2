"""Target executor backends: what the engine calls to run the target.

A backend owns how a forward runs (framework, dtype, graphs); the engine owns the round.
`TargetBackend` is the round contract of ARCHITECTURE.md, per request `seq`. Every backend
runs ONE forward over every request per round (`runtime.backends.pooled_target`):
`TorchTarget` in torch eager (fp32 or bf16, CPU or CUDA), `OrtTarget` as the exported graph.
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np
import torch

from cast_trtllm.tree import Tree
from runtime.backends.pooled_target import PooledTarget
from runtime.model.batch_graph import BatchVerifyGraph
from runtime.model.llama import LlamaTarget, TargetConfig


class TargetBackend(Protocol):
    name: str
    config: TargetConfig
    device: torch.device
    dtype: torch.dtype

    def new_sequence(self, capacity: int) -> Any: ...  # a request's target state (KV cache of `capacity` rows)
    # runs the prompt ids [P] and commits it -> (last-row logits [1, V], taps [P, F])
    def prefill(self, seq: Any, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]: ...
    # ONE pass over every pack; leaves n_b pending rows per seq -> (logits [Σn, V], taps [Σn, F] | None)
    def verify(self, seqs: Sequence[Any], packs: Sequence[np.ndarray], trees: Sequence[Tree]
               ) -> tuple[torch.Tensor, torch.Tensor | None]: ...
    # the same pass from a device TreeBatch (no host read)
    def verify_trees(self, seqs: Sequence[Any], roots: torch.Tensor, trees: Any, sizes: Sequence[int]
                     ) -> tuple[torch.Tensor, torch.Tensor | None]: ...
    def commit(self, seq: Any, kept_rows: np.ndarray) -> None: ...  # keep rows [0] + accepted path: x∘b∘y_1:A
    def commit_many(self, seqs: Sequence[Any], kept_rows: Sequence[np.ndarray]) -> None: ...  # one device gather
    def prefix_len(self, seq: Any) -> int: ...  # P = committed rows
    def release(self, seq: Any) -> None: ...  # the request is done: its cache rows may be reused


class TorchTarget(PooledTarget):
    """The target's batched forward (`runtime.model.batch_graph.BatchVerifyGraph`) in torch
    eager, on the model's own device and dtype: the same code onnxruntime runs exported."""

    name = "torch"

    def __init__(self, model: LlamaTarget, tap_layer_ids: Sequence[int] = ()) -> None:
        self.model, self.config = model, model.config
        self.tap_layer_ids = model.config.tap_layers(tap_layer_ids)
        self.device, self.dtype = model.lm_head.weight.device, model.lm_head.weight.dtype
        self.graph = BatchVerifyGraph(model, self.tap_layer_ids)
        self._init_pool()

    @torch.inference_mode()
    def _forward(self, inputs: dict[str, np.ndarray], lo: int, hi: int):
        args = self.pool.torch_inputs(inputs, self.graph.input_names[:7])
        logits, keys, values, *taps = self.graph(*args, *self.pool.layer_views(lo, hi))
        return logits, keys, values, taps[0] if taps else None
