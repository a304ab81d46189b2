"""A tiny random target + drafter session: exercises the real decoding loop in milliseconds."""

from __future__ import annotations

import pytest
import torch

from types import SimpleNamespace

from cast_trtllm.spec_config import SpecConfig
from perf.session import DecodeSession
from runtime.drafter import DrafterExecutor, random_drafter
from runtime.engine import LLMEngine
from runtime.engine.build import Built
from runtime.model.layers import Rotary, default_inv_freq
from runtime.model.llama import LlamaTarget, TargetConfig

TINY = TargetConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16,
                    intermediate_size=64, rms_norm_eps=1e-5, context_window=512)


def tiny_session(engine_cls: type = LLMEngine) -> DecodeSession:
    """The one engine over a tiny random target + drafter (`engine_cls`: e.g. the relaxed-rule engine)."""
    torch.manual_seed(0)
    model = LlamaTarget(TINY, Rotary(default_inv_freq(TINY.head_dim, 10000.0))).eval().requires_grad_(False)
    drafter = DrafterExecutor(random_drafter(TINY, block_size=8, init_std=0.2), model)
    engine = engine_cls(model, drafter, None, (), SpecConfig(rank_cap=4))
    engine.rule, engine.rounds = None, []
    models = SimpleNamespace(name="tiny random", source="tests", dtype=torch.float32, tokenizer=None,
                             drafter=drafter.drafter)
    return DecodeSession(Built(engine, models, torch.device("cpu"), None), chat=False)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matmuls: intra-op threads only add contention on a shared CPU (30x slower seen)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def session() -> DecodeSession:
    return tiny_session()
