"""GPU check section 3: verify-forward latency l(n) of a random-weight Qwen3-8B-shaped model
(the runtime's own Llama forward with q/k norm), paper Table 5 protocol."""

from __future__ import annotations

import numpy as np
import torch

from perf.gpu_timing import median_ms, random_tree
from runtime.model.layers import Rotary, default_inv_freq
from runtime.model.llama import LlamaTarget, TargetConfig
from runtime.target import TargetExecutor

QWEN3_8B = TargetConfig(vocab_size=151936, hidden_size=4096, num_layers=36, num_heads=32, num_kv_heads=8,
                        head_dim=128, intermediate_size=12288, rms_norm_eps=1e-6, context_window=40960,
                        qk_norm=True)
TINY = TargetConfig(vocab_size=256, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                    intermediate_size=128, rms_norm_eps=1e-6, context_window=512, qk_norm=True)
PAPER_PACKED = (1, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def random_model(cfg: TargetConfig, device: torch.device, dtype: torch.dtype, seed: int) -> LlamaTarget:
    """The runtime's Llama forward with random weights (N(0, 0.02), norms 1), built on `device`."""
    with torch.device("meta"):
        model = LlamaTarget(cfg, Rotary(torch.empty(cfg.head_dim // 2)))
    model = model.to(dtype).to_empty(device=device)  # allocated once, in `dtype` (8B bf16: 16 GB)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.fill_(1.0) if name.endswith("norm.weight") else param.normal_(0.0, 0.02, generator=gen)
    model.rotary = Rotary(default_inv_freq(cfg.head_dim, 1_000_000.0)).to(device)
    return model.eval().requires_grad_(False)


def probe(model: LlamaTarget, backend, prefixes, packed, warmup, iters, seed, device) -> dict[int, list[float]]:
    """{prefix: [median ms per packed count]}: verify passes that never commit (cache stays at P)."""
    rng, vocab = np.random.default_rng(seed), model.config.vocab_size
    executor = TargetExecutor(model, attention_backend=backend)
    table = {}
    for p in prefixes:
        executor.reset(p + max(packed))
        executor.prefill(torch.from_numpy(rng.integers(0, vocab, p)).to(device))
        row = []
        for n in packed:
            trees = [random_tree(rng, vocab, n - 1) for _ in range(warmup + iters)]  # built untimed
            passes = iter([(torch.from_numpy(np.concatenate([[rng.integers(vocab)], t.tokens]).astype(np.int64)), t)
                           for t in trees])
            row.append(median_ms(lambda: executor.verify(*next(passes)), device, warmup, iters))
            if executor.prefix_len != p:
                raise RuntimeError(f"the KV cache moved off the probed prefix {p}")
        table[p] = row
    return table
