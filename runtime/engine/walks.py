"""A round's walks after its one verify pass (paper §2, App. C; Theorem 3).

Requests with nothing to apply to their rows (no min_tokens / bad_words, no logprobs)
walk on the engine's device, all at once: greedy ones by `device_trees.greedy_accept`,
sampled ones by Theorem 3's lossless walk (`device_sampling.sampled_accept`, with
uniforms drawn from each request's seeded generator). The round then reads back ONE
small int64 tensor: every such request's accepted count, committed pack rows and
committed tokens. That is the round's only device -> host transfer for them
(`HostReads` counts it). The others walk on the host from their processed rows:
sampled requests by recursive rejection sampling, greedy ones by `greedy_walk` on the
processed argmax, and every request of an engine with another walk (a relaxed rule).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from cast_trtllm.tree import Tree
from cast_trtllm.sampling import sample_tokens
from cast_trtllm.verify import Acceptance, greedy_walk, stochastic_walk
from runtime.backends.slot_pool import flat_rows
from runtime.device_sampling import sampled_accept
from runtime.device_trees import TreeBatch, greedy_accept


class HostReads:
    """Counts the round's device -> host reads that go through it (tests assert one per round).
    A tensor the host needs only after the round (auto's candidate scores, for its gates) rides the
    round's one read (`ride`): once it lands, `then` gets it as a host array."""

    def __init__(self) -> None:
        self.count = 0
        self.riders: list[tuple[torch.Tensor, Callable[[np.ndarray], None]]] = []  # (8-byte tensor, then)

    def ride(self, tensor: torch.Tensor, then: Callable[[np.ndarray], None]) -> None:
        """Read `tensor` with the round's read; then(its host array)."""
        if tensor.dtype not in NUMPY_8:
            raise ValueError(f"a rider packs into an int64 read: need int64 or float64, got {tensor.dtype}")
        self.riders.append((tensor, then))

    def take(self) -> list[torch.Tensor]:
        """The riders as int64 views for a read that packs them after its own data (then `land`)."""
        return [t.contiguous().view(torch.int64) for t, _ in self.riders]

    def land(self, arrays: list[np.ndarray]) -> None:
        """The riders' int64 arrays as read: each to its `then`, in its own dtype and shape."""
        riders, self.riders = self.riders, []
        for (tensor, then), array in zip(riders, arrays):
            then(np.asarray(array).view(NUMPY_8[tensor.dtype]).reshape(tuple(tensor.shape)))

    def __call__(self, tensor: torch.Tensor) -> np.ndarray:
        self.count += 1
        if not self.riders:
            return tensor.cpu().numpy()
        if tensor.dtype not in NUMPY_8:
            raise ValueError(f"riders pack as int64 after the read: need an 8-byte dtype, got {tensor.dtype}")
        riders, own = self.take(), tensor.contiguous().view(torch.int64)
        flat = torch.cat([own.reshape(-1)] + [r.reshape(-1) for r in riders]).cpu().numpy()
        parts = np.split(flat, np.cumsum([own.numel()] + [r.numel() for r in riders])[:-1])
        self.land(parts[1:])
        return parts[0].view(NUMPY_8[tensor.dtype]).reshape(tuple(tensor.shape))


NUMPY_8 = {torch.int64: np.int64, torch.float64: np.float64}  # what packs into an int64 read


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
    """Whether a request's walk can run on the device: its rows are used as they come."""
    return seq.processor is None and seq.request.logprobs is None


def walk_round(batch: Sequence, trees: list[Tree] | None, tree_batch: TreeBatch, sizes: Sequence[int],
               roots: torch.Tensor, logits: torch.Tensor, read: HostReads, walk: Callable | None,
               uniforms: tuple[int, int]) -> tuple[list[Acceptance], list[Tree], dict[int, torch.Tensor]]:
    """Each request's Acceptance, the round's host trees (`trees`, or, when the trees were
    built on the device (None), read back in the same transfer) and the processed rows
    [n_b, V] of the requests walked on the host (by batch index). sizes: nodes packed per
    request; logits: [Σn, V] the pass's rows in `flat_rows` order; walk(b, tree, processed rows)
    walks request b on the host (None: `host_walk`, and the lossless walks may run on the
    device; a relaxed rule's walk runs every sampled request on the host); uniforms: (levels,
    K) a device-sampled request draws [levels, 2K + 1] per round: 1 + the deepest tree any
    request of the engine can have, and its rank cap K (the most children of a node)."""
    packed = [1 + s for s in sizes]
    offsets = np.cumsum([0] + packed)
    accs: list[Acceptance | None] = [None] * len(batch)
    greedy = [b for b, seq in enumerate(batch) if on_device(seq) and seq.request.sampling.greedy]
    sampled = [b for b, seq in enumerate(batch) if on_device(seq) and walk is None and b not in greedy]
    parts = []  # what the one read carries, flattened int64: per group [accepted, rows, committed]
    if greedy:
        request, row = (torch.from_numpy(a).to(logits.device) for a in flat_rows(packed))
        argmax = torch.zeros((len(batch), 1 + tree_batch.width), dtype=torch.int64, device=logits.device)
        argmax[request, row] = logits.argmax(dim=-1)
        pick = torch.as_tensor(greedy, device=logits.device)
        rows, accepted, committed = greedy_accept(tree_batch.select(pick), roots[pick], argmax[pick])
        parts.append(torch.cat([accepted[:, None], rows, committed], 1))
    if sampled:  # each draws the same count every round (a seed's stream must not depend on the batch)
        levels, K = uniforms
        u = torch.stack([torch.rand(levels, 2 * K + 1, generator=batch[b].generator, dtype=torch.float64)
                         for b in sampled])[:, :1 + min(tree_batch.max_depth, tree_batch.width)]
        u = u.to(logits.device, non_blocking=True)
        start = torch.as_tensor(offsets[sampled], device=logits.device)
        pick = torch.as_tensor(sampled, device=logits.device)
        kids = max(min(K, 1 if batch[b].method == "chain" else max(1, sizes[b])) for b in sampled)  # slots to try
        rows, accepted, committed = sampled_accept(tree_batch.select(pick), logits, start,
                                                   [batch[b].request.sampling for b in sampled], u, kids)
        parts.append(torch.cat([accepted[:, None], rows, committed], 1))
    if trees is None:
        parts += [tree_batch.tokens, tree_batch.parent, tree_batch.depth, tree_batch.score.view(torch.int64)]
    host = []
    if parts:
        flat = read(torch.cat([p.reshape(-1) for p in parts]))
        host = [h.reshape(p.shape) for h, p in zip(np.split(flat, np.cumsum([p.numel() for p in parts])[:-1]), parts)]
    if trees is None:
        tokens, parent, depth, score = host[-4:]
        host_trees = {"tokens": tokens, "parent": parent, "depth": depth, "score": score.view(np.float64)}
        trees = tree_batch.to_host(host_trees)
        trees = [t.head(min(t.size, n)) for t, n in zip(trees, sizes)]
    for group, won in zip([g for g in (greedy, sampled) if g], host):
        steps = (won.shape[1] - 1) // 2  # [accepted, rows (steps), committed (steps)]
        for j, b in enumerate(group):
            a = int(won[j, 0])
            accs[b] = Acceptance(path=won[j, 2: 2 + a].copy(), tokens=won[j, 1 + steps: 1 + steps + a].copy(),
                                 next_root=int(won[j, 1 + steps + a]))
    processed = {}
    for b, seq in enumerate(batch):
        if accs[b] is None:  # the walk and logprobs see the law after min_tokens / bad_words
            processed[b] = seq.processed(trees[b], logits[offsets[b]: offsets[b] + trees[b].num_packed])
            accs[b] = walk(b, trees[b], processed[b]) if walk else host_walk(seq, trees[b], processed[b])
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
