"""The causal chain as a tree: a prefill is a pack whose ancestor mask is causal."""

from __future__ import annotations

import numpy as np

from cast_trtllm.tree import Tree


def causal_chain(num_tokens: int) -> Tree:
    """The chain whose ancestor mask is causal: packed token i sees tokens 0..i."""
    nodes = num_tokens - 1
    return Tree(
        tokens=np.zeros(nodes, np.int64),
        depth=np.arange(1, nodes + 1, dtype=np.int32),
        parent=np.arange(-1, nodes - 1, dtype=np.int32),
        score=np.zeros(nodes, np.float64),
    )
