"""Training prompts of a DFlash head: pools that never overlap the evaluation sets.

Pools (paper App. E / DFlash recipe): GSM8K train (MIT), the MBPP training split
(CC-BY-4.0; `perf.datasets.MBPP_TRAINING_IDS`, disjoint from the evaluated test split),
function stubs of the Python standard library (PSF-2.0), and user turns the target writes
itself (`self_chat`: sampled from the chat template's empty user turn, so no third-party
licence applies). The Alpaca / CodeAlpaca pools are CC BY-NC 4.0 and are only used when
asked for by name (`research_only`). Any prompt sharing a 13-gram with an evaluation set
is dropped besides (`drop_contaminated`).
"""

from __future__ import annotations

import json
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from tqdm import tqdm

from drafter_builder.stubs import gsm8k_stub, mbpp_stub, stdlib_stubs
from perf.datasets import GSM8K_TRAIN_FILE, MBPP_FILE, MBPP_TRAINING_IDS, mbpp_prompt


@dataclass(frozen=True, slots=True)
class PromptSource:
    """A prompt pool and its licence; `research_only` pools taint a head's licence."""

    name: str
    file: str | None  # in the data directory; None: written by the target itself
    licence: str
    research_only: bool = False


_STDLIB_LICENCE = f"PSF-2.0 (the Python {sys.version_info.major}.{sys.version_info.minor} standard library)"
_MBPP_LICENCE = f"CC-BY-4.0 (google-research/mbpp), task_id {MBPP_TRAINING_IDS.start}-{MBPP_TRAINING_IDS.stop - 1}"
PROMPT_SOURCES = {
    s.name: s
    for s in (
        PromptSource("gsm8k_train", GSM8K_TRAIN_FILE, "MIT (openai/grade-school-math)"),
        PromptSource("gsm8k_stub", GSM8K_TRAIN_FILE, "MIT (openai/grade-school-math), as function stubs"),
        PromptSource("mbpp_train", MBPP_FILE, _MBPP_LICENCE),
        PromptSource("mbpp_stub", MBPP_FILE, _MBPP_LICENCE + ", as function stubs"),
        PromptSource("mbpp_doctest", MBPP_FILE, _MBPP_LICENCE + ", as stubs with imports and every test"),
        PromptSource("stdlib_function", None, _STDLIB_LICENCE + ", public top-level functions as stubs"),
        PromptSource("stdlib_method", None, _STDLIB_LICENCE + ", public methods as stubs in their class"),
        PromptSource("self_chat", None, "written by the target itself (sampled user turns)"),
        PromptSource("alpaca", "alpaca_noinput_instructions.json", "CC BY-NC 4.0 (tatsu-lab/stanford_alpaca)", True),
        PromptSource("code_alpaca", "code_alpaca_2k.json", "CC BY-NC 4.0 (sahil280114/codealpaca)", True),
    )
}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def pool(data_dir: Path, name: str) -> list[str]:
    """Every prompt of the pool `name` (not `self_chat`: the target writes those), in file order."""
    if name in ("stdlib_function", "stdlib_method"):
        return stdlib_stubs(methods=name == "stdlib_method")
    path = Path(data_dir) / str(PROMPT_SOURCES[name].file)
    if name in ("gsm8k_train", "gsm8k_stub"):
        questions = [r["question"] for r in read_jsonl(path)]
        return questions if name == "gsm8k_train" else [gsm8k_stub(q) for q in questions]
    if name in ("mbpp_train", "mbpp_stub", "mbpp_doctest"):
        rows = [r for r in read_jsonl(path) if int(r["task_id"]) in MBPP_TRAINING_IDS]
        if name == "mbpp_train":
            return [mbpp_prompt(r) for r in rows]
        stubs = (mbpp_stub(r, every_test=name == "mbpp_doctest") for r in rows)
        return [s for s in stubs if s is not None]
    rows = json.loads(path.read_text())
    return [(r["instruction"] + ("\n\n" + r["input"] if r.get("input") else "")).strip() for r in rows]


def load_prompts(
    data_dir: Path, counts: dict[str, int], seed: int, self_chat: Sequence[str] = ()
) -> list[tuple[str, str]]:
    """(source name, user prompt) pairs, `counts[name]` from each pool, shuffled with `seed`.

    `self_chat` holds the target-written prompts (see `sample_self_prompts`).
    """
    unknown = set(counts) - set(PROMPT_SOURCES)
    if unknown:
        raise ValueError(f"unknown prompt sources {sorted(unknown)}; choose from {sorted(PROMPT_SOURCES)}")
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    for name, count in counts.items():
        texts = list(self_chat) if name == "self_chat" else pool(data_dir, name)
        if count > len(texts):
            raise ValueError(f"prompt source {name} holds {len(texts)} prompts, fewer than the {count} asked for")
        rng.shuffle(texts)
        out += [(name, t) for t in texts[:count]]
    rng.shuffle(out)
    return out


def _ngrams(text: str, n: int = 13) -> set[tuple[str, ...]]:
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i : i + n]) for i in range(max(1, len(words) - n + 1))}


def drop_contaminated(prompts: Iterable[str], evaluation: Iterable[str], n: int = 13) -> list[str]:
    """Prompts sharing no word n-gram (13, the GPT-3 contamination check) with `evaluation`."""
    banned: set[tuple[str, ...]] = set()
    for text in evaluation:
        banned |= _ngrams(text, n)
    return [p for p in prompts if not (_ngrams(p, n) & banned)]


@torch.inference_mode()
def sample_self_prompts(
    model: Any, tokenizer: Any, count: int, seed: int, batch_size: int = 32, max_tokens: int = 96
) -> list[str]:
    """User turns the target writes itself: sampled (T=1, top-p 0.95) after the chat
    template's system turn and an opened user turn; unique, 4+ words, closed by EOS."""
    head = tokenizer.apply_chat_template([{"role": "user", "content": "@@"}], tokenize=False).split("@@")[0]
    ids = tokenizer(head, add_special_tokens=False, return_tensors="pt")["input_ids"]
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    torch.manual_seed(seed)
    seen: dict[str, None] = {}
    bar = tqdm(total=count, desc="self-written prompts", unit="prompt")
    for _ in range(4 * count // batch_size + 4):  # bounded: duplicates and runaways are dropped
        batch = ids.repeat(batch_size, 1).to(model.device)
        out = model.generate(
            input_ids=batch, attention_mask=torch.ones_like(batch), do_sample=True, temperature=1.0, top_p=0.95,
            max_new_tokens=max_tokens, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id,
        )[:, ids.shape[1] :].cpu()
        for row in out.tolist():
            if eos not in row:
                continue  # ran past max_tokens: not a closed user turn
            text = tokenizer.decode(row[: row.index(eos)], skip_special_tokens=True).strip()
            if len(text.split()) >= 4 and text not in seen:
                seen[text] = None
        bar.update(min(count, len(seen)) - bar.n)
        if len(seen) >= count:
            break
    bar.close()
    return list(seen)[:count]
