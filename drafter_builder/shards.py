"""Training data of a DFlash head: the target's own greedy continuations and taps, in shards.

Responses are the target's greedy continuations (chat template applied) of the training
prompts (`drafter_builder.prompts`), so the head learns the target's greedy law; one
batched `generate` yields the drafter taps (HF `hidden_states[id+1]` for each tapped
layer) on the way, with no second pass. Shards of fp16 taps (`shard_#####.pt`, one folder
per data run, `meta.json` beside them) are written to disk and streamed back in training.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from tqdm import tqdm

from drafter_builder.prompts import PROMPT_SOURCES
from runtime.loader import encode_prompt

# ---------------------------------------------------------------- target data


@torch.inference_mode()
def generate_shard(model: Any, prompt_ids: Sequence[list[int]], layer_ids: Sequence[int], max_new_tokens: int,
                   eos_id: int, pad_id: int) -> list[dict[str, torch.Tensor]]:
    """Batched greedy continuation (`model`: the frozen HF target) + taps of every token but the last.

    Returns per sequence {"ids": [T] int32, "prompt_len": int, "taps": [T-1, F] fp16},
    with the response cut after the first EOS (EOS kept as a label).
    """
    batch, width = len(prompt_ids), max(len(p) for p in prompt_ids)
    ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attn = torch.zeros((batch, width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):  # left padding
        ids[i, width - len(p) :] = torch.tensor(p)
        attn[i, width - len(p) :] = 1
    out = model.generate(input_ids=ids.to(model.device), attention_mask=attn.to(model.device),
                         max_new_tokens=max_new_tokens, do_sample=False, output_hidden_states=True,
                         return_dict_in_generate=True, pad_token_id=pad_id, eos_token_id=eos_id)
    # hidden_states[step][layer+1]: [B, width, H] at step 0, [B, 1, H] after
    taps = torch.cat([torch.cat([step[i + 1] for i in layer_ids], dim=-1) for step in out.hidden_states],
                     dim=1)  # [B, width + steps - 1, F]
    gen = out.sequences[:, width:].cpu()  # [B, steps]
    records = []
    for b, p in enumerate(prompt_ids):
        resp = gen[b].tolist()
        if eos_id in resp:
            resp = resp[: resp.index(eos_id) + 1]
        seq, lo = list(p) + resp, width - len(p)
        records.append({"ids": torch.tensor(seq, dtype=torch.int32), "prompt_len": len(p),
                        "taps": taps[b, lo : lo + len(seq) - 1].to("cpu", torch.float16).clone()})
    return records


def build_dataset(model: Any, tokenizer: Any, prompts: Sequence[tuple[str, str]], layer_ids: Sequence[int],
                  out_dir: Path, batch_size: int, max_new_tokens: int, budget_s: float) -> dict[str, Any]:
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
    encoded = [(name, encode_prompt(tokenizer, p, chat=True)) for name, p in prompts]
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
    meta = {"sequences": done, "response_tokens": tokens, "sources": used,
            "licences": {name: PROMPT_SOURCES[name].licence for name in used if name in PROMPT_SOURCES},
            "layer_ids": list(layer_ids), "max_new_tokens": max_new_tokens,
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),  # of the decoding target
            "seconds": round(earlier_s + generating, 1)}  # generation time over all runs
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


# ---------------------------------------------------------------- reading shards


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


def stream_records(paths: Sequence[Path], stored_ids: Sequence[int], wanted_ids: Sequence[int], hidden: int,
                   seed: int, shards_in_memory: int = 8) -> Iterator[dict[str, Any]]:
    """Endless shuffled records, read from disk `shards_in_memory` shards at a time.

    Each epoch reshuffles the shard order and the records inside each group, so memory
    stays bounded by the group, not the dataset (`split_shards` leaves every run a training shard).
    """
    cols, rng = tap_columns(stored_ids, wanted_ids, hidden), random.Random(seed)
    while True:
        order = list(paths)
        rng.shuffle(order)
        for g in range(0, len(order), shards_in_memory):
            group = [r for p in order[g : g + shards_in_memory] for r in torch.load(p)]
            rng.shuffle(group)
            for r in group:
                yield {**r, "taps": r["taps"][:, cols].contiguous()}
