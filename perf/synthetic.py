"""trtllm-bench's synthetic `token-norm-dist` dataset: random token ids whose input and
output lengths are drawn from normal distributions (as `prepare_dataset.py token-norm-dist`
writes them: rows {"task_id", "input_ids", "output_tokens"}), seeded."""

from __future__ import annotations

import numpy as np

from perf.datasets import DatasetError, Request


def token_norm_dist(num_requests: int, input_mean: int, input_stdev: float, output_mean: int, output_stdev: float,
                    vocab_size: int, seed: int = 0) -> list[Request]:
    """`num_requests` rows; lengths are rounded normal draws, at least 1; ids uniform in [0, vocab_size)."""
    for name, value in (("--num-requests", num_requests), ("--input-mean", input_mean),
                        ("--output-mean", output_mean), ("vocab size", vocab_size)):
        if value < 1:
            raise DatasetError(f"{name} must be >= 1, got {value}")
    if input_stdev < 0 or output_stdev < 0:
        raise DatasetError("--input-stdev and --output-stdev must be >= 0")
    rng = np.random.default_rng(seed)
    inputs = np.maximum(1, np.rint(rng.normal(input_mean, input_stdev, num_requests))).astype(int)
    outputs = np.maximum(1, np.rint(rng.normal(output_mean, output_stdev, num_requests))).astype(int)
    return [Request(i, int(o), input_ids=tuple(int(t) for t in rng.integers(0, vocab_size, int(n))))
            for i, (n, o) in enumerate(zip(inputs, outputs))]
