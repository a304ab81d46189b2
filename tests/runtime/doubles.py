"""Test doubles: tiny random targets, a character tokenizer, and drafters whose
proposals are scripted from a known continuation (to force long accepted paths)."""

from __future__ import annotations

from typing import Sequence

import torch

from runtime.model.llama import LlamaTarget


def tiny_hf(model_type: str = "llama", seed: int = 0, vocab: int = 64, std: float = 0.3) -> torch.nn.Module:
    """A 3-layer random HF causal LM (GQA 4/2 heads, tied embeddings)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(
        model_type,
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rope_theta=10_000.0,
        tie_word_embeddings=True,
        initializer_range=std,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def tiny_target(model_type: str = "llama", seed: int = 0, vocab: int = 64) -> tuple[torch.nn.Module, LlamaTarget]:
    hf = tiny_hf(model_type, seed, vocab)
    return hf, LlamaTarget.from_hf(hf)


class CharTokenizer:
    """Token i decodes to the letter chr(ord('a') + i % 26)."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + int(i) % 26) for i in ids)


class ScriptedDrafter:
    """A drafter (the `runtime.drafter.DrafterExecutor` interface) whose marginal at block
    position j puts the TRUE next token (from a known greedy continuation `ref`, ref[0] =
    first generated token) at rank `ranks[(g + j) % len(ranks)]` (None: absent), g = index
    of the pending root in `ref`. Every request it serves must follow the same script.
    """

    def __init__(self, prompt_len: int, ref: Sequence[int], vocab: int, block_size: int = 8,
                 ranks: Sequence[int | None] = (0, 0, 1, 0, None, 0, 2, 0), tap_layer_ids=(0,)) -> None:
        self.prompt_len, self.ref, self.vocab = prompt_len, list(ref), vocab
        self.num_draft_positions = block_size - 1
        self.ranks = list(ranks)
        self.tap_layer_ids = tuple(tap_layer_ids)
        self.mass_exponent = 1.0
        self.drafts = 0
        self.states: list[dict] = []

    def new_state(self, capacity: int) -> dict:
        self.states.append({"context_len": 0})
        return self.states[-1]

    def append_context(self, state: dict, taps: torch.Tensor) -> None:
        state["context_len"] += taps.shape[0]

    def draft(self, states: Sequence[dict], roots: Sequence[int]) -> torch.Tensor:
        return torch.stack([self._one(s["context_len"], r) for s, r in zip(states, roots)])  # [B, L, V]

    def _one(self, context_len: int, root_token: int) -> torch.Tensor:
        self.drafts += 1
        g = context_len - self.prompt_len  # index of the pending root in ref
        assert self.ref[g] == root_token or g >= len(self.ref), "scripted drafter went off script"
        logits = torch.full((self.num_draft_positions, self.vocab), -10.0)
        for j in range(1, self.num_draft_positions + 1):
            true = self.ref[g + j] if g + j < len(self.ref) else 0
            decoys = [(true + 1 + k) % self.vocab for k in range(3)]
            rank = self.ranks[(g + j) % len(self.ranks)]
            order = decoys if rank is None else decoys[:rank] + [true] + decoys[rank:]
            for r, tok in enumerate(order[:3]):
                logits[j - 1, tok] = 5.0 - r
        return logits


def random_target(seed: int, vocab_size: int = 258) -> LlamaTarget:
    """A 2-layer random Llama (hidden 64) whose logits are far from ties."""
    from runtime.model.layers import Rotary, default_inv_freq
    from runtime.model.llama import TargetConfig

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


def prefilled(model: LlamaTarget, ids, tap_layer_ids=(), capacity: int | None = None):
    """(backend, slot, last-row logits [1, V], taps [P, F] | None): a fresh prefill of `ids`
    through the engine's torch backend (`runtime.engine.backend.TorchTarget`)."""
    from runtime.engine.backend import TorchTarget

    ids = torch.as_tensor(ids, dtype=torch.int64)
    backend = TorchTarget(model, tap_layer_ids)
    slot = backend.new_sequence(capacity or ids.numel() + 64)
    logits, taps = backend.prefill(slot, ids)
    return backend, slot, logits, taps


def fresh_kv(model: LlamaTarget, ids):
    """Committed K, V [n, layers, Hkv, d] (numpy) of a fresh prefill of `ids`: what a
    committed cache over the same tokens must equal."""
    backend, slot, _, _ = prefilled(model, ids)
    return backend.pool.committed(slot)
