"""Train a DFlash drafter head on the target's own greedy continuations.

Data: `drafter_builder.shards` (target greedy continuations + taps, fp16 shards). Each
step samples blocks of a few sequences (`drafter_builder.blocks`), runs them through the
head in one pass, and steps AdamW on the position-decayed block loss (also `blocks`;
optional distillation, `kd_weight`). Target embeddings and lm_head stay frozen. Optional bf16 autocast.

Checkpoints: `TrainerState` (optimizer, step, elapsed wall time, generator state) is
saved beside the weights, so a run resumes where it stopped and its cosine schedule
(over the total time box) continues.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import torch
from tqdm import tqdm

from drafter_builder.blocks import (FrozenTarget, block_hidden, block_labels, block_loss, final_tap_columns,
                                    sample_anchors, soft_block_loss, target_block_logprobs, to_draft_labels)
from drafter_builder.replay import score_anchors
from runtime.drafter.vocab import DraftHead, target_to_draft

# ---------------------------------------------------------------- loop


@dataclass(frozen=True, slots=True)
class TrainConfig:
    budget_s: float  # wall-clock time box of the whole training (all resumed runs together)
    anchors_per_seq: int = 16  # blocks per sequence per step
    seqs_per_step: int = 1
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine (over elapsed time) ends at lr * min_lr_ratio
    warmup_steps: int = 30
    rewarm_steps: int = 0  # a resumed run ramps its learning rate up linearly over so many steps (0: jumps straight back)
    schedule_start_s: float = 0.0  # the cosine runs from this many trained seconds to budget_s (> 0: a restarted schedule)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    decay_gamma: float = 7.0  # DFlash position decay: slot k of a block weighs exp(-(k-1)/gamma) in the loss
    kd_weight: float = 0.0  # share of the loss on the target's soft law (0 = hard greedy labels only)
    autocast_bf16: bool = False  # bf16 matmuls (weights and optimizer stay fp32)
    save_every_s: float = 180.0
    eval_every_s: float = 300.0  # validation tau period (when an evaluator is given)
    max_steps: int | None = None
    segment_s: float | None = None  # stop THIS run after so many seconds (resume later); None = the time box
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rewarm_steps < 0:
            raise ValueError(f"rewarm_steps must be >= 0, got {self.rewarm_steps}")
        if self.budget_s <= 0 or self.anchors_per_seq < 1 or self.seqs_per_step < 1 or self.lr <= 0:
            raise ValueError("budget_s, anchors_per_seq, seqs_per_step and lr must be positive")
        if not 0.0 <= self.schedule_start_s < self.budget_s:
            raise ValueError(f"schedule_start_s must lie in [0, budget_s={self.budget_s}), got {self.schedule_start_s}")
        if not 0.0 <= self.kd_weight <= 1.0:
            raise ValueError(f"kd_weight is a share of the loss in [0, 1], got {self.kd_weight}")
        if self.segment_s is not None and self.segment_s <= 0:
            raise ValueError(f"segment_s must be positive (or None for the whole time box), got {self.segment_s}")


@dataclass(slots=True)
class TrainerState:
    """What a resumed run needs besides the weights."""

    step: int = 0
    elapsed_s: float = 0.0
    optimizer: dict | None = None
    generator: torch.Tensor | None = None
    log: list[dict[str, float]] = field(default_factory=list)  # per-step loss
    evals: list[dict[str, Any]] = field(default_factory=list)  # validation tau over time
    runs: list[dict[str, Any]] = field(default_factory=list)  # one entry per (resumed) run: where it began, its settings

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}


def _lr_at(cfg: TrainConfig, step: int, elapsed: float, run_start_step: int = 0) -> float:
    """Linear warm-up, then a cosine over the elapsed share of the whole time box. A resumed
    run (run_start_step > 0) picks the cosine up where the longer box puts it, ramping up
    to it over `rewarm_steps` instead of jumping there (a wider box raises the rate). With
    `schedule_start_s` the cosine starts again (at cfg.lr) at that many trained seconds."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = min(1.0, max(0.0, elapsed - cfg.schedule_start_s) / (cfg.budget_s - cfg.schedule_start_s))
    lr = cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))
    into_run = step - run_start_step
    if run_start_step > 0 and into_run < cfg.rewarm_steps:
        lr *= (into_run + 1) / cfg.rewarm_steps
    return lr


@torch.enable_grad()  # callers may run under no_grad (e.g. a serving process)
def train(drafter: Any, target: FrozenTarget, records: Iterator[dict[str, Any]], cfg: TrainConfig,
          on_save: Callable[[TrainerState], None] | None = None,
          evaluate: Callable[[Any], dict[str, Any]] | None = None, state: TrainerState | None = None, *,
          num_target_layers: int | None = None, run_info: dict[str, Any] | None = None) -> TrainerState:
    """Train `drafter` in place until the time box or max_steps; returns the final state.

    records: endless (e.g. `shards.stream_records`), streamed from the CPU and moved per step to
    where the target's weights are (`target.lm_head_weight.device`; the drafter must be there
    too); evaluate: drafter -> {"tau": ...}; num_target_layers: needed when cfg.kd_weight > 0
    (locates the final-layer tap); run_info: recorded with this run in state.runs (e.g. its data)."""
    state = state or TrainerState()
    state.runs.append({"step": state.step, "seconds": round(state.elapsed_s, 1), **(run_info or {}),
                       "train_config": {k: getattr(cfg, k) for k in cfg.__slots__}})
    run, run_start_step = len(state.runs) - 1, state.step
    gen = torch.Generator().manual_seed(cfg.seed)
    if state.generator is not None:
        gen.set_state(state.generator)
    rotary = drafter.config.rotary()
    head = DraftHead(target.lm_head_weight, drafter.d2t)
    t2d = None if drafter.d2t is None else target_to_draft(head.target_ids, head.vocab_size)
    device = target.lm_head_weight.device
    weights = torch.exp(-torch.arange(drafter.config.num_draft_positions, device=device) / cfg.decay_gamma)  # [L]
    if cfg.kd_weight > 0 and num_target_layers is None:
        raise ValueError("kd_weight > 0 needs num_target_layers (to find the final-layer tap)")
    final = final_tap_columns(drafter, num_target_layers) if cfg.kd_weight > 0 else None
    drafter.train().requires_grad_(True)
    params = [p for p in drafter.parameters() if p.is_floating_point()]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    if state.optimizer is not None:
        opt.load_state_dict(state.optimizer)
    start = time.monotonic() - state.elapsed_s
    segment_end = math.inf if cfg.segment_s is None else time.monotonic() + cfg.segment_s
    step_cap = math.inf if cfg.max_steps is None else cfg.max_steps
    last_save = last_eval = time.monotonic()
    bar = tqdm(total=int(cfg.budget_s), initial=int(state.elapsed_s), desc="drafter training", unit="s")

    def snapshot() -> None:
        state.elapsed_s = time.monotonic() - start
        state.optimizer, state.generator = opt.state_dict(), gen.get_state()

    def run_eval() -> None:
        drafter.eval()
        res = evaluate(drafter)
        drafter.train()
        state.evals.append({"step": state.step, "seconds": round(time.monotonic() - start, 1), "run": run, **res})
        bar.write(f"step {state.step}: validation tau {res['tau']:.3f}")

    if evaluate is not None:  # every run starts with one: a resumed run may validate on other shards
        run_eval()
    while True:
        elapsed = time.monotonic() - start
        if elapsed >= cfg.budget_s or state.step >= step_cap or time.monotonic() >= segment_end:
            break
        for group in opt.param_groups:
            group["lr"] = _lr_at(cfg, state.step, elapsed, run_start_step)
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(cfg.seqs_per_step):
            rec = next(records)
            ids, taps = rec["ids"].to(device), rec["taps"].to(device).float()
            anchors = sample_anchors(rec["prompt_len"], ids.numel(), cfg.anchors_per_seq, gen).to(device)
            if anchors.numel() == 0:
                continue
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.autocast_bf16):
                logits = head.draft_logits(block_hidden(drafter, target.embed_weight, rotary, taps, ids, anchors))
            labels = to_draft_labels(block_labels(ids, anchors, logits.shape[1]), t2d)
            loss = block_loss(logits, labels, weights)
            if final is not None:
                target_logp, valid = target_block_logprobs(taps[:, final], head, anchors, logits.shape[1])
                soft = soft_block_loss(logits, target_logp, valid, weights)
                loss = (1 - cfg.kd_weight) * loss + cfg.kd_weight * soft
            loss = loss / cfg.seqs_per_step
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        state.step += 1
        state.log.append({"step": state.step, "seconds": round(time.monotonic() - start, 1), "loss": total})
        bar.update(int(state.log[-1]["seconds"]) - bar.n)
        recent = [e["loss"] for e in state.log[-50:]]
        bar.set_postfix(step=state.step, loss=f"{sum(recent) / len(recent):.3f}")
        if evaluate is not None and time.monotonic() - last_eval >= cfg.eval_every_s:
            run_eval()
            last_eval = time.monotonic()
        if on_save is not None and time.monotonic() - last_save >= cfg.save_every_s:
            snapshot()
            on_save(state)
            last_save = time.monotonic()
    bar.close()
    if evaluate is not None:
        run_eval()
    drafter.eval().requires_grad_(False)
    snapshot()
    if on_save is not None:
        on_save(state)
    return state


# ---------------------------------------------------------------- acceptance


def acceptance(drafter: Any, target: FrozenTarget, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Top-1 acceptance per block position over every anchor with a full block of labels.

    top1[k]: P(argmax q_k == target greedy token k); chain[k]: P(slots 1..k all match);
    tau: mean accepted chain length per anchor (teacher-forced, every response position).
    """
    num_draft, hits = drafter.config.num_draft_positions, []
    for rec in records:
        full = rec["ids"].numel() - num_draft - rec["prompt_len"]  # anchors with a full block of labels
        if full <= 0:
            continue  # a response shorter than a block (an early EOS) has no such anchor
        s = score_anchors(drafter, target, rec, rank_cap=1)
        labels = np.lib.stride_tricks.sliding_window_view(s.ids[s.prompt_len + 1 :], num_draft)[:full]  # [A, L]
        hits.append(torch.from_numpy(s.topk_ids[:full, :, 0] == labels))
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
