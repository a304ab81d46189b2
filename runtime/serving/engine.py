"""Build the batched CAST engine a `ServingConfig` names, with its tokenizer.

- `embedded`: SmolLM2-135M-Instruct (runtime.embedded) + the DFlash head in
  `drafter_dir` (a random head when none is given: correct output, ~no speed-up).
- `random`: a tiny seeded random Llama over a byte tokenizer, for tests and CI; the
  same seed gives the same weights in every process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from cast_trtllm.profile import load_profile
from cast_trtllm.width import WidthPolicy
from runtime.batch_decoder import BatchDecoder, BatchPolicy
from runtime.batch_drafter import DFlashBatchDrafter
from runtime.drafter import DEFAULT_DRAFTER, load_drafter, random_drafter
from runtime.model.layers import Rotary, default_inv_freq
from runtime.model.llama import LlamaTarget, TargetConfig
from runtime.serving.config import ServingConfig


class ByteTokenizer:
    """UTF-8 bytes are ids 0..255; 256 = end of sequence, 257 = drafter mask token."""

    eos_token_id = 256
    mask_token_id = 257
    vocab_size = 258

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


@dataclass(frozen=True, slots=True)
class Engine:
    decoder: BatchDecoder
    tokenizer: Any
    encode: Any  # str -> list[int]


def random_target(seed: int, vocab_size: int = ByteTokenizer.vocab_size) -> LlamaTarget:
    """A 2-layer random Llama (hidden 64) whose logits are far from ties."""
    cfg = TargetConfig(
        vocab_size=vocab_size, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
        intermediate_size=128, rms_norm_eps=1e-6, context_window=1024,
    )
    model = LlamaTarget(cfg, Rotary(default_inv_freq(cfg.head_dim, 10000.0)))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    return model.eval().requires_grad_(False)


def batch_policy(cfg: ServingConfig, prefix_len: int = 512, mass_exponent: float = 1.0) -> BatchPolicy:
    width = None
    if cfg.profile:
        width = WidthPolicy.from_profile(load_profile(cfg.profile), prefix_len, rule="marginal", rank_cap=cfg.rank_cap,
                                         mass_exponent=mass_exponent)
    return BatchPolicy(
        cfg.policy, fixed_width=cfg.fixed_width, uniform_width=cfg.uniform_width, mean_budget=cfg.mean_budget,
        max_width=cfg.max_width, rank_cap=cfg.rank_cap, width_policy=width,
    )


def build_engine(cfg: ServingConfig) -> Engine:
    if cfg.model == "random":
        tokenizer = ByteTokenizer()
        target = random_target(cfg.seed)
        eos, mask = (tokenizer.eos_token_id,), tokenizer.mask_token_id
        encode = tokenizer.encode
    else:
        from runtime.embedded import encode_prompt, load_embedded

        loaded = load_embedded()
        target, tokenizer, eos = loaded.model, loaded.tokenizer, loaded.eos_token_ids
        mask = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

        def encode(text: str) -> list[int]:
            return encode_prompt(tokenizer, text, cfg.chat)

    drafter_dir = cfg.drafter_dir
    if not drafter_dir and cfg.model == "embedded" and (DEFAULT_DRAFTER / "config.json").is_file():
        drafter_dir = str(DEFAULT_DRAFTER)  # the trained head shipped for the embedded target
    if drafter_dir:
        drafter = load_drafter(drafter_dir, target.config)
    else:
        drafter = random_drafter(target.config, block_size=cfg.block_size, seed=cfg.seed + 1, mask_token_id=mask, init_std=0.3)
    policy = batch_policy(cfg, mass_exponent=drafter.config.mass_exponent)
    decoder = BatchDecoder(target, DFlashBatchDrafter(drafter, target), policy, tokenizer, eos)
    return Engine(decoder, tokenizer, encode)
