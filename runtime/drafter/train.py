"""Train a DFlash drafter head on the target's own greedy continuations.

Data (paper App. E / DFlash recipe): prompts wrapped in the target's chat template;
responses are the target's greedy continuations, so the head learns the target's
greedy law. One target pass per sequence yields its drafter taps (HF
`hidden_states[id+1]` for each target layer id), cached to disk as fp16 shards.

Training: anchors a are sampled in the response; each block is
`[ids[a], mask, …, mask]` (block size L+1) and sees the taps of ids[:a] only (the
prefix before the root: the drafter never sees the future); labels are ids[a+1:a+L+1].
Many blocks of one sequence share one context pass (each block masks the context at
its own anchor). Loss: cross-entropy at slots 1..L with DFlash's position decay
weight exp(-(k-1)/gamma) on slot k. Target embeddings, final norm and lm_head stay
frozen.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from torch.nn import functional as F

from runtime.model.layers import Rotary, apply_rope, default_inv_freq
from tqdm import tqdm

IGNORE = -100  # label of a slot past the end of the response

# ---------------------------------------------------------------- prompts


@dataclass(frozen=True, slots=True)
class PromptSource:
    """A prompt pool that may be used for a shipped head (permissive licence)."""

    name: str
    file: str
    licence: str


PERMISSIVE_SOURCES = {
    "gsm8k_train": PromptSource("gsm8k_train", "gsm8k_train.jsonl", "MIT (openai/grade-school-math)"),
    "mbpp_train": PromptSource("mbpp_train", "mbpp.jsonl", "CC-BY-4.0 (google-research/mbpp), task_id 511-974"),
}


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def mbpp_prompt(row: dict[str, Any]) -> str:
    return row["text"] + " Your code should pass these tests:\n\n" + "\n".join(row["test_list"])


def load_prompts(data_dir: Path, counts: dict[str, int], seed: int) -> list[tuple[str, str]]:
    """(source name, user prompt) pairs from the permissive pools, shuffled with `seed`.

    counts: source name -> how many prompts to draw (capped at the pool size).
    """
    unknown = set(counts) - set(PERMISSIVE_SOURCES)
    if unknown:
        raise ValueError(f"unknown or non-permissive prompt sources {sorted(unknown)}; use {sorted(PERMISSIVE_SOURCES)}")
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    for name, count in counts.items():
        rows = _read_jsonl(Path(data_dir) / PERMISSIVE_SOURCES[name].file)
        if name == "gsm8k_train":
            texts = [r["question"] for r in rows]
        else:
            texts = [mbpp_prompt(r) for r in rows if 511 <= int(r["task_id"]) <= 974]
        rng.shuffle(texts)
        out += [(name, t) for t in texts[:count]]
    rng.shuffle(out)
    return out


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
        input_ids=ids,
        attention_mask=attn,
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
    gen = out.sequences[:, width:]  # [B, steps]
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
                "taps": taps[b, lo : lo + len(seq) - 1].to(torch.float16).clone(),
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
    """Write shards `shard_#####.pt` under out_dir until prompts or time run out."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    start, done, tokens, used = time.monotonic(), 0, 0, {}
    eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id
    batches = [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]
    bar = tqdm(batches, desc="target greedy data", unit="batch")
    for k, chunk in enumerate(bar):
        if time.monotonic() - start > budget_s:
            break
        recs = generate_shard(model, [chat_ids(tokenizer, p) for _, p in chunk], layer_ids, max_new_tokens, eos, pad)
        torch.save(recs, out_dir / f"shard_{k:05d}.pt")
        done += len(recs)
        tokens += sum(len(r["ids"]) - r["prompt_len"] for r in recs)
        for name, _ in chunk:
            used[name] = used.get(name, 0) + 1
        bar.set_postfix(seqs=done, resp_tokens=tokens)
    meta = {
        "sequences": done,
        "response_tokens": tokens,
        "sources": used,
        "layer_ids": list(layer_ids),
        "max_new_tokens": max_new_tokens,
        "seconds": round(time.monotonic() - start, 1),
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def load_shards(data_dir: Path) -> list[dict[str, torch.Tensor]]:
    recs: list[dict[str, torch.Tensor]] = []
    for path in sorted(Path(data_dir).glob("shard_*.pt")):
        recs += torch.load(path)
    if not recs:
        raise ValueError(f"no shard_*.pt training shards under {data_dir}; build the dataset first")
    return recs


# ---------------------------------------------------------------- blocks and loss


def sample_anchors(prompt_len: int, length: int, count: int, gen: torch.Generator) -> torch.Tensor:
    """[n] sorted anchor positions a in [prompt_len, length-2] (each has >= 1 label)."""
    lo, hi = prompt_len, length - 2
    if hi < lo:
        return torch.empty(0, dtype=torch.long)
    pick = torch.randperm(hi - lo + 1, generator=gen)[:count] + lo
    return pick.sort().values


def block_labels(ids: torch.Tensor, anchors: torch.Tensor, num_draft: int) -> torch.Tensor:
    """[n, L] labels ids[a+1..a+L]; IGNORE past the end of the sequence."""
    idx = anchors[:, None] + torch.arange(1, num_draft + 1)[None, :]  # [n, L]
    labels = torch.full(idx.shape, IGNORE, dtype=torch.long)
    ok = idx < ids.numel()
    labels[ok] = ids.long()[idx[ok]]
    return labels


def block_logits(
    drafter: Any,  # runtime.drafter.DFlashDrafter (trainable)
    embed_weight: torch.Tensor,  # [V, H] frozen target embeddings
    lm_head_weight: torch.Tensor,  # [V, H] frozen target lm_head
    rotary: Any,  # runtime.model.layers.Rotary of the drafter
    taps: torch.Tensor,  # [m, F] target taps of ids[:m]
    ids: torch.Tensor,  # [T] token ids of the sequence
    anchors: torch.Tensor,  # [n] root positions, each <= m
) -> torch.Tensor:
    """Logits [n, L, V] of n blocks of one sequence in one pass.

    Equals `DFlashDrafter.forward` run once per block on a feature cache holding
    taps[:a] (block j sees context columns < a_j and its own L+1 slots only).
    """
    cfg = drafter.config
    n, width, m = anchors.numel(), cfg.block_size, taps.shape[0]
    block_ids = torch.full((n, width), cfg.mask_token_id, dtype=torch.long)
    block_ids[:, 0] = ids.long()[anchors]
    h = F.embedding(block_ids, embed_weight).reshape(n * width, -1)  # [n*(L+1), H]
    pos = (anchors[:, None] + torch.arange(width)[None, :]).reshape(-1)  # [n*(L+1)]
    block_rope = rotary(pos, h.dtype)
    ctx = drafter.hidden_norm(drafter.fc(taps))  # [m, H]
    ctx_rope = rotary(torch.arange(m), h.dtype)
    owner = torch.arange(n).repeat_interleave(width)  # block of each query row
    visible = torch.cat(
        [
            torch.arange(m)[None, :] < anchors[owner][:, None],  # context before the root
            owner[:, None] == owner[None, :],  # own block, non-causal
        ],
        dim=1,
    )  # [n*(L+1), m + n*(L+1)]
    for layer in drafter.layers:
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = attn.q_norm(attn.q_proj(x).view(-1, attn.num_heads, attn.head_dim))
        q = apply_rope(q.transpose(0, 1), *block_rope)  # [Hq, Nq, d]
        ck, cv = attn.key_value(ctx, ctx_rope)  # [Hkv, m, d]
        bk, bv = attn.key_value(x, block_rope)  # [Hkv, Nq, d]
        out = F.scaled_dot_product_attention(
            q[None], torch.cat([ck, bk], 1)[None], torch.cat([cv, bv], 1)[None], attn_mask=visible, enable_gqa=True
        )[0]
        h = h + attn.o_proj(out.transpose(0, 1).reshape(h.shape[0], -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    hidden = drafter.norm(h.view(n, width, -1)[:, 1:])  # [n, L, H]
    return hidden @ lm_head_weight.T  # [n, L, V]


def position_weights(num_draft: int, gamma: float | None) -> torch.Tensor:
    """[L] DFlash loss weight of slot k: exp(-(k-1)/gamma); uniform when gamma is None."""
    k = torch.arange(num_draft, dtype=torch.float32)
    return torch.ones(num_draft) if gamma is None else torch.exp(-k / gamma)


def block_loss(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted mean cross-entropy. logits [n, L, V]; labels [n, L]; weights [L]."""
    ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="none")
    w = (weights[None, :] * (labels != IGNORE)).flatten()
    return (ce * w).sum() / w.sum().clamp_min(1e-9)


# ---------------------------------------------------------------- loop


@dataclass(frozen=True, slots=True)
class TrainConfig:
    budget_s: float  # wall-clock time box of the loop
    anchors_per_seq: int = 16  # blocks per sequence per step
    seqs_per_step: int = 1
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine (over elapsed time) ends at lr * min_lr_ratio
    warmup_steps: int = 30
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    decay_gamma: float | None = 7.0  # DFlash position decay; None = uniform
    save_every_s: float = 180.0
    max_steps: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.budget_s <= 0 or self.anchors_per_seq < 1 or self.seqs_per_step < 1 or self.lr <= 0:
            raise ValueError("budget_s, anchors_per_seq, seqs_per_step and lr must be positive")


@dataclass(frozen=True, slots=True)
class FrozenTarget:
    """The pieces of the target the drafter borrows (never trained)."""

    embed_weight: torch.Tensor  # [V, H]
    lm_head_weight: torch.Tensor  # [V, H]

    @staticmethod
    def from_hf(model: Any) -> "FrozenTarget":
        return FrozenTarget(
            model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
        )


def select_taps(records: list[dict[str, Any]], stored_ids: Sequence[int], wanted_ids: Sequence[int]) -> list[dict[str, Any]]:
    """Keep only the tap columns of `wanted_ids` (shards may hold more layers)."""
    missing = [i for i in wanted_ids if i not in stored_ids]
    if missing:
        raise ValueError(f"the dataset holds taps of layers {list(stored_ids)}, not {missing}; rebuild it with them")
    hidden = records[0]["taps"].shape[1] // len(stored_ids)
    cols = torch.cat([torch.arange(hidden) + stored_ids.index(i) * hidden for i in wanted_ids])
    return [{**r, "taps": r["taps"][:, cols].contiguous()} for r in records]


def drafter_rotary(drafter: Any) -> Rotary:
    cfg = drafter.config
    return Rotary(default_inv_freq(cfg.head_dim, cfg.rope_theta))


def _lr_at(cfg: TrainConfig, step: int, elapsed: float) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = min(1.0, elapsed / cfg.budget_s)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


@torch.enable_grad()  # callers may run under no_grad (e.g. a serving process)
def train(
    drafter: Any,
    target: FrozenTarget,
    records: list[dict[str, Any]],
    cfg: TrainConfig,
    on_save: Callable[[int, list[dict[str, float]]], None] | None = None,
) -> list[dict[str, float]]:
    """Train `drafter` in place until the time box or max_steps; returns the loss log."""
    gen = torch.Generator().manual_seed(cfg.seed)
    rotary = drafter_rotary(drafter)
    weights = position_weights(drafter.config.num_draft_positions, cfg.decay_gamma)
    drafter.train().requires_grad_(True)
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    log: list[dict[str, float]] = []
    start = last_save = time.monotonic()
    step, order = 0, iter(())
    bar = tqdm(total=int(cfg.budget_s), desc="drafter training", unit="s")

    def next_record() -> dict[str, Any]:
        nonlocal order
        try:
            return next(order)
        except StopIteration:
            order = iter([records[i] for i in torch.randperm(len(records), generator=gen).tolist()])
            return next(order)

    while True:
        elapsed = time.monotonic() - start
        if elapsed >= cfg.budget_s or (cfg.max_steps is not None and step >= cfg.max_steps):
            break
        for group in opt.param_groups:
            group["lr"] = _lr_at(cfg, step, elapsed)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(cfg.seqs_per_step):
            rec = next_record()
            ids, taps = rec["ids"], rec["taps"].float()
            anchors = sample_anchors(rec["prompt_len"], ids.numel(), cfg.anchors_per_seq, gen)
            if anchors.numel() == 0:
                continue
            logits = block_logits(drafter, target.embed_weight, target.lm_head_weight, rotary, taps, ids, anchors)
            loss = block_loss(logits, block_labels(ids, anchors, logits.shape[1]), weights) / cfg.seqs_per_step
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        log.append({"step": step, "seconds": round(time.monotonic() - start, 1), "loss": total})
        bar.update(int(log[-1]["seconds"]) - bar.n)
        recent = [e["loss"] for e in log[-50:]]
        bar.set_postfix(step=step, loss=f"{sum(recent) / len(recent):.3f}")
        if on_save is not None and time.monotonic() - last_save >= cfg.save_every_s:
            on_save(step, log)
            last_save = time.monotonic()
    bar.close()
    drafter.eval().requires_grad_(False)
    if on_save is not None:
        on_save(step, log)
    return log


# ---------------------------------------------------------------- acceptance


@torch.no_grad()
def acceptance(drafter: Any, target: FrozenTarget, records: list[dict[str, Any]], chunk: int = 32) -> dict[str, Any]:
    """Top-1 acceptance per block position over every anchor with a full block of labels.

    top1[k]: P(argmax q_k == target greedy token k); chain[k]: P(slots 1..k all match);
    tau: mean accepted chain length per round (the mean committed length R is tau + 1).
    """
    rotary = drafter_rotary(drafter)
    num_draft = drafter.config.num_draft_positions
    hits = []
    for rec in records:
        ids, taps = rec["ids"], rec["taps"].float()
        all_anchors = torch.arange(rec["prompt_len"], ids.numel() - num_draft)
        for part in all_anchors.split(chunk):
            logits = block_logits(drafter, target.embed_weight, target.lm_head_weight, rotary, taps, ids, part)
            hits.append(logits.argmax(-1) == block_labels(ids, part, num_draft))  # [n, L]
    if not hits:
        raise ValueError("no held-out anchor has a full block of labels; use longer continuations")
    hit = torch.cat(hits).float()
    chain = hit.cumprod(dim=1)
    return {
        "anchors": hit.shape[0],
        "top1": [round(v, 4) for v in hit.mean(0).tolist()],
        "chain": [round(v, 4) for v in chain.mean(0).tolist()],
        "tau": round(chain.sum(1).mean().item(), 4),
    }
