"""Tree-attention backend of the target forward: the plugins' op behind `AttentionBackend`.

    executor = TargetExecutor(model, attention_backend=TreeAttention())

`prepare` turns the pack's tree into the op's LSB-first ancestor bitmask (one row per
packed token, no dense n x (P+n) mask) plus the one-request offsets; a plain causal
forward (prefill, `tree is None`) gets the bitmask of a chain, which is causal.
`__call__` maps the executor's head-major cache views onto the op's token-major layout
(views, no copies) and runs `plugins.tree_attention.tree_attention`: the Triton kernel
on CUDA, the torch reference elsewhere (or the backend named at construction).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from cast_trtllm.masks import bitmask
from cast_trtllm.tree import Tree
from plugins.tree_attention import Backend, tree_attention


@dataclass(frozen=True, slots=True)
class PreparedTreeMask:
    prefix_len: int  # P
    bitmask: torch.Tensor  # [n, W] int32, LSB-first ancestor (or causal) rows
    cu_seqlens: torch.Tensor  # [2] int32: [0, n]
    cu_prefix: torch.Tensor  # [2] int32: [0, P]


def causal_chain(num_tokens: int) -> Tree:
    """The chain whose ancestor mask is causal: packed token i sees tokens 0..i."""
    nodes = num_tokens - 1
    return Tree(
        tokens=np.zeros(nodes, np.int64),
        depth=np.arange(1, nodes + 1, dtype=np.int32),
        parent=np.arange(-1, nodes - 1, dtype=np.int32),
        score=np.zeros(nodes, np.float64),
    )


class TreeAttention:
    """`AttentionBackend` over the tree-attention op (plugins/tree_attention)."""

    def __init__(self, backend: Backend = "auto") -> None:
        if backend not in ("auto", "reference", "triton"):
            raise ValueError(f"backend must be 'auto', 'reference' or 'triton', got {backend!r}")
        self.backend = backend

    def prepare(
        self, prefix_len: int, num_tokens: int, tree: Tree | None, dtype: torch.dtype, device: torch.device
    ) -> PreparedTreeMask:
        if tree is None:
            rows = bitmask(causal_chain(num_tokens))
        elif tree.num_packed != num_tokens:
            raise ValueError(f"tree packs {tree.num_packed} tokens but {num_tokens} were given")
        else:
            rows = bitmask(tree)
        offsets = lambda last: torch.tensor([0, last], dtype=torch.int32, device=device)  # noqa: E731
        return PreparedTreeMask(
            prefix_len, torch.from_numpy(rows).to(device), offsets(num_tokens), offsets(prefix_len)
        )

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prepared: PreparedTreeMask
    ) -> torch.Tensor:
        """q: [Hq, n, d]; k, v: [Hkv, P+n, d]. Returns [Hq, n, d]."""
        p = prepared.prefix_len
        if k.shape[1] != p + q.shape[1]:
            raise ValueError(f"keys hold {k.shape[1]} rows but prefix {p} + pack {q.shape[1]} were prepared")
        k_tok, v_tok = k.transpose(0, 1), v.transpose(0, 1)  # [P+n, Hkv, d]
        out = tree_attention(
            q.transpose(0, 1), k_tok[:p], v_tok[:p], k_tok[p:], v_tok[p:],  # [n, Hq, d], [P|n, Hkv, d]
            prepared.bitmask, prepared.cu_seqlens, prepared.cu_prefix, backend=self.backend,
        )  # [n, Hq, d]
        return out.transpose(0, 1)
