"""`train-drafter train`: DFlash block training on --work's shards; checkpoints, resumes, ships.

Writes the trainer state and an fp32 checkpoint under --work and the shipped fp16 head
(with its `training.json` record and a fitted mass calibration) to --out.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import click
import torch

from drafter_builder import shards as S
from drafter_builder import train as T
from drafter_builder.cli import common
from drafter_builder.cli.report import write_calibration
from drafter_builder.cli.common import LAYER_IDS, MASK_TOKEN_ID, SEED, THREADS, VAL_SHARDS, WORK
from runtime.drafter import DEFAULT_DRAFTER, load_drafter, random_drafter, save_drafter, with_draft_vocab, with_layers
from runtime.drafter import vocab as V

STATE_NAME = "trainer_state.pt"
INHERITED_NAME = "inherited_data.json"  # in the checkpoint: the data record an --init-from head brought along


def _draft_vocab(paths: list[Path], target_cfg, size: int, eos_ids: list[int]) -> tuple[torch.Tensor | None, dict]:
    """The `size` most frequent response tokens of the training shards (None: full vocab)."""
    if size == 0:
        return None, {}
    responses = [r["ids"][r["prompt_len"] :] for p in paths for r in torch.load(p)]
    ids = V.frequent_ids(responses, target_cfg.vocab_size, size, always=eos_ids)
    return ids, {"draft_vocab_size": size, "train_coverage": round(V.coverage(responses, ids, target_cfg.vocab_size), 5)}


@click.command("train")
@WORK
@SEED
@THREADS
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DRAFTER, show_default=True,
              help="Checkpoint folder written (the shipped head by default).")
@click.option("--block-size", type=int, default=16, show_default=True, help="Drafter block size L+1.")
@click.option("--num-layers", type=int, default=2, show_default=True, help="Drafter layers.")
@click.option("--intermediate-size", type=int, default=1024, show_default=True, help="Drafter MLP width.")
@click.option("--draft-layer-ids", default=",".join(map(str, LAYER_IDS)), show_default=True,
              help="Target layers the head reads.")
@click.option("--vocab-size", type=int, default=8192, show_default=True,
              help="Reduced draft vocabulary (most frequent response tokens); 0 = the full target vocabulary.")
@click.option("--train-minutes", type=float, default=50.0, show_default=True, help="Total time box (all resumed runs).")
@click.option("--max-steps", type=int, default=None, help="Stop after this many steps.")
@click.option("--stop-after-min", type=float, default=None,
              help="Stop this run after so many minutes (checkpointed; a later --resume continues the time box).")
@click.option("--anchors", type=int, default=16, show_default=True, help="Blocks sampled per sequence per step.")
@click.option("--seqs-per-step", type=int, default=4, show_default=True, help="Sequences per optimizer step.")
@click.option("--lr", type=float, default=1.5e-3, show_default=True, help="Peak AdamW learning rate (cosine over time).")
@click.option("--rewarm-steps", type=int, default=0, show_default=True,
              help="On resume: ramp the learning rate up to the schedule's value over so many steps.")
@click.option("--gamma", type=float, default=7.0, show_default=True, help="DFlash position-decay constant of the loss.")
@click.option("--kd-weight", type=float, default=0.0, show_default=True,
              help="Share of the loss on the target's soft next-token law (read from the final-layer tap); 0 = hard labels.")
@click.option("--bf16/--fp32", "bf16", default=True, show_default=True, help="bf16 autocast of the matmuls.")
@click.option("--eval-every-min", type=float, default=8.0, show_default=True, help="Validation tau period.")
@VAL_SHARDS
@click.option("--resume/--fresh", default=True, show_default=True, help="Continue from --work's trainer state.")
@click.option("--rebuild-vocab", is_flag=True,
              help="On resume: rebuild the draft vocabulary at --vocab-size from the current training shards "
                   "(data runs added since); the head keeps its weights.")
@common.DEVICE
@click.option("--init-from", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="Continue a shipped head (its weights, draft vocabulary and training.json record: steps, minutes, "
                   "runs) with a fresh optimizer, where its trainer state and shards are gone (a new machine). "
                   "The time box counts its recorded minutes; pair it with --rewarm-steps.")
@click.option("--grow-layers", type=int, default=None,
              help="With --init-from: grow the head to this many layers first (new layers draft nothing until "
                   "trained, so the head starts exactly as shipped); pair it with --schedule-from-min.")
@click.option("--schedule-from-min", type=float, default=0.0, show_default=True,
              help="Restart the cosine: it runs from --lr at this many trained minutes to --train-minutes (a "
                   "continued or grown head gets a whole schedule over its added minutes, not the old one's tail).")
def train(work: Path, seed: int, threads: int, out: Path, block_size: int, num_layers: int, intermediate_size: int,
          draft_layer_ids: str, vocab_size: int, train_minutes: float, max_steps: int | None,
          stop_after_min: float | None, anchors: int, seqs_per_step: int, lr: float, rewarm_steps: int, gamma: float,
          kd_weight: float, bf16: bool, eval_every_min: float, val_shards: int, resume: bool, rebuild_vocab: bool,
          device: str, init_from: Path | None, grow_layers: int | None, schedule_from_min: float) -> None:
    """Train the head on --work's shards; checkpoints and resumes."""
    ckpt, state_path = work / "checkpoint", work / STATE_NAME
    resuming = resume and state_path.is_file()
    if init_from is not None and resuming:
        raise click.UsageError(f"--init-from starts a new trainer state, but {state_path} exists: drop --init-from to "
                               "resume it, or pass --fresh / another --work")
    if rebuild_vocab and not ((resuming or init_from is not None) and vocab_size > 0):
        raise click.UsageError("--rebuild-vocab widens a resumed head's draft vocabulary: it needs --resume with a "
                               f"trainer state under {work} (or --init-from) and --vocab-size > 0")
    if grow_layers is not None and init_from is None:
        raise click.UsageError("--grow-layers grows a shipped head: pass --init-from (a new head takes --num-layers)")
    if not 0 <= schedule_from_min < train_minutes:
        raise click.UsageError(f"--schedule-from-min must lie in [0, --train-minutes={train_minutes}), "
                               f"got {schedule_from_min}")
    _, tok, frozen, target_cfg = common.load_target(threads, seed)
    layer_ids = [int(i) for i in draft_layer_ids.split(",")]
    train_paths, val_paths = S.split_shards(work / "train", val_shards)
    stored = S.stored_layer_ids(work / "train")
    meta = {p.parent.name: json.loads(p.read_text()) for p in sorted((work / "train").rglob("meta.json"))}
    record = json.loads((init_from / "training.json").read_text()) if init_from is not None else {}
    inherited_path = ckpt / INHERITED_NAME
    inherited = record.get("data", {}) if init_from is not None else (
        json.loads(inherited_path.read_text()) if resuming and inherited_path.is_file() else {})
    meta = {**inherited, **meta}  # a continued head, resumed or not, keeps the record of the data it was trained on
    sources = {k: v for run in meta.values() for k, v in run["licences"].items()}
    val_names = [str(p.relative_to(work)) for p in val_paths]
    eos = [tok.convert_tokens_to_ids("<|im_end|>")]
    if resuming:
        drafter, state = load_drafter(ckpt, target_cfg), T.TrainerState(**torch.load(state_path, weights_only=False))
        vocab_info = json.loads((ckpt / "vocab.json").read_text())
        click.echo(f"resuming at step {state.step} ({state.elapsed_s / 60:.1f} min trained)")
    elif init_from is not None:
        drafter, vocab_info = load_drafter(init_from, target_cfg), record["vocab"]
        state = T.TrainerState(step=record["steps"], elapsed_s=record["train_seconds"], log=record["loss_curve"],
                               evals=record["validation_tau"], runs=record["runs"])
        click.echo(f"continuing {init_from} at step {state.step} ({state.elapsed_s / 60:.1f} min trained), fresh optimizer")
        if grow_layers is not None:
            try:
                drafter = with_layers(drafter, grow_layers, seed=seed)
            except ValueError as err:
                raise click.UsageError(f"--grow-layers: {err}") from err
            click.echo(f"grown to {grow_layers} layers (the new ones start as identity)")
    else:
        ids, vocab_info = _draft_vocab(train_paths, target_cfg, vocab_size, eos)
        drafter = random_drafter(target_cfg, num_layers=num_layers, block_size=block_size, target_layer_ids=layer_ids,
                                 seed=seed, mask_token_id=MASK_TOKEN_ID, intermediate_size=intermediate_size,
                                 draft_vocab_ids=ids)  # RoPE: the target's
        state = T.TrainerState()
    drafter.config.extra["training_prompt_sources"] = sources  # a resumed or continued head may have new runs
    if rebuild_vocab:
        ids, rebuilt = _draft_vocab(train_paths, target_cfg, vocab_size, eos)
        drafter = with_draft_vocab(drafter, ids)
        vocab_info = {**rebuilt, "rebuilt_at_step": state.step, "before": vocab_info}
        click.echo(f"draft vocabulary rebuilt: {vocab_info}")
    cfg = T.TrainConfig(
        budget_s=train_minutes * 60, anchors_per_seq=anchors, seqs_per_step=seqs_per_step, lr=lr,
        rewarm_steps=rewarm_steps, schedule_start_s=schedule_from_min * 60, decay_gamma=gamma, kd_weight=kd_weight,
        autocast_bf16=bf16, eval_every_s=eval_every_min * 60, max_steps=max_steps,
        segment_s=None if stop_after_min is None else stop_after_min * 60, seed=seed,
    )
    layer_ids = list(drafter.config.target_layer_ids)
    monitor = [r for run in sorted({p.parent for p in val_paths})  # validation tau: 24 of each data run
               for r in S.load_records([p for p in val_paths if p.parent == run], stored, layer_ids,
                                       target_cfg.hidden_size)[:24]]

    def on_save(st: T.TrainerState) -> None:
        save_drafter(drafter, ckpt)
        (ckpt / "vocab.json").write_text(json.dumps(vocab_info))
        if inherited:  # runs whose shards are not under --work: a later resume reads them back from here
            inherited_path.write_text(json.dumps(inherited, indent=1))
        torch.save(st.to_dict(), state_path)
        # shipped: fp16 weights (load_drafter upcasts to the runtime dtype; d2t stays int64) + provenance
        save_drafter(copy.deepcopy(drafter).half(), out)
        recent = [e["loss"] for e in st.log[-100:]]
        (out / "training.json").write_text(json.dumps({
            "steps": st.step, "train_seconds": round(st.elapsed_s, 1),
            "final_loss_mean_last_100": round(sum(recent) / max(1, len(recent)), 4),
            "loss_curve": thin_loss_curve(st.log), "validation_tau": st.evals, "validation_shards": val_names,
            "vocab": vocab_info, "drafter_config": drafter.config.to_dict(), "data": meta,
            "train_config": st.runs[-1]["train_config"], "threads": threads, "runs": st.runs,
        }, indent=2) + "\n")

    records = S.stream_records(train_paths, stored, layer_ids, target_cfg.hidden_size, seed + state.step)
    n_params = sum(p.numel() for p in drafter.parameters()) / 1e6
    click.echo(f"drafter {n_params:.2f}M params, block {drafter.config.block_size}, vocab {vocab_info or 'full'}")
    run_info = {"train_shards": len(train_paths), "threads": threads, "device": device, "validation_shards": val_names,
                "vocab": {k: v for k, v in vocab_info.items() if k != "before"},
                **({"init_from": str(init_from)} if init_from is not None else {}),
                **({"grown_to_layers": grow_layers} if grow_layers is not None else {})}
    on_device = T.FrozenTarget(frozen.embed_weight.to(device), frozen.lm_head_weight.to(device))
    drafter.to(device)
    state = T.train(drafter, on_device, records, cfg, on_save, lambda d: T.acceptance(d, on_device, monitor), state,
                    num_target_layers=target_cfg.num_layers, run_info=run_info)
    click.echo(f"steps {state.step}; validation tau {state.evals[-1]['tau'] if state.evals else '-'}; saved {out}")
    validation = S.load_records(val_paths, stored, layer_ids, target_cfg.hidden_size)
    write_calibration([out, ckpt], target_cfg, frozen, validation)  # on the CPU, on the shipped (fp16) weights


def thin_loss_curve(log: list[dict], points: int = 40) -> list[dict]:
    """At most one entry per 1/points of the steps trained so far, and the last one. Spread by
    step, not by index: a continued head's log opens with its inherited, already thinned curve
    (a few entries over many steps), which thinning by index would cut to its first entry."""
    if not log:
        return []
    last, out, bucket = max(1, log[-1]["step"]), [], -1
    for entry in log:
        b = entry["step"] * points // last
        if b > bucket:
            out.append(entry)
            bucket = b
    return out if out[-1] is log[-1] else out + log[-1:]
