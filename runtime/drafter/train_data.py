"""Training data for a DFlash head: the target's own greedy continuations and taps.

Prompts (paper App. E / DFlash recipe) come from pools that never overlap the
evaluation slices: GSM8K train (MIT), MBPP task_id 511-974 (CC-BY-4.0), function stubs
of the Python standard library (PSF-2.0), and user turns the target writes itself
(`self_chat`: sampled from the chat template's empty user turn, so no third-party licence
applies). The Alpaca / CodeAlpaca pools are CC BY-NC 4.0 and are only used when asked for
by name (`research_only`).

Responses are the target's greedy continuations (chat template applied), so the head
learns the target's greedy law; one batched `generate` yields the drafter taps (HF
`hidden_states[id+1]` for each tapped layer) on the way, with no second pass. Shards
of fp16 taps are written to disk and streamed back during training.
"""

from __future__ import annotations

import ast
import json
import random
import re
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import torch
from tqdm import tqdm

# ---------------------------------------------------------------- prompts


@dataclass(frozen=True, slots=True)
class PromptSource:
    """A prompt pool and its licence; `research_only` pools taint a head's licence."""

    name: str
    file: str | None  # in the data directory; None: written by the target itself
    licence: str
    research_only: bool = False


_STDLIB_LICENCE = f"PSF-2.0 (the Python {sys.version_info.major}.{sys.version_info.minor} standard library)"
PROMPT_SOURCES = {
    s.name: s
    for s in (
        PromptSource("gsm8k_train", "gsm8k_train.jsonl", "MIT (openai/grade-school-math)"),
        PromptSource("gsm8k_stub", "gsm8k_train.jsonl", "MIT (openai/grade-school-math), as function stubs"),
        PromptSource("mbpp_train", "mbpp.jsonl", "CC-BY-4.0 (google-research/mbpp), task_id 511-974"),
        PromptSource("mbpp_stub", "mbpp.jsonl", "CC-BY-4.0 (google-research/mbpp), task_id 511-974, as function stubs"),
        PromptSource("mbpp_doctest", "mbpp.jsonl",
                     "CC-BY-4.0 (google-research/mbpp), task_id 511-974, as stubs with imports and every test"),
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


def mbpp_prompt(row: dict[str, Any]) -> str:
    return row["text"] + " Your code should pass these tests:\n\n" + "\n".join(row["test_list"])


_ASSERT_EQ = re.compile(r"^assert\s+(.+?)\s*==\s*(.+)$")


def mbpp_stub(row: dict[str, Any], every_test: bool = False) -> str | None:
    """An MBPP task as a HumanEval-style prompt: the signature of the tested function of
    the reference solution and a docstring holding the task text and its first test as a
    doctest. None when the solution defines no such top-level function.

    `every_test` (pool `mbpp_doctest`) writes every `assert f(..) == y` test as a
    doctest and opens with the solution's top-level imports, as HumanEval stubs do.
    """
    asserts = row["test_list"] if every_test else row["test_list"][:1]
    tests = [m for m in (_ASSERT_EQ.match(t.strip()) for t in asserts) if m is not None]
    called = re.match(r"\s*(\w+)\s*\(", tests[0].group(1)) if tests else None
    lines = [ln.rstrip() for ln in row["code"].splitlines()]
    defs = [ln for ln in lines if ln.startswith("def ")]
    if called is not None:
        defs = [ln for ln in defs if re.match(rf"def\s+{re.escape(called.group(1))}\s*\(", ln)]
    if not defs:
        return None
    signature, doc = defs[0], row["text"].strip()
    for test in tests:
        doc += f"\n    >>> {test.group(1)}\n    {test.group(2)}"
    imports = [ln for ln in lines if ln.startswith(("import ", "from "))] if every_test else []
    head = "\n".join(imports) + "\n\n\n" if imports else ""
    return f'{head}{signature}\n    """ {doc}\n    """\n'


def gsm8k_stub(question: str) -> str:
    """A GSM8K question as a HumanEval-style stub (pool `gsm8k_stub`): the target answers
    a stub with bare code, the shape of a HumanEval answer, on a permissive pool larger
    than MBPP's 463 training tasks."""
    return f'def solution() -> int:\n    """ {question.strip()}\n    Return the final answer.\n    """\n'


_STDLIB_SKIP = {"site-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "tkinter", "unittest"}
STUB_DOC_LINES = 20


def _stub_doc(doc: str, indent: str) -> str:
    """A docstring as a stub writes it: its first paragraphs up to STUB_DOC_LINES lines."""
    lines = doc.splitlines()
    if len(lines) > STUB_DOC_LINES:
        breaks = [i for i, ln in enumerate(lines[:STUB_DOC_LINES]) if not ln.strip()]
        lines = lines[: breaks[-1] if breaks else STUB_DOC_LINES]
    body = "\n".join(indent + ln if ln.strip() else "" for ln in lines).lstrip()
    raw = "r" if "\\" in body else ""  # the source wrote a backslash in a raw docstring
    return f'{indent}{raw}""" {body}\n{indent}"""\n'


def _stubs(nodes: list[ast.stmt], indent: str = "") -> list[str]:
    """Stubs of the public functions among `nodes` whose docstring a stub can hold (4+ words, no triple quote)."""
    out = []
    for fn in nodes:
        doc = ast.get_docstring(fn) if isinstance(fn, ast.FunctionDef) and not fn.name.startswith("_") else None
        if doc is None or len(doc.split()) < 4 or '"""' in doc:
            continue
        head = ast.FunctionDef(name=fn.name, args=fn.args, body=[ast.Pass()], decorator_list=[], returns=fn.returns,
                               type_comment=None, type_params=[])
        signature = ast.unparse(ast.fix_missing_locations(head)).rsplit("\n", 1)[0]
        out.append(f"{indent}{signature}\n" + _stub_doc(doc, indent + "    "))
    return out


def stdlib_stubs(methods: bool, root: Path | None = None) -> list[str]:
    """HumanEval-style stubs (signature + docstring) of the documented public functions of the
    interpreter's standard library (PSF-2.0), in file order: varied real signatures, which the
    MBPP (463 tasks) and GSM8K (one signature) stubs lack. `methods`: public methods instead,
    each as a stub inside its `class` line. Tests, IDLE, lib2to3, tkinter and third-party
    packages are left out; the pool is fixed by the Python minor version."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    out: dict[str, None] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in _STDLIB_SKIP or part.startswith(("config-", "__pycache__")) for part in rel.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue  # a test fixture or a file in another encoding: not a stub source
        if not methods:
            out.update(dict.fromkeys(_stubs(tree.body)))
            continue
        for cls in tree.body:
            if isinstance(cls, ast.ClassDef) and not cls.name.startswith("_"):
                out.update(dict.fromkeys(f"class {cls.name}:\n" + stub for stub in _stubs(cls.body, "    ")))
    return list(out)


def _pool(data_dir: Path, source: PromptSource) -> list[str]:
    if source.name in ("stdlib_function", "stdlib_method"):
        return stdlib_stubs(methods=source.name == "stdlib_method")
    path = Path(data_dir) / str(source.file)
    if source.name in ("gsm8k_train", "gsm8k_stub"):
        questions = [r["question"] for r in read_jsonl(path)]
        return questions if source.name == "gsm8k_train" else [gsm8k_stub(q) for q in questions]
    if source.name in ("mbpp_train", "mbpp_stub", "mbpp_doctest"):
        rows = [r for r in read_jsonl(path) if 511 <= int(r["task_id"]) <= 974]  # never MBPP test (11-510)
        if source.name == "mbpp_train":
            return [mbpp_prompt(r) for r in rows]
        stubs = (mbpp_stub(r, every_test=source.name == "mbpp_doctest") for r in rows)
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
        texts = list(self_chat) if name == "self_chat" else _pool(data_dir, PROMPT_SOURCES[name])
        if count > len(texts):
            raise ValueError(f"prompt source {name} holds {len(texts)} prompts, fewer than the {count} asked for")
        rng.shuffle(texts)
        out += [(name, t) for t in texts[:count]]
    rng.shuffle(out)
    return out


def answered_prompts(data_dir: Path, skip: Path | None = None) -> set[tuple[int, ...]]:
    """Prompt token ids of every sequence already generated under data_dir (all data runs
    but the folder `skip`): a new data run drops them instead of generating them again
    (greedy continuations are deterministic, so a repeat adds no data)."""
    seen: set[tuple[int, ...]] = set()
    for path in sorted(Path(data_dir).rglob("shard_*.pt")):
        if skip is not None and path.parent == Path(skip):
            continue
        for rec in torch.load(path, mmap=True, weights_only=True):  # mmap: the taps are never read
            seen.add(tuple(rec["ids"][: rec["prompt_len"]].tolist()))
    return seen


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


# ---------------------------------------------------------------- target data


def chat_ids(tokenizer: Any, prompt: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.inference_mode()
def generate_shard(
    model: Any,  # HF causal LM (frozen target)
    prompt_ids: Sequence[list[int]],
    layer_ids: Sequence[int],
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
) -> list[dict[str, torch.Tensor]]:
    """Batched greedy continuation + taps of every token but the last.

    Returns per sequence {"ids": [T] int32, "prompt_len": int, "taps": [T-1, F] fp16},
    with the response cut after the first EOS (EOS kept as a label).
    """
    batch = len(prompt_ids)
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attn = torch.zeros((batch, width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):  # left padding
        ids[i, width - len(p) :] = torch.tensor(p)
        attn[i, width - len(p) :] = 1
    out = model.generate(
        input_ids=ids.to(model.device),
        attention_mask=attn.to(model.device),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        output_hidden_states=True,
        return_dict_in_generate=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
    )
    # hidden_states[step][layer+1]: [B, width, H] at step 0, [B, 1, H] after
    taps = torch.cat(
        [torch.cat([step[i + 1] for i in layer_ids], dim=-1) for step in out.hidden_states], dim=1
    )  # [B, width + steps - 1, F]
    gen = out.sequences[:, width:].cpu()  # [B, steps]
    records = []
    for b, p in enumerate(prompt_ids):
        resp = gen[b].tolist()
        if eos_id in resp:
            resp = resp[: resp.index(eos_id) + 1]
        seq = list(p) + resp
        lo = width - len(p)
        records.append(
            {
                "ids": torch.tensor(seq, dtype=torch.int32),
                "prompt_len": len(p),
                "taps": taps[b, lo : lo + len(seq) - 1].to("cpu", torch.float16).clone(),
            }
        )
    return records


def build_dataset(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[tuple[str, str]],
    layer_ids: Sequence[int],
    out_dir: Path,
    batch_size: int,
    max_new_tokens: int,
    budget_s: float,
) -> dict[str, Any]:
    """Write shards `shard_#####.pt` + `meta.json` under out_dir until prompts or time run out.

    Prompts are sorted by length inside each batch-sized window so that left padding
    stays short; the window order keeps the shuffled source mix. Resumable: a shard
    already on disk for a window (from an earlier, time-boxed run with the same prompts)
    is checked against that window's prompts and kept, so a rerun continues the dataset;
    `budget_s` bounds the new generation only.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    done, tokens, used = 0, 0, {}
    before = out_dir / "meta.json"
    earlier_s = json.loads(before.read_text())["seconds"] if before.is_file() else 0.0
    eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id
    encoded = [(name, chat_ids(tokenizer, p)) for name, p in prompts]
    batches = [encoded[i : i + batch_size] for i in range(0, len(encoded), batch_size)]
    bar = tqdm(batches, desc="target greedy data", unit="batch")
    generating = 0.0
    for k, chunk in enumerate(bar):
        path = out_dir / f"shard_{k:05d}.pt"
        if path.is_file():
            recs = torch.load(path, weights_only=True)
            if [r["ids"][: r["prompt_len"]].tolist() for r in recs] != [ids for _, ids in chunk]:
                raise ValueError(f"{path} holds other prompts than this run's window {k} (other pools, seed or "
                                 f"batch size); use another --work folder or delete the old shards")
        elif generating > budget_s:
            break
        else:
            mark = time.monotonic()
            recs = generate_shard(model, [ids for _, ids in chunk], layer_ids, max_new_tokens, eos, pad)
            for rec, (name, _) in zip(recs, chunk):
                rec["source"] = name
            torch.save(recs, path)
            generating += time.monotonic() - mark
        for rec in recs:
            used[rec["source"]] = used.get(rec["source"], 0) + 1
        done += len(recs)
        tokens += sum(len(r["ids"]) - r["prompt_len"] for r in recs)
        bar.set_postfix(seqs=done, resp_tokens=tokens)
    meta = {
        "sequences": done,
        "response_tokens": tokens,
        "sources": used,
        "licences": {name: PROMPT_SOURCES[name].licence for name in used if name in PROMPT_SOURCES},
        "layer_ids": list(layer_ids),
        "max_new_tokens": max_new_tokens,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),  # of the decoding target
        "seconds": round(earlier_s + generating, 1),  # generation time over all runs
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


# ---------------------------------------------------------------- reading shards


def shard_paths(data_dir: Path) -> list[Path]:
    """Every shard under data_dir (recursively: one folder per `data` run)."""
    paths = sorted(Path(data_dir).rglob("shard_*.pt"))
    if not paths:
        raise ValueError(f"no shard_*.pt training shards under {data_dir}; build the dataset first")
    return paths


def stored_layer_ids(data_dir: Path) -> list[int]:
    """The tapped layers of a dataset; every run under data_dir must agree."""
    metas = sorted(Path(data_dir).rglob("meta.json"))
    found = {tuple(json.loads(m.read_text())["layer_ids"]) for m in metas}
    if len(found) != 1:
        raise ValueError(f"datasets under {data_dir} disagree on tapped layers ({sorted(found)}) or have no meta.json")
    return list(found.pop())


def tap_columns(stored_ids: Sequence[int], wanted_ids: Sequence[int], hidden: int) -> torch.Tensor:
    """Column indices of the `wanted_ids` taps inside a row of `stored_ids` taps."""
    missing = [i for i in wanted_ids if i not in stored_ids]
    if missing:
        raise ValueError(f"the dataset holds taps of layers {list(stored_ids)}, not {missing}; rebuild it with them")
    return torch.cat([torch.arange(hidden) + list(stored_ids).index(i) * hidden for i in wanted_ids])


def split_shards(data_dir: Path, validation_shards: int) -> tuple[list[Path], list[Path]]:
    """(training, validation) shard paths: the last `validation_shards` shards of every
    run folder are held out for validation (training-pool prompts the head never sees)."""
    train, val = [], []
    for run in sorted({p.parent for p in shard_paths(data_dir)}):
        paths = sorted(run.glob("shard_*.pt"))
        if len(paths) <= validation_shards:
            raise ValueError(f"{run} holds {len(paths)} shards; keep at least one for training")
        cut = len(paths) - validation_shards
        train += paths[:cut]
        val += paths[cut:]
    return train, val


def load_records(paths: Sequence[Path], stored_ids: Sequence[int], wanted_ids: Sequence[int], hidden: int
                 ) -> list[dict[str, Any]]:
    """All records of some (small) shards in memory, taps cut to `wanted_ids`."""
    cols = tap_columns(stored_ids, wanted_ids, hidden)
    return [{**r, "taps": r["taps"][:, cols].contiguous()} for path in paths for r in torch.load(path)]


def stream_records(
    paths: Sequence[Path], stored_ids: Sequence[int], wanted_ids: Sequence[int], hidden: int, seed: int,
    shards_in_memory: int = 8,
) -> Iterator[dict[str, Any]]:
    """Endless shuffled records, read from disk `shards_in_memory` shards at a time.

    Each epoch reshuffles the shard order and the records inside each group, so memory
    stays bounded by the group, not the dataset.
    """
    if not paths:
        raise ValueError("no training shards to stream")
    cols, rng = tap_columns(stored_ids, wanted_ids, hidden), random.Random(seed)
    while True:
        order = list(paths)
        rng.shuffle(order)
        for g in range(0, len(order), shards_in_memory):
            group = [r for p in order[g : g + shards_in_memory] for r in torch.load(p)]
            rng.shuffle(group)
            for r in group:
                yield {**r, "taps": r["taps"][:, cols].contiguous()}
