"""A round's verify, walk and commit through the model runner (`RunnerTarget`, the GPU backend).

Every request's pack is written into its bucket's pinned metadata (host trees) or copied in
on the device after the upload (trees built on the device); ONE upload; the device part
runs (a CUDA graph replay per bucket on a GPU): the verify pass, the greedy walk of every
pack, and the in-place KV commit of every greedy request that walks on the device; ONE
read brings back their accepted counts, committed rows and tokens (and the trees, when
they were built on the device). Requests with something to apply to their rows
(sampled, logprobs, min_tokens / bad_words) ride the same pass and walk after it from
their rows as on every backend (`runtime.engine.walks.walk_round`; sampled ones add that
walk's own read), and their kept rows are scattered at commit.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

from cast_trtllm.tree import Tree
from cast_trtllm.verify import Acceptance
from runtime.device import upload
from runtime.device_trees import TreeBatch
from runtime.engine.walks import on_device, walk_round


def runner_round(engine, batch: Sequence, trees: list[Tree] | None, tree_batch: TreeBatch, sizes: Sequence[int],
                 uniforms: tuple[int, int]) -> tuple[list[Acceptance], list[Tree], dict, Callable, float]:
    """-> (accs, host trees, processed rows of host-walked requests, queue(kept) for the drafter's
    taps, the clock mark after the pass was issued)."""
    target, clock = engine.target, engine.clock
    greedy = [on_device(s) and s.request.sampling.greedy for s in batch]
    seqs = [s.target for s in batch]
    bucket, patch = target.fill(seqs, trees, greedy, sizes, roots=[s.root for s in batch],
                                device_trees=tree_batch if trees is None else None)
    logits, keys, values, taps, kept_taps, _ = target.runner.run(bucket, patch)
    t3 = clock.now()
    extra = [] if trees is not None else [tree_batch.tokens, tree_batch.parent, tree_batch.depth,
                                          tree_batch.score.view(torch.int64)]
    engine.host_reads.count += 1
    riders = engine.host_reads.take()  # auto's candidate scores (`device_trees`), in the same copy
    read, tree_arrays = target.runner.read(bucket, len(batch), extra + riders)
    engine.host_reads.land(tree_arrays[len(extra):])
    tree_arrays = tree_arrays[:len(extra)]
    if trees is None:
        tokens, parent, depth, score = tree_arrays
        trees = tree_batch.to_host({"tokens": tokens, "parent": parent, "depth": depth,
                                    "score": score.view(np.float64)})
        trees = [t.head(min(t.size, n)) for t, n in zip(trees, sizes)]
    accs: list[Acceptance | None] = [None] * len(batch)
    steps = (read.shape[1] - 1) // 2
    for b in (b for b, g in enumerate(greedy) if g):
        a = int(read[b, 0])
        accs[b] = Acceptance(path=read[b, 2:2 + a].copy(), tokens=read[b, 1 + steps:1 + steps + a].copy(),
                             next_root=int(read[b, 1 + steps + a]))
    others = [b for b, g in enumerate(greedy) if not g]
    processed = {}
    if others:  # their rows, flattened as every backend's pass returns them
        flat = logits.flatten(0, 1).index_select(0, target.pending_rows(bucket, sizes, others))
        sub = [batch[b] for b in others]
        sub_trees = [trees[b] for b in others]
        roots = torch.as_tensor([s.root for s in sub], dtype=torch.int64, device=logits.device)
        sub_accs, _, sub_processed = walk_round(sub, sub_trees, TreeBatch.from_host(sub_trees, logits.device),
                                                [sizes[b] for b in others], roots, flat, engine.host_reads, None,
                                                uniforms)
        for j, b in enumerate(others):
            accs[b] = sub_accs[j]
            if j in sub_processed:
                processed[b] = sub_processed[j]

    def queue(kept: Sequence[np.ndarray]) -> None:
        """Taps of each drafting request's kept rows, copied out of the bucket's buffers (the next
        replay overwrites them)."""
        if taps is None:
            return
        for b, seq in enumerate(batch):
            if seq.done or seq.method == "ar":
                continue
            if greedy[b]:  # the committed path's taps, gathered on the device: rows 0..keep
                seq.pending_taps.append(kept_taps[b, :len(kept[b])].clone())
            else:
                index = upload(b * bucket.width + np.asarray(kept[b], np.int64), taps.device)
                seq.pending_taps.append(taps.index_select(0, index))
    return accs, trees, processed, queue, t3  # type: ignore[return-value]
