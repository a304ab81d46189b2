"""A round's walks after its one verify pass (paper §2, App. C; Theorem 3).

Greedy requests with nothing to apply to their rows (no min_tokens / bad_words, no
logprobs) walk on the engine's device, all at once (`runtime.device_trees.greedy_accept`),
and the round reads back ONE small int64 tensor: every such request's accepted count,
committed pack rows and committed tokens. That is the round's only device -> host
transfer for them (`HostReads` counts it). The others walk on the host from their
processed rows: sampled requests by recursive rejection sampling, greedy ones with
processing by `greedy_walk` on the processed argmax.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from cast_trtllm.tree import Tree
from cast_trtllm.sampling import sample_tokens
from cast_trtllm.verify import Acceptance, greedy_walk, stochastic_walk
from runtime.backends.slot_pool import flat_rows
from runtime.device_trees import TreeBatch, greedy_accept


class HostReads:
    """Counts the round's device -> host reads that go through it (tests assert one per round)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, tensor: torch.Tensor) -> np.ndarray:
        self.count += 1
        return tensor.cpu().numpy()


def host_walk(seq, tree: Tree, logits: torch.Tensor) -> Acceptance:
    """Accept a path of one verified tree on the host. logits: [n, V] processed."""
    params = seq.request.sampling
    if params.greedy:
        return greedy_walk(tree, logits.argmax(dim=-1))
    if tree.size == 0:  # AR step: the same law and generator use as plain sampling
        token = int(sample_tokens(logits[-1:].cpu(), params, seq.generator)[0])
        return Acceptance(np.zeros(0, np.int64), np.zeros(0, np.int64), token)
    return stochastic_walk(tree, logits, params, seq.generator)


def on_device(seq) -> bool:
    """Whether a request's walk runs on the device: greedy, with its rows used as they come."""
    return seq.request.sampling.greedy and seq.processor is None and seq.request.logprobs is None


def walk_round(batch: Sequence, trees: list[Tree] | None, tree_batch: TreeBatch, sizes: Sequence[int],
               roots: torch.Tensor, logits: torch.Tensor, read: HostReads, walk: Callable
               ) -> tuple[list[Acceptance], list[Tree], dict[int, torch.Tensor]]:
    """Each request's Acceptance, the round's host trees (`trees`, or, when the trees were
    built on the device (None), read back in the same transfer) and the processed rows
    [n_b, V] of the requests walked on the host (by batch index). sizes: nodes packed per
    request; logits: [Σn, V] the pass's rows in `flat_rows` order; walk(b, tree, processed rows)
    walks request b on the host (the engine's `_walk`: `host_walk`, or a relaxed rule's)."""
    packed = [1 + s for s in sizes]
    offsets = np.cumsum([0] + packed)
    accs: list[Acceptance | None] = [None] * len(batch)
    device = [b for b, seq in enumerate(batch) if on_device(seq)]
    parts, shapes = [], []  # what the one read carries, flattened int64
    if device:
        request, row = (torch.from_numpy(a).to(logits.device) for a in flat_rows(packed))
        argmax = torch.zeros((len(batch), 1 + tree_batch.width), dtype=torch.int64, device=logits.device)
        argmax[request, row] = logits.argmax(dim=-1)
        pick = torch.as_tensor(device, device=logits.device)
        rows, accepted, committed = greedy_accept(tree_batch.select(pick), roots[pick], argmax[pick])
        parts.append(torch.cat([accepted[:, None], rows, committed], 1))
    if trees is None:
        parts += [tree_batch.tokens, tree_batch.parent, tree_batch.depth, tree_batch.score.view(torch.int64)]
    if parts:
        shapes = [p.shape for p in parts]
        host = np.split(read(torch.cat([p.reshape(-1) for p in parts])), np.cumsum([p.numel() for p in parts])[:-1])
        host = [h.reshape(s) for h, s in zip(host, shapes)]
    if trees is None:
        tokens, parent, depth, score = host[-4:]
        trees = tree_batch.to_host({"tokens": tokens, "parent": parent, "depth": depth, "score": score.view(np.float64)})
        trees = [t.head(min(t.size, n)) for t, n in zip(trees, sizes)]
    if device:
        won, depth = host[0], rows.shape[1]
        for j, b in enumerate(device):
            a = int(won[j, 0])
            accs[b] = Acceptance(path=won[j, 2: 2 + a].copy(), tokens=won[j, 1 + depth: 1 + depth + a].copy(),
                                 next_root=int(won[j, 1 + depth + a]))
    processed = {}
    for b, seq in enumerate(batch):
        if accs[b] is None:  # the walk and logprobs see the law after min_tokens / bad_words
            processed[b] = seq.processed(trees[b], logits[offsets[b]: offsets[b] + trees[b].num_packed])
            accs[b] = walk(b, trees[b], processed[b])
    return accs, trees, processed  # type: ignore[return-value]


def queue_taps(batch: Sequence, sizes: Sequence[int], kept: Sequence[np.ndarray], taps: torch.Tensor | None) -> None:
    """Queue, for the drafter, the taps of the pack rows each drafting request kept (one gather)."""
    want = [b for b, s in enumerate(batch) if not s.done and s.method != "ar"]
    if taps is None or not want:
        return
    offsets = np.cumsum([0] + [1 + n for n in sizes])
    rows = np.concatenate([offsets[b] + kept[b] for b in want])
    parts = taps[torch.from_numpy(rows).to(taps.device)].split([len(kept[b]) for b in want])
    for b, part in zip(want, parts):
        batch[b].pending_taps.append(part)
