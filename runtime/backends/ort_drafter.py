"""The DFlash drafter on onnxruntime (CPU, fp32): `DrafterExecutor`'s interface and math
over the exported draft and context graphs (`runtime.model.draft_graphs`), the feature
cache kept in place.

    OrtDrafter(models.drafter, models.target, threads=2)   # exported on first use

Feature cache: per request one token-major K and one V buffer [capacity, drafter layers,
Hkv, d] (numpy, fp32), so the committed context x = rows [0, P) is a contiguous view.
`append_context` runs the context graph with its outputs bound to rows [P, P+m) (written
in place); `draft` runs the draft graph with rows [0, P) bound as its context (the block's
own K/V never leave the graph, so no scratch rows). B > 1 runs the requests one after
another, each into its own rows of the shared output array.

With a reduced draft vocabulary the graph scores only its Vd rows of the lm_head and the
engine takes each position's top K over those Vd columns (`DraftScores`); `draft` spreads
them to [B, L, V], -inf elsewhere (`runtime.drafter.vocab.DraftHead`'s contract).
Graphs land in $CAST_CACHE_DIR/onnx/<identity>/{draft,context}.onnx, the identity hashing
the target (`onnx_cache.model_identity`), the drafter's config, a strided sample of its
weights and the graph code.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from runtime.backends.onnx_cache import export_once, hash_weights, model_identity, onnx_root, session_options
from runtime.backends.token_kv import TokenMajorKV
from runtime.drafter.executor import bind_to_target
from runtime.drafter.model import DFlashDrafter
from runtime.drafter.vocab import DraftHead, DraftScores
from runtime.kv_cache import CacheFullError
from runtime.model import draft_graphs
from runtime.model.llama import LlamaTarget

DRAFT_FILE, CONTEXT_FILE = "draft.onnx", "context.onnx"


def drafter_identity(drafter: DFlashDrafter, target: LlamaTarget) -> str:
    """16 hex digits naming (target, drafter config, drafter weights, graph code)."""
    digest = hashlib.sha256(model_identity(target, ()).encode())
    digest.update(repr(drafter.config).encode() + inspect.getsource(draft_graphs).encode())
    hash_weights(digest, drafter)
    return digest.hexdigest()[:16]


def drafter_graph_paths(drafter: DFlashDrafter, target: LlamaTarget, cache_dir: str | Path | None = None
                        ) -> tuple[Path, Path]:
    """(draft, context) graphs of this drafter over `target`, exporting them on first use."""
    folder = onnx_root(cache_dir) / f"drafter-{drafter_identity(drafter, target)}"

    def write(scratch: Path) -> None:
        draft_graphs.export_draft_graph(draft_graphs.DraftGraph(
            drafter, target, kv_layout="token", draft_vocab_logits=True, shared_head=False), scratch / DRAFT_FILE)
        draft_graphs.export_context_graph(draft_graphs.ContextGraph(drafter, kv_layout="token"), scratch / CONTEXT_FILE)

    return export_once(folder, (DRAFT_FILE, CONTEXT_FILE), "the drafter's graphs", write)


class OrtDrafter:
    """`DrafterExecutor` on onnxruntime's CPU execution provider, fp32.

    drafter, target: the torch modules (the target fp32 on CPU; its embeddings and lm_head
      are the drafter's); threads: onnxruntime intra-op threads (default: torch's);
    cache_dir: where exported graphs live (default $CAST_CACHE_DIR/onnx);
    spinning: let idle intra-op workers spin-wait (off: the target runs between passes).
    """

    name = "onnxruntime"

    def __init__(self, drafter: DFlashDrafter, target: LlamaTarget, threads: int | None = None,
                 cache_dir: str | Path | None = None, spinning: bool = False) -> None:
        import onnxruntime as ort

        weight = target.lm_head.weight
        if weight.dtype != torch.float32 or weight.device.type != "cpu":
            raise ValueError(f"OrtDrafter runs with an fp32 CPU target; this one is {weight.dtype} on "
                             f"{weight.device} (load it with --dtype float32 --device cpu)")
        threads = torch.get_num_threads() if threads is None else threads
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        drafter, _ = bind_to_target(drafter, target)
        cfg = drafter.config
        self.config, self.threads = cfg, threads
        self.device, self.dtype = torch.device("cpu"), torch.float32
        self.tap_layer_ids = tuple(cfg.target_layer_ids)
        self.num_draft_positions = cfg.num_draft_positions  # L
        self.vocab_size = target.config.vocab_size  # V
        head = DraftHead(weight, drafter.d2t)
        self.draft_ids = head.target_ids  # [Vd] target ids (None: the full vocabulary)
        self.draft_vocab = self.vocab_size if self.draft_ids is None else len(self.draft_ids)  # Vd
        options = session_options(threads, spinning)
        start = time.perf_counter()
        draft_path, context_path = drafter_graph_paths(drafter, target, cache_dir)
        providers = ["CPUExecutionProvider"]
        self.draft_session = ort.InferenceSession(str(draft_path), options, providers=providers)
        self.context_session = ort.InferenceSession(str(context_path), options, providers=providers)
        print(f"[ort] drafter graphs loaded in {time.perf_counter() - start:.1f} s ({threads} thread(s))",
              file=sys.stderr, flush=True)

    @property
    def mass_exponent(self) -> float:
        return self.config.mass_exponent

    def new_state(self, capacity: int) -> TokenMajorKV:
        """An empty feature cache of `capacity` context rows."""
        cfg = self.config
        return TokenMajorKV(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, capacity)

    def append_context(self, state: TokenMajorKV, taps: torch.Tensor) -> None:
        """taps: [m, F] target taps of the m newly committed positions, in order."""
        if taps.dim() != 2:
            raise ValueError(f"taps must be [m, F], got shape {tuple(taps.shape)}")
        m, p = taps.shape[0], state.length
        if p + m > state.capacity:
            raise CacheFullError(f"feature cache of {state.capacity} rows cannot take {m} more after {p}")
        if m == 0:
            return
        binding = self.context_session.io_binding()
        binding.bind_cpu_input("taps", np.ascontiguousarray(taps.detach().cpu().numpy(), dtype=np.float32))
        binding.bind_cpu_input("position_ids", np.arange(p, p + m, dtype=np.int64))
        kv = list(state.keys.shape[1:])  # [layers, Hkv, d]
        for name, buffer in (("context_keys", state.keys), ("context_values", state.values)):
            binding.bind_output(name, "cpu", 0, np.float32, [m] + kv, buffer[p:].ctypes.data)
        self.context_session.run_with_iobinding(binding)
        state.length += m

    def draft(self, states: Sequence[TokenMajorKV], roots: Sequence[int]) -> torch.Tensor:
        """Logits [B, L, V] of the marginals q_1..q_L of every request's block."""
        return self.draft_scores(states, roots).full()

    def draft_scores(self, states: Sequence[TokenMajorKV], roots: Sequence[int]) -> DraftScores:
        """The marginals q_1..q_L of every request's block, over the draft vocabulary [B, L, Vd]."""
        if len(states) != len(roots):
            raise ValueError(f"{len(states)} feature caches but {len(roots)} roots")
        cfg, S, L = self.config, self.config.block_size, self.num_draft_positions
        sub = np.empty((len(roots), L, self.draft_vocab), dtype=np.float32)  # [B, L, Vd]
        for b, (state, root) in enumerate(zip(states, roots)):
            block = np.full(S, cfg.mask_token_id, dtype=np.int64)  # [b, mask, ...]
            block[0] = root
            binding = self.draft_session.io_binding()
            binding.bind_cpu_input("block_ids", block)
            binding.bind_cpu_input("position_ids", np.arange(state.length, state.length + S, dtype=np.int64))
            context = [state.length] + list(state.keys.shape[1:])  # [P, layers, Hkv, d]
            for name, buffer in (("context_keys", state.keys), ("context_values", state.values)):
                binding.bind_input(name, "cpu", 0, np.float32, context, buffer.ctypes.data)
            binding.bind_output("logits", "cpu", 0, np.float32, [L, self.draft_vocab], sub[b].ctypes.data)
            self.draft_session.run_with_iobinding(binding)
        return DraftScores(torch.from_numpy(sub), self.draft_ids, self.vocab_size)
