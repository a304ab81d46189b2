"""The pool-attention timing helper runs on the CPU (tiny shapes) and both paths agree."""
import numpy as np
import torch

from plugins.tree_attention.bench_pool import chain_bitmask, time_pool_attention
from tests.plugins.trees import ancestor_bitmask, chain_parents


def test_chain_bitmask_is_the_ancestor_bitmask_of_a_chain():
    words = chain_bitmask(2, 40, "cpu")
    assert words.shape == (2, 40, 2) and words.dtype == torch.int32
    assert np.array_equal(words[1].numpy(), ancestor_bitmask(chain_parents(40), 2))


def test_timing_helper_reports_both_paths_and_their_agreement_on_cpu():
    result = time_pool_attention(2, 4, 20, 4, 2, 16, torch.float32, "cpu", warmup=1, iters=2)
    assert result["kernel_ms"] > 0 and result["sdpa_ms"] > 0 and result["speedup"] > 0
    assert (result["C"], result["num_splits"]) == (64, 1)
    assert result["max_abs_diff"] < 1e-4
