"""Verify-cost probe (paper §3.1, App. D): the deployed target's verify latency ell(n) per packed count.

    cast-trtllm probe --sku cpu --target embedded --prefix 512 --threads 2 --out profile.json

The timing is `runtime.engine.latency_probe` (the engine's own round path); this module
holds the protocol and turns its tables into a width profile. Per (prefix P, batch B):
B requests prefill a real prompt of P tokens (this repo's README, tiled) through the
engine's target backend, then for each packed count n = N + 1 `warmup` untimed and
`iters` timed verify passes run (ONE batched pass over the B packs, interleaved over n),
each over fresh random best-first trees of N nodes carrying random packed tokens. A
verify never commits, so every slot stays at P (checked after every pass). Median, p10
and p90 per cell.

Also measured, so the profile's fixed costs are not assumed: the drafter's block pass
over the B requests, and the host work of a round outside both passes (top-K, sorted
prefix masses, tree build, greedy walk, KV commit).
"""

from __future__ import annotations

import datetime
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from cast_trtllm.profile import Provenance, WidthProfile, build_profile
from runtime.engine.autoconfig import make_backend, make_drafter
from runtime.engine.latency_probe import LatencyProbe, Stats
from runtime.model.llama import LlamaTarget

REPO = Path(__file__).resolve().parents[1]
PREFIX_TEXT = REPO / "README.md"
DEFAULT_PACKED = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SKU_DTYPE = {"float32": "fp32", "bfloat16": "bf16"}
BACKENDS = ("torch", "onnxruntime")

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


def prefix_ids(tokenizer: Any, length: int) -> torch.Tensor:
    """[length] int64 ids of real text (the README, tiled)."""
    ids = list(tokenizer(PREFIX_TEXT.read_text()).input_ids)
    return torch.tensor((ids * (length // len(ids) + 1))[:length], dtype=torch.int64)


@torch.inference_mode()
def measure(model: LlamaTarget, tokenizer: Any, drafter, settings: ProbeSettings, progress: bool = False,
            backend: str = "torch") -> dict:
    """The probe's tables: verify / overhead Stats per [prefix][batch][n], drafter per [prefix][batch],
    timed on the engine's `backend` ("torch" or "onnxruntime") over `model` and `drafter`."""
    window, n_max = model.config.context_window, settings.packed_counts[-1]
    if settings.prefix_lengths[-1] + n_max + drafter.config.block_size > window:
        raise ValueError(f"prefix {settings.prefix_lengths[-1]} + {n_max} packed tokens exceed the target's "
                         f"context window of {window}")
    if backend not in BACKENDS:
        raise ValueError(f"--backend must be one of {BACKENDS}, got {backend!r}")
    threads = torch.get_num_threads()
    target = make_backend(backend, model, drafter.config.target_layer_ids, threads)
    draft = make_drafter(backend, drafter, model, threads)
    cells = [(p, b) for p in settings.prefix_lengths for b in settings.batch_sizes]
    passes = len(cells) * len(settings.packed_counts) * (settings.warmup + settings.iters)
    bar = tqdm(total=passes, desc="probe", unit="pass", disable=not progress, file=sys.stderr)
    verify, overhead, drafts = {}, {}, {}
    for p, b in cells:
        bar.set_postfix(prefix=p, batch=b)
        with LatencyProbe(target, prefix_ids(tokenizer, p), b, n_max, draft, settings.seed,
                          depth=draft.num_draft_positions, rank_cap=settings.rank_cap) as probe:
            roots = probe.rng.integers(model.config.vocab_size, size=b).tolist()
            times = [probe.time_draft(roots) for _ in range(settings.warmup + settings.iters)]
            drafts.setdefault(p, {})[b] = Stats.of([ms for ms, _ in times[settings.warmup:]])
            draft_logits = times[-1][1].full()  # [B, L, V]
            host: dict[int, list[float]] = {n: [] for n in settings.packed_counts}
            samples = probe.verify_curve(
                settings.packed_counts, settings.warmup, settings.iters, "tree",
                host=lambda n, trees, logits: host[n].append(probe.time_host(draft_logits, logits, trees)),
                on_pass=lambda n: bar.update())
        verify.setdefault(p, {})[b] = {n: Stats.of(v) for n, v in samples.items()}
        overhead.setdefault(p, {})[b] = {n: Stats.of(v) for n, v in host.items()}
    bar.close()
    return {"verify": verify, "overhead": overhead, "drafter": drafts}


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
