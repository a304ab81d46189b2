"""Fixtures shared by the engine tests: a random fp32 target (V = 64) and a random DFlash
head for it (L = 4)."""

from __future__ import annotations

import pytest

from runtime.drafter.checkpoint import random_drafter
from tests.runtime.doubles import random_target


@pytest.fixture(scope="module")
def target():
    return random_target(seed=3, vocab_size=64)


@pytest.fixture(scope="module")
def drafter(target):
    return random_drafter(target.config, num_layers=1, block_size=5, seed=4, init_std=0.3)
