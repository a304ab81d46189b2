"""The target on onnxruntime (CPU, fp32): the `TargetBackend` contract over the exported
verify graph (`runtime.backends.onnx_cache`), the KV cache kept in place.

    OrtTarget(models.target, drafter.tap_layer_ids, threads=2)   # exported on first use

Cache: per request one token-major K and one V buffer [capacity, layers, Hkv, d] (numpy,
fp32), so the committed prefix x = rows [0, P) and the pending rows [P, P+n) are both
contiguous. Every pass binds (onnxruntime I/O binding, no copies):
  past_keys/past_values  <- rows [0, P) of the buffers,
  new_keys/new_values    -> rows [P, P+n) of the same buffers (the graph writes them there),
  logits, taps           -> row slices of this call's output arrays.
`commit` then gathers the kept pending rows to [P, P+m) (the same gather as
`KVCache.compact`); nothing is reallocated per round.

Prefill runs the same graph over the prompt as a chain (causal bitmask) and scores its
last row only (`logit_rows`). A ragged batch (B > 1) runs the requests' packs one after
another, each into its own rows of the shared output arrays.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from cast_trtllm.masks import bitmask, position_ids
from cast_trtllm.tree import Tree
from runtime.backends.onnx_cache import session_options, verify_graph_path
from runtime.backends.token_kv import TokenMajorKV
from runtime.model.llama import LlamaTarget
from runtime.model.tree_attention_backend import causal_chain


class OrtTarget:
    """The target's verify graph on onnxruntime's CPU execution provider, fp32.

    model: the fp32 torch target (kept: the drafter reads its embeddings and lm_head);
    tap_layer_ids: the drafter's tapped layers (they are graph outputs, so part of the export);
    threads: onnxruntime intra-op threads (default: torch's thread count);
    cache_dir: where exported graphs live (default $CAST_CACHE_DIR/onnx);
    spinning: let idle intra-op workers spin-wait for the next pass. Off by default: in the
      engine the torch drafter runs between two verify passes, and spinning workers take its
      cores (embedded target, 2 cores, CAST N = 15: draft 2.1 s vs 0.9 s, 21 vs 31 tokens/s).
    """

    name = "onnxruntime"

    def __init__(self, model: LlamaTarget, tap_layer_ids: Sequence[int] = (), threads: int | None = None,
                 cache_dir: str | Path | None = None, spinning: bool = False) -> None:
        import onnxruntime as ort

        weight = model.lm_head.weight
        if weight.dtype != torch.float32 or weight.device.type != "cpu":
            raise ValueError(f"OrtTarget runs an fp32 CPU target; this one is {weight.dtype} on {weight.device} "
                             "(load it with --dtype float32 --device cpu)")
        cfg = model.config
        bad = [i for i in tap_layer_ids if not 0 <= i < cfg.num_layers]
        if bad:
            raise ValueError(f"tap layer ids {bad} are outside the target's {cfg.num_layers} layers")
        threads = torch.get_num_threads() if threads is None else threads
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.model, self.config = model, cfg
        self.tap_layer_ids = tuple(int(i) for i in tap_layer_ids)
        self.device, self.dtype, self.threads = torch.device("cpu"), torch.float32, threads
        path = verify_graph_path(model, self.tap_layer_ids, cache_dir)
        options = session_options(threads, spinning)
        start = time.perf_counter()
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        print(f"[ort] verify graph loaded in {time.perf_counter() - start:.1f} s ({threads} thread(s))",
              file=sys.stderr, flush=True)
        self.tap_width = len(self.tap_layer_ids) * cfg.hidden_size  # F

    def new_sequence(self, capacity: int) -> TokenMajorKV:
        cfg = self.config
        return TokenMajorKV(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, capacity)

    def prefix_len(self, seq: TokenMajorKV) -> int:
        return seq.length

    def _outputs(self, rows: int, tap_rows: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Fresh output arrays (never reused: the engine may hold a round's logits)."""
        logits = np.empty((rows, self.config.vocab_size), dtype=np.float32)  # [rows, V]
        taps = np.empty((tap_rows, self.tap_width), dtype=np.float32) if self.tap_layer_ids else None  # [n, F]
        return logits, taps

    def _run(self, seq: TokenMajorKV, tokens: np.ndarray, positions: np.ndarray, words: np.ndarray,
             logit_rows: np.ndarray, logits: np.ndarray, taps: np.ndarray | None) -> None:
        """One graph pass over n tokens of `seq`; K/V land in its pending rows [P, P+n).

        tokens, positions: [n] int64; words: [n, W] int32 bitmask; logit_rows: [m] int64;
        logits: [m, V] and taps: [n, F] output views (C-contiguous) the graph writes into.
        """
        n, p = len(tokens), seq.length
        seq.check_room(n)
        binding = self.session.io_binding()
        for name, array in (("input_ids", tokens), ("position_ids", positions), ("bitmask", words),
                            ("logit_rows", logit_rows)):
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        kv = list(seq.keys.shape[1:])  # [layers, Hkv, d]
        for name, buffer in (("keys", seq.keys), ("values", seq.values)):
            binding.bind_input(f"past_{name}", "cpu", 0, np.float32, [p] + kv, buffer.ctypes.data)
            binding.bind_output(f"new_{name}", "cpu", 0, np.float32, [n] + kv, buffer[p:].ctypes.data)
        binding.bind_output("logits", "cpu", 0, np.float32, list(logits.shape), logits.ctypes.data)
        if taps is not None:
            binding.bind_output("taps", "cpu", 0, np.float32, list(taps.shape), taps.ctypes.data)
        self.session.run_with_iobinding(binding)

    def prefill(self, seq: TokenMajorKV, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the prompt [P] as a chain and commit it -> (last-row logits [1, V], taps [P, F])."""
        if token_ids.dim() != 1 or token_ids.numel() == 0:
            raise ValueError("prefill needs a non-empty 1-D tensor of token ids")
        tokens = token_ids.cpu().numpy().astype(np.int64)
        n = len(tokens)
        logits, taps = self._outputs(1, n)
        positions = np.arange(seq.length, seq.length + n, dtype=np.int64)
        self._run(seq, tokens, positions, bitmask(causal_chain(n)), np.array([n - 1]), logits, taps)
        seq.length += n
        return torch.from_numpy(logits), None if taps is None else torch.from_numpy(taps)

    def verify(self, seqs: Sequence[TokenMajorKV], packs: Sequence[np.ndarray], trees: Sequence[Tree]
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ONE verify step over every pack (one graph pass per request, in order).

        packs: B × [n_b] int64 [b, z_1..z_N]. Returns logits [Σn, V], taps [Σn, F] | None;
        leaves n_b pending rows in each sequence until `commit`.
        """
        sizes = [t.num_packed for t in trees]
        if [len(p) for p in packs] != sizes or len(seqs) != len(sizes):
            raise ValueError(f"{len(seqs)} sequences, pack lengths {[len(p) for p in packs]}, tree sizes {sizes}")
        total = sum(sizes)
        logits, taps = self._outputs(total, total)
        row = 0
        for seq, pack, tree, n in zip(seqs, packs, trees, sizes):
            rows = slice(row, row + n)
            self._run(seq, np.asarray(pack, dtype=np.int64), position_ids(tree, seq.length), bitmask(tree),
                      np.arange(n, dtype=np.int64), logits[rows], None if taps is None else taps[rows])
            row += n
        return torch.from_numpy(logits), None if taps is None else torch.from_numpy(taps)

    def commit(self, seq: TokenMajorKV, kept_rows: np.ndarray) -> None:
        """Keep pack rows [0] + accepted path: K/V -> x∘b∘y_1:A."""
        seq.compact(kept_rows)
