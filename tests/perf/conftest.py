"""A tiny random target + drafter session: exercises the real decoding loop in milliseconds."""

from __future__ import annotations

import pytest
import torch

from perf.session import DecodeSession
from runtime.decoder import Decoder
from runtime.drafter import DrafterExecutor, random_drafter
from runtime.model.layers import Rotary, default_inv_freq
from runtime.model.llama import LlamaTarget, TargetConfig
from runtime.target import TargetExecutor

TINY = TargetConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16,
                    intermediate_size=64, rms_norm_eps=1e-5, context_window=512)


def tiny_session(decoder_cls: type = Decoder) -> DecodeSession:
    torch.manual_seed(0)
    model = LlamaTarget(TINY, Rotary(default_inv_freq(TINY.head_dim, 10000.0))).eval().requires_grad_(False)
    drafter = DrafterExecutor(random_drafter(TINY, block_size=8, init_std=0.2), model)
    decoder = decoder_cls(TargetExecutor(model, drafter.tap_layer_ids), drafter, None, ())
    return DecodeSession(decoder, None, {"model": "tiny random"}, None, rank_cap=4, chat=False)


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
