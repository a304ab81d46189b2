"""Verify-cost probe (paper §3.1, App. D): the deployed target's verify latency ell(n) per packed count.

    cast-trtllm probe --sku cpu --target embedded --prefix 512 --threads 2 --out profile.json

Protocol per (prefix P, batch B): prefill a real prompt of P tokens once (this repo's
README, tiled), then for each packed count n = N + 1 run `warmup` untimed and `iters`
timed verify forwards of the target executor (interleaved over n, so load drift on a
shared machine hits every n alike), each over a fresh random prefix-closed
tree of N nodes (`build_tree` on random top-K marginals: the shape a round really
verifies) carrying random packed tokens. The cost depends on n, not on the shape: the
ancestor mask is a dense [n, P + n] matrix either way. A verify never commits, so the
KV cache length stays P (the next pass overwrites the pending rows, no compaction);
the probe checks it after every pass. GPU: CUDA events; CPU: perf_counter. Median,
p10 and p90 per cell.

Also measured, so the profile's fixed costs are not assumed: the drafter forward (one
draft call over a P-row feature cache) and the host work of a round outside both
forwards (top-K, sorted prefix masses, tree build, pack, greedy walk, KV gather).
"""

from __future__ import annotations

import datetime
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from tqdm import tqdm

from cast_trtllm.profile import Provenance, WidthProfile, build_profile
from cast_trtllm.tree import Tree, build_tree, sorted_prefix_masses, topk_per_position
from cast_trtllm.verify import greedy_walk
from runtime.batch_forward import ragged_verify
from runtime.drafter import DrafterExecutor
from runtime.kv_cache import KVCache
from runtime.model.llama import LlamaTarget
from runtime.target import TargetExecutor

REPO = Path(__file__).resolve().parents[1]
PREFIX_TEXT = REPO / "README.md"
DEFAULT_PACKED = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SKU_DTYPE = {"float32": "fp32", "bfloat16": "bf16"}
MARGINAL_SCALE = 3.0  # std of the random draft logits: peaked enough for deep trees


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    prefix_lengths: tuple[int, ...]
    batch_sizes: tuple[int, ...] = (1,)
    packed_counts: tuple[int, ...] = DEFAULT_PACKED  # n = N + 1
    warmup: int = 8
    iters: int = 30
    rank_cap: int = 8  # K of the random trees and the overhead's top-K
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("prefix_lengths", "batch_sizes", "packed_counts"):
            v = getattr(self, name)
            if not v or v[0] < 1 or any(b <= a for a, b in zip(v, v[1:])):
                raise ValueError(f"--{name.split('_')[0]}: expected strictly ascending integers >= 1, got {list(v)}")
        if len(self.packed_counts) < 2:
            raise ValueError("--packed: the affine fit needs at least 2 packed counts")
        if self.warmup < 0 or self.iters < 1:
            raise ValueError(f"need --warmup >= 0 and --iters >= 1, got {self.warmup} and {self.iters}")
        if self.rank_cap < 1:
            raise ValueError(f"--rank-cap must be >= 1, got {self.rank_cap}")


@dataclass(frozen=True, slots=True)
class Stats:
    median: float
    p10: float
    p90: float

    @staticmethod
    def of(samples_ms: Sequence[float]) -> "Stats":
        p10, p50, p90 = np.percentile(np.asarray(samples_ms), [10, 50, 90])
        return Stats(round(float(p50), 4), round(float(p10), 4), round(float(p90), 4))


class Timer:
    """ms of one call: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], Any]) -> tuple[float, Any]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end), out
        t0 = time.perf_counter()
        out = fn()
        return (time.perf_counter() - t0) * 1e3, out


def random_tree(rng: np.random.Generator, vocab: int, depth: int, rank_cap: int, budget: int) -> Tree:
    """A random prefix-closed tree of `budget` nodes: the exact top-N tree of random marginals."""
    logits = rng.standard_normal((depth, rank_cap + 1)) * MARGINAL_SCALE
    lp = np.sort(logits - np.logaddexp.reduce(logits, axis=1, keepdims=True), axis=1)[:, ::-1][:, :rank_cap]
    ids = np.stack([rng.choice(vocab, rank_cap, replace=False) for _ in range(depth)])  # [L, K]
    return build_tree(ids, np.ascontiguousarray(lp), budget)


def pack_of(rng: np.random.Generator, vocab: int, tree: Tree) -> np.ndarray:
    """[N + 1] int64: a random pending root, then the tree's tokens."""
    return np.concatenate([[rng.integers(vocab)], tree.tokens]).astype(np.int64)


def prefix_ids(tokenizer: Any, length: int) -> torch.Tensor:
    """[length] int64 ids of real text (the README, tiled)."""
    ids = list(tokenizer(PREFIX_TEXT.read_text()).input_ids)
    return torch.tensor((ids * (length // len(ids) + 1))[:length], dtype=torch.int64)


class Bench:
    """B requests whose target and drafter caches cover the same P-token prefix."""

    def __init__(self, model: LlamaTarget, drafter, prompt: torch.Tensor, batch: int, max_packed: int) -> None:
        self.model, self.batch, self.prefix = model, batch, prompt.numel()
        self.executor = TargetExecutor(model, drafter.config.target_layer_ids)
        self.executor.reset(self.prefix + max_packed)
        taps = self.executor.prefill(prompt).taps  # [P, F]
        self.caches = [self.executor.cache] + [_clone(self.executor.cache) for _ in range(batch - 1)]
        self.drafter = DrafterExecutor(drafter, model)  # the engine's drafter (one batched pass)
        self.states = [self.drafter.new_state(self.prefix) for _ in range(batch)]
        for state in self.states:
            self.drafter.append_context(state, taps)

    @property
    def num_draft_positions(self) -> int:
        return self.drafter.num_draft_positions

    def draft(self, roots: list[int]) -> torch.Tensor:
        """[B, L, V] draft logits."""
        return self.drafter.draft(self.states, roots)

    def verify(self, packs: list[np.ndarray], trees: list[Tree]) -> list[torch.Tensor]:
        """One verify forward (ragged for B > 1). Returns per-request logits [n_b, V]."""
        if self.batch == 1:
            return [self.executor.verify(torch.from_numpy(packs[0]), trees[0]).logits]
        logits, _ = ragged_verify(self.model, self.caches, packs, trees, self.executor.tap_layer_ids)
        return list(torch.split(logits, [t.num_packed for t in trees]))

    def check_prefix(self) -> None:
        lengths = [c.length for c in self.caches]
        if lengths != [self.prefix] * self.batch:
            raise RuntimeError(f"KV cache lengths {lengths} moved off the probed prefix {self.prefix}")

    def round_overhead(self, draft_logits: torch.Tensor, logits: list[torch.Tensor], rank_cap: int, budget: int) -> None:
        """Host work of one round outside the forwards; rewinds the KV gather it times."""
        for b, cache in enumerate(self.caches):
            ids, lp = topk_per_position(draft_logits[b], rank_cap)
            ids, lp = ids.cpu().numpy(), lp.cpu().numpy()  # [L, K]
            sorted_prefix_masses(lp, budget)
            tree = build_tree(ids, lp, budget)
            np.concatenate([[0], tree.tokens]).astype(np.int64)
            acc = greedy_walk(tree, logits[b][: tree.num_packed].argmax(dim=-1))
            cache.compact(np.concatenate([[0], acc.path]))  # KV gather of the accepted rows
            cache.length = self.prefix


def _clone(cache: KVCache) -> KVCache:
    copy = KVCache(cache.k.shape[0], cache.k.shape[1], cache.k.shape[3], cache.capacity, cache.k.dtype, cache.k.device)
    copy.k.copy_(cache.k)
    copy.v.copy_(cache.v)
    copy.length = cache.length
    return copy


def time_grid(bench: Bench, draft_logits: torch.Tensor, settings: ProbeSettings, rng: np.random.Generator,
              timer: Timer, on_pass: Callable[[int], None] = lambda n: None) -> tuple[dict, dict]:
    """Verify and round-overhead Stats per packed count n: ({n: Stats}, {n: Stats}).

    Passes are interleaved (every iteration visits every n, in a shuffled order), so the
    slow load drift of a shared machine hits every n alike instead of biasing the curve.
    """
    vocab, depth = bench.model.config.vocab_size, bench.num_draft_positions
    verify = {n: [] for n in settings.packed_counts}
    overhead = {n: [] for n in settings.packed_counts}
    for i in range(settings.warmup + settings.iters):
        for n in rng.permutation(settings.packed_counts).tolist():
            trees = [random_tree(rng, vocab, depth, settings.rank_cap, n - 1) for _ in range(bench.batch)]
            packs = [pack_of(rng, vocab, t) for t in trees]
            verify_ms, logits = timer(lambda: bench.verify(packs, trees))
            bench.check_prefix()
            host_ms, _ = timer(lambda: bench.round_overhead(draft_logits, logits, settings.rank_cap, n - 1))
            bench.check_prefix()
            if i >= settings.warmup:
                verify[n].append(verify_ms)
                overhead[n].append(host_ms)
            on_pass(n)
    return ({n: Stats.of(v) for n, v in verify.items()}, {n: Stats.of(v) for n, v in overhead.items()})


def time_calls(fn: Callable[[], Any], settings: ProbeSettings, timer: Timer) -> tuple[Stats, Any]:
    samples, out = [], None
    for i in range(settings.warmup + settings.iters):
        ms, out = timer(fn)
        if i >= settings.warmup:
            samples.append(ms)
    return Stats.of(samples), out


@torch.inference_mode()
def measure(model: LlamaTarget, tokenizer: Any, drafter, settings: ProbeSettings, progress: bool = False) -> dict:
    """The probe's tables: verify / overhead Stats per [prefix][batch][n], drafter per [prefix][batch]."""
    window, n_max = model.config.context_window, settings.packed_counts[-1]
    if settings.prefix_lengths[-1] + n_max + drafter.config.block_size > window:
        raise ValueError(f"prefix {settings.prefix_lengths[-1]} + {n_max} packed tokens exceed the target's "
                         f"context window of {window}")
    device = model.lm_head.weight.device
    timer, rng = Timer(device), np.random.default_rng(settings.seed)
    cells = [(p, b) for p in settings.prefix_lengths for b in settings.batch_sizes]
    passes = len(cells) * len(settings.packed_counts) * (settings.warmup + settings.iters)
    bar = tqdm(total=passes, desc="probe", unit="pass", disable=not progress, file=sys.stderr)
    verify, overhead, draft = {}, {}, {}
    for p, b in cells:
        bar.set_postfix(prefix=p, batch=b)
        bench = Bench(model, drafter, prefix_ids(tokenizer, p), b, n_max)
        roots = rng.integers(model.config.vocab_size, size=b).tolist()
        drafter_stats, draft_logits = time_calls(lambda: bench.draft(roots), settings, timer)
        draft.setdefault(p, {})[b] = drafter_stats
        verify.setdefault(p, {})[b], overhead.setdefault(p, {})[b] = time_grid(
            bench, draft_logits, settings, rng, timer, lambda n: bar.update())
    bar.close()
    return {"verify": verify, "overhead": overhead, "drafter": draft}


def to_profile(tables: dict, settings: ProbeSettings, *, sku: str, device: str, target: str, dtype: str,
               max_buckets: int, host: str, notes: str) -> WidthProfile:
    """Width profile of the median table. Fixed costs per batch come from the smallest
    prefix: the drafter forward, and the host overhead at the smallest packed count (its
    width-independent part; the rest is reported next to the profile, not folded in,
    so the rules' slope is the forward-only c1_fw of paper §3.3)."""
    import transformers

    p0, n0 = settings.prefix_lengths[0], settings.packed_counts[0]
    verify = tables["verify"]
    return build_profile(
        sku=sku, device=device, target=target, dtype=dtype, packed_counts=list(settings.packed_counts),
        latency_ms={p: {b: [verify[p][b][n].median for n in settings.packed_counts] for b in row}
                    for p, row in verify.items()},
        provenance=Provenance(source="measured", date=datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"), torch_version=torch.__version__, transformers_version=transformers.__version__,
            host=host, notes=notes),
        max_buckets=max_buckets,
        drafter_ms={b: tables["drafter"][p0][b].median for b in settings.batch_sizes},
        overhead_ms={b: tables["overhead"][p0][b][n0].median for b in settings.batch_sizes})
