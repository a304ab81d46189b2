"""The one latency probe: the engine's own round path, timed.

Every measured cost in the project comes from here: the execution autoconfig
(`runtime.engine.autoconfig`), `cast-trtllm probe` (the verify-cost curve -> width
profile, `engine_builder.probe`), the GPU check (`perf.gpu_check`) and the backend
benchmark (`perf.bench_backends`). What is timed is what `LLMEngine.step` runs:

  verify  ONE `TargetBackend.verify(seqs, packs, trees)` over B requests (slots of the
          backend's pool) at prefix P, each pack n packed tokens [b, z_1..z_{n-1}];
  draft   ONE block pass of the engine's drafter (`draft_scores`) over the same B requests;
  host    the round's work outside both passes: top-K, prefix masses, tree build, greedy
          walk and the KV commit (rewound, so P stays).

A verify leaves its rows pending and never commits: every slot keeps P rows, checked
after each pass. Trees (`probe_tree`): a `chain` of n-1 nodes, or the exact best-first
top-(n-1) `tree` of random peaked top-K marginals (the shape a round verifies); the
cost of a pass depends on n, not on the shape (the ancestor mask is dense either way).
Timing: `runtime.result.Stopwatch` (the engine's own clock; it synchronizes the device
before every read). Passes of several n are interleaved (every iteration visits every n
in a shuffled order), so load drift on a shared machine hits every n alike.

    probe = LatencyProbe(TorchTarget(model), random_prompt(vocab, 512), batch=4, max_packed=64)
    samples = probe.verify_curve((1, 16, 64), warmup=2, iters=10)   # {n: [ms, ...]}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from cast_trtllm.tree import Tree, build_chain, build_tree, sorted_prefix_masses, topk_per_position
from cast_trtllm.verify import greedy_walk
from runtime.result import Stopwatch

SHAPES = ("chain", "tree")
TREE_DEPTH, RANK_CAP = 16, 8  # random trees: a DFlash-b16 block, top-8 per position
MARGINAL_SCALE = 3.0  # std of the random draft logits: peaked enough for deep trees


@dataclass(frozen=True, slots=True)
class Stats:
    """Median, p10 and p90 of a cell's samples, ms."""

    median: float
    p10: float
    p90: float

    @staticmethod
    def of(samples_ms: Sequence[float]) -> "Stats":
        if len(samples_ms) == 0:
            raise ValueError("no samples: need iters >= 1")
        p10, p50, p90 = np.percentile(np.asarray(samples_ms, dtype=np.float64), [10, 50, 90])
        return Stats(round(float(p50), 4), round(float(p10), 4), round(float(p90), 4))


def probe_tree(n: int, shape: str, rng: np.random.Generator, vocab: int, depth: int = TREE_DEPTH,
               rank_cap: int = RANK_CAP) -> Tree:
    """A tree whose pack is exactly `n` tokens: the top-1 `chain` of n - 1 random positions, or
    the best-first top-(n-1) `tree` over `depth` positions of random top-`rank_cap` marginals."""
    if n < 1:
        raise ValueError(f"packed count n must be >= 1, got {n}")
    if shape not in SHAPES:
        raise ValueError(f"tree shape must be one of {SHAPES}, got {shape!r}")
    if n == 1:
        return Tree.empty()
    positions = n - 1 if shape == "chain" else depth
    logits = rng.standard_normal((positions, rank_cap + 1)) * MARGINAL_SCALE
    lp = np.sort(logits - np.logaddexp.reduce(logits, axis=1, keepdims=True), axis=1)[:, ::-1][:, :rank_cap]
    ids = np.stack([rng.choice(vocab, rank_cap, replace=False) for _ in range(positions)])  # [L, K]
    lp = np.ascontiguousarray(lp)
    tree = build_chain(ids, lp) if shape == "chain" else build_tree(ids, lp, n - 1)
    if tree.num_packed != n:
        raise ValueError(f"{depth} positions x top-{rank_cap} hold fewer than {n - 1} nodes")
    return tree


def random_prompt(vocab: int, length: int, seed: int = 0) -> torch.Tensor:
    """[length] int64 random token ids."""
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed))


class LatencyProbe:
    """B requests holding the same P-token prefix in `backend` (and in `drafter`'s feature
    cache, when given), ready to time the passes of a round.

    backend: a `TargetBackend` (`TorchTarget`, `OrtTarget`); drafter: the engine's drafter
    executor (`DrafterExecutor`, `OrtDrafter`) bound to the same target, or None;
    max_packed: the widest pack per request a pass will carry; depth, rank_cap: the random
    trees' positions and top-K (`probe_tree`)."""

    def __init__(self, backend: Any, prompt: torch.Tensor, batch: int = 1, max_packed: int = 1,
                 drafter: Any = None, seed: int = 0, depth: int = TREE_DEPTH, rank_cap: int = RANK_CAP) -> None:
        if prompt.dim() != 1 or prompt.numel() == 0:
            raise ValueError("the probe's prompt must be a non-empty 1-D tensor of token ids")
        if batch < 1 or max_packed < 1:
            raise ValueError(f"need batch >= 1 and max_packed >= 1, got {batch} and {max_packed}")
        if drafter is not None and tuple(backend.tap_layer_ids) != tuple(drafter.tap_layer_ids):
            raise ValueError(f"the target backend taps layers {tuple(backend.tap_layer_ids)}; the drafter needs "
                             f"{tuple(drafter.tap_layer_ids)}")
        self.prefix, self.batch = prompt.numel(), batch
        capacity = self.prefix + max_packed + (drafter.config.block_size if drafter is not None else 0)
        if capacity > backend.config.context_window:
            raise ValueError(f"prefix {self.prefix} + {max_packed} packed tokens exceed the target's context "
                             f"window of {backend.config.context_window}")
        self.backend, self.drafter, self.max_packed = backend, drafter, max_packed
        self.depth, self.rank_cap = depth, rank_cap
        self.vocab = backend.config.vocab_size
        self.clock = Stopwatch(backend.device, sync=True)
        self.rng = np.random.default_rng(seed)
        self.seqs, self.states, taps = [], [], []
        try:
            for _ in range(batch):  # every request prefills through the backend, as the engine's do
                self.seqs.append(backend.new_sequence(capacity))
                taps.append(backend.prefill(self.seqs[-1], prompt)[1])
            if drafter is not None:
                self.states = [drafter.new_state(capacity) for _ in range(batch)]
                drafter.append_contexts(self.states, taps)
        except BaseException:
            self.close()  # no slot stays taken by a probe that never ran
            raise

    def close(self) -> None:
        """Give every slot back to the backend's (and drafter's) pool."""
        for seq in self.seqs:
            self.backend.release(seq)
        for state in self.states:
            self.drafter.release(state)
        self.seqs, self.states = [], []

    def __enter__(self) -> "LatencyProbe":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ one pass
    def timed(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        """(ms, result) of one call, device-synchronized."""
        start = self.clock.now()
        out = fn()
        return (self.clock.now() - start) * 1e3, out

    def trees(self, n: int, shape: str = "tree") -> list[Tree]:
        """One random tree of `n` packed tokens per request."""
        if n > self.max_packed:
            raise ValueError(f"packed count {n} exceeds the probe's max_packed {self.max_packed}")
        return [probe_tree(n, shape, self.rng, self.vocab, self.depth, self.rank_cap) for _ in range(self.batch)]

    def time_verify(self, trees: Sequence[Tree], packs: Sequence[np.ndarray] | None = None
                    ) -> tuple[float, torch.Tensor]:
        """ms of ONE verify pass over every request's pack -> (ms, logits [Σn, V])."""
        if len(trees) != self.batch:
            raise ValueError(f"the probe holds {self.batch} requests, got {len(trees)} trees")
        if packs is None:  # a random pending root, then the tree's tokens
            packs = [np.concatenate([[self.rng.integers(self.vocab)], t.tokens]).astype(np.int64) for t in trees]
        ms, (logits, _) = self.timed(lambda: self.backend.verify(self.seqs, packs, trees))
        self.check_prefix()
        return ms, logits

    def time_draft(self, roots: Sequence[int] | None = None) -> tuple[float, Any]:
        """ms of ONE drafter block pass over every request -> (ms, `DraftScores` [B, L, Vd])."""
        if self.drafter is None:
            raise ValueError("this probe was built without a drafter")
        roots = self.rng.integers(self.vocab, size=self.batch).tolist() if roots is None else list(roots)
        return self.timed(lambda: self.drafter.draft_scores(self.states, roots))

    def time_host(self, draft_logits: torch.Tensor, logits: torch.Tensor, trees: Sequence[Tree]) -> float:
        """ms of a round's host work outside the passes for B requests building trees of the
        sizes of `trees` from `draft_logits` [B, L, V], walking `logits` [Σn, V] of the last
        verify; the KV commit it times is rewound (every slot keeps P rows)."""
        start, row = self.clock.now(), 0
        for b, (seq, done) in enumerate(zip(self.seqs, trees)):
            ids, lp = topk_per_position(draft_logits[b], self.rank_cap)
            ids, lp = ids.cpu().numpy(), lp.cpu().numpy()  # [L, K]
            sorted_prefix_masses(lp, done.size)
            build_tree(ids, lp, done.size)
            acc = greedy_walk(done, logits[row:row + done.num_packed].argmax(dim=-1).cpu().numpy())
            row += done.num_packed
            self.backend.commit(seq, np.concatenate([[0], acc.path]).astype(np.int64))  # the KV gather
        ms = (self.clock.now() - start) * 1e3
        for seq in self.seqs:
            seq.length = self.prefix  # rewind: the gathered rows sit past P, masked, overwritten next pass
        self.check_prefix()
        return ms

    def check_prefix(self) -> None:
        lengths = [self.backend.prefix_len(s) for s in self.seqs]
        if lengths != [self.prefix] * self.batch:
            raise RuntimeError(f"KV cache lengths {lengths} moved off the probed prefix {self.prefix}")

    # ------------------------------------------------------------------ a curve
    def verify_curve(self, packed: Sequence[int], warmup: int = 1, iters: int = 5, shape: str = "tree",
                     host: Callable[[int, list[Tree], torch.Tensor], None] | None = None,
                     on_pass: Callable[[int], None] = lambda n: None) -> dict[int, list[float]]:
        """Timed verify samples (ms) per packed count n: `warmup` untimed then `iters` timed
        iterations, each visiting every n once in a shuffled order, over fresh random trees.
        `host(n, trees, logits)`, if given, runs after each pass (e.g. times the host work)."""
        if warmup < 0 or iters < 1:
            raise ValueError(f"need warmup >= 0 and iters >= 1, got {warmup} and {iters}")
        if not packed or min(packed) < 1:
            raise ValueError(f"packed counts must be >= 1, got {list(packed)}")
        samples: dict[int, list[float]] = {n: [] for n in packed}
        for i in range(warmup + iters):
            for n in self.rng.permutation(np.asarray(packed)).tolist():
                trees = self.trees(n, shape)
                ms, logits = self.time_verify(trees)
                if i >= warmup:
                    samples[n].append(ms)
                    if host is not None:
                        host(n, trees, logits)
                on_pass(n)
        return samples


def verify_medians(backend: Any, packed: Sequence[int], prefix: int, iters: int = 5, shape: str = "tree",
                   warmup: int = 1, seed: int = 0) -> dict[int, float]:
    """Median verify ms per packed count n of `backend` (one request, a random P-token prefix)."""
    if not packed:
        raise ValueError("need at least one packed count to time")
    prompt = random_prompt(backend.config.vocab_size, prefix, seed)
    with LatencyProbe(backend, prompt, max_packed=max(packed)) as probe:
        samples = probe.verify_curve(packed, warmup=warmup, iters=iters, shape=shape)
    return {n: Stats.of(v).median for n, v in samples.items()}
