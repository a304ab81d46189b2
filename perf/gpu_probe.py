"""GPU check section 3: verify latency l(n) of a random-weight Qwen3-8B-shaped target (the
runtime's own Llama with q/k norm) on the engine's torch backend, paper Table 5 protocol,
timed by the one latency probe (`runtime.engine.latency_probe`)."""

from __future__ import annotations

from runtime.engine.backend import TorchTarget
from runtime.engine.latency_probe import LatencyProbe, Stats, random_prompt
from runtime.model.llama import TargetConfig

QWEN3_8B = TargetConfig(vocab_size=151936, hidden_size=4096, num_layers=36, num_heads=32, num_kv_heads=8,
                        head_dim=128, intermediate_size=12288, rms_norm_eps=1e-6, context_window=40960,
                        qk_norm=True, rope_theta=1e6)
TINY = TargetConfig(vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                    intermediate_size=128, rms_norm_eps=1e-6, context_window=512, qk_norm=True, rope_theta=1e6)
PAPER_PACKED = (1, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def probe(model, prefixes, packed, warmup, iters, seed) -> dict[int, list[float]]:
    """{prefix: [median verify ms per packed count]}: the engine's B = 1 pass (best-first
    trees), never committed (the cache stays at P)."""
    backend, table = TorchTarget(model), {}
    for p in prefixes:
        with LatencyProbe(backend, random_prompt(model.config.vocab_size, p, seed).to(backend.device), 1,
                          max(packed), seed=seed) as run:
            samples = run.verify_curve(packed, warmup, iters, "tree")
        table[p] = [Stats.of(samples[n]).median for n in packed]
    return table
