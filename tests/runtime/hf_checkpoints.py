"""Tiny random HF checkpoints of every supported family, and z-lab-format DFlash drafters
for them, written to disk the way real ones are (`save_pretrained`), for loader and
engine tests. Deterministic (seeded), fast (well under 2 s each), and with weights of
std 0.3 so that logits are far from ties and greedy equality tests mean something.

Every target: hidden 64, 2 layers, GQA 4/2 heads of 16, vocab `VOCAB`, a real byte-level
tokenizer with a ChatML chat template saved into the same directory, and EOS ids spread
over the three places they can live (tokenizer: <|im_end|>, config.json: <|endoftext|>,
generation_config.json: both plus <|eot|>). Per family:
  llama  Llama 3.x shape: untied lm_head, llama3 RoPE scaling (theta 5e5)
  qwen2  Qwen2/2.5 shape: q/k/v biases (random, not zero), tied embeddings (theta 1e6)
  qwen3  Qwen3 shape: q/k RMSNorm, tied embeddings (theta 1e6)
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch

FAMILIES = ("llama", "qwen2", "qwen3")
VOCAB = 320  # 256 byte tokens + specials, rounded up (ids past the tokenizer are never produced)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|eot|>", "<|mask|>")
ENDOFTEXT, IM_START, IM_END, EOT, MASK = range(256, 256 + len(SPECIALS))
STD = 0.3
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500_000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


@functools.cache
def tiny_tokenizer():
    """Byte-level BPE without merges (every byte one token) plus `SPECIALS` at 256…"""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab |= {tok: 256 + i for i, tok in enumerate(SPECIALS)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        additional_special_tokens=list(SPECIALS[1:]))
    tokenizer.chat_template = CHATML
    return tokenizer


def tiny_hf_model(family: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The random HF causal LM of one family (see the module doc), in `dtype`."""
    from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6,
                  bos_token_id=IM_START, eos_token_id=ENDOFTEXT, pad_token_id=ENDOFTEXT)
    if family == "llama":
        config = LlamaConfig(**common, head_dim=16, rope_parameters=dict(LLAMA3_ROPE), tie_word_embeddings=False)
    elif family == "qwen2":
        config = Qwen2Config(**common, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                             tie_word_embeddings=True)
    elif family == "qwen3":
        config = Qwen3Config(**common, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                             tie_word_embeddings=True)
    else:
        raise ValueError(f"family {family!r} is not one of {FAMILIES}")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # tied weights appear once
            noise = torch.randn(param.shape, generator=gen)
            param.copy_(1.0 + 0.1 * noise if "norm" in name else STD * noise)
    model.generation_config = GenerationConfig(bos_token_id=IM_START, eos_token_id=[IM_END, ENDOFTEXT, EOT])
    return model.to(dtype).eval()


def write_tiny_checkpoint(family: str, out_dir: str | Path, dtype: torch.dtype = torch.float32,
                          shards: int = 1, seed: int = 0) -> Path:
    """`save_pretrained` of `tiny_hf_model(family, seed, dtype)` and `tiny_tokenizer()` into
    `out_dir`; `shards` > 1 splits the weights (model.safetensors.index.json). Returns the dir."""
    out_dir = Path(out_dir)
    model = tiny_hf_model(family, seed, dtype)
    size = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    model.save_pretrained(out_dir, **({"max_shard_size": size // shards + 1} if shards > 1 else {}))
    tiny_tokenizer().save_pretrained(out_dir)
    return out_dir


def write_tiny_drafter(target_dir: str | Path, out_dir: str | Path, seed: int = 0, num_layers: int = 1,
                       block_size: int = 8, target_copies: bool = False) -> Path:
    """A random DFlash head for the checkpoint in `target_dir`, saved with a config.json laid
    out exactly as z-lab publishes one (transformers 4.57 Qwen3 fields, top-level
    block_size, dflash_config); `target_copies` adds `embed_tokens` / `lm_head` copies to
    the safetensors, as some published heads carry. Taps every target layer; mask <|mask|>."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig

    from runtime.drafter import random_drafter, save_drafter
    from runtime.drafter.config import CONFIG_NAME, WEIGHTS_NAME
    from runtime.model.llama import TargetConfig

    target = TargetConfig.from_hf(AutoConfig.from_pretrained(target_dir))
    drafter = random_drafter(target, num_layers=num_layers, block_size=block_size, seed=seed, mask_token_id=MASK,
                             target_layer_ids=list(range(target.num_layers)), init_std=STD)
    out_dir = Path(out_dir)
    save_drafter(drafter, out_dir)
    ours = json.loads((out_dir / CONFIG_NAME).read_text())
    published = {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "block_size": block_size,
        "bos_token_id": IM_START,
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": list(range(target.num_layers))},
        "dtype": "bfloat16",
        "eos_token_id": IM_END,
        "head_dim": target.head_dim,
        "hidden_act": "silu",
        "hidden_size": target.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": ours["intermediate_size"],
        "layer_types": ["full_attention"] * num_layers,
        "max_position_embeddings": 512,
        "max_window_layers": num_layers,
        "model_type": "qwen3",
        "num_attention_heads": target.num_heads,
        "num_hidden_layers": num_layers,
        "num_key_value_heads": target.num_kv_heads,
        "num_target_layers": target.num_layers,
        "rms_norm_eps": target.rms_norm_eps,
        "rope_scaling": dict(target.rope_scaling) or None,
        "rope_theta": target.rope_theta,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "transformers_version": "4.57.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": target.vocab_size,
    }
    (out_dir / CONFIG_NAME).write_text(json.dumps(published, indent=2) + "\n")
    if target_copies:
        tensors = load_file(str(out_dir / WEIGHTS_NAME))
        gen = torch.Generator().manual_seed(seed + 1)
        for key in ("embed_tokens.weight", "lm_head.weight"):
            tensors[key] = torch.randn(target.vocab_size, target.hidden_size, generator=gen)
        save_file(tensors, str(out_dir / WEIGHTS_NAME), metadata={"format": "pt"})
    return out_dir
