"""Shared fixtures. The embedded target (SmolLM2-135M, ~30 s to dequantize) loads ONCE
per test session."""

from __future__ import annotations

import os

import pytest
import torch

# Triton kernels run through the interpreter where there is no CUDA device. The variable is
# read when triton is first imported, so it is set here, before any test module loads.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# One intra-op thread: on a small shared CPU, extra OpenMP threads spin on barriers and
# make small matmuls 5-15x slower. Override with CAST_TEST_THREADS.
torch.set_num_threads(int(os.environ.get("CAST_TEST_THREADS", "1")))


@pytest.fixture(scope="session")
def embedded_hf():
    """(HF model, tokenizer) of the embedded default target, fp32 on CPU."""
    from runtime.embedded import EmbeddedModelMissing, load_hf_embedded

    try:
        return load_hf_embedded(torch.float32)
    except EmbeddedModelMissing as err:
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def embedded(embedded_hf):
    """`runtime.embedded.LoadedTarget` over the same weights as `embedded_hf`."""
    from runtime.embedded import target_from_hf

    return target_from_hf(*embedded_hf)
