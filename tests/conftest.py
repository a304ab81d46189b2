"""Shared fixtures. The embedded target (SmolLM2-135M, ~30 s to dequantize) loads ONCE
per test session."""

from __future__ import annotations

import os
from types import SimpleNamespace

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
def embedded_checkpoint():
    """`runtime.loader.HFCheckpoint` of the embedded default target, fp32 on CPU."""
    from runtime.loader import EmbeddedModelMissing, load_hf_checkpoint

    try:
        return load_hf_checkpoint("embedded", dtype=torch.float32)
    except EmbeddedModelMissing as err:
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def embedded_hf(embedded_checkpoint):
    """(HF model, tokenizer) of the embedded default target, fp32 on CPU."""
    return embedded_checkpoint.model, embedded_checkpoint.tokenizer


@pytest.fixture(scope="session")
def embedded_models(embedded_checkpoint):
    """`runtime.loader.LoadedModels` (no drafter) over the same weights as `embedded_hf`."""
    from runtime.loader import models_from_hf

    return models_from_hf(embedded_checkpoint, drafter="none")


@pytest.fixture(scope="session")
def embedded(embedded_models):
    """The embedded target as `.model`, `.tokenizer`, `.eos_token_ids`, `.name` (the view
    older tests use; new tests take `embedded_models`)."""
    m = embedded_models
    return SimpleNamespace(model=m.target, tokenizer=m.tokenizer, eos_token_ids=m.eos_token_ids, name=m.name)
