"""Relaxed (LOSSY) acceptance rules on the bench harness: what a user trades for speed.

Opt-in only (`cast-trtllm bench --relaxed NAME:ALPHA`, temperature > 0). For every
speculative method of the run a relaxed twin runs the same prompts with
`cast_trtllm.relaxed.relaxed_walk` in place of the lossless walk, and the report gets:
- R: committed round length, as for every method;
- per-step TV: total variation from the target law p of the law each committed token was
  drawn from (`committed_law` at its node, with the node's retained-children proposal;
  `bonus_law` at a leaf), averaged over committed steps. 0 for a lossless rule;
- response length change: mean new tokens (EOS on) of the relaxed twin vs the lossless
  run of the same method (same law as AR sampling);
- the relaxed paper's Eq. 4 speed-up proxy (`relaxed_speedup`) with one drafter call per
  round (N_draft = 1) and c_rel = measured draft ms / verify ms.
TV is computed after each generation from references kept during it (no copies inside
the timed window).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cast_trtllm.relaxed import RULES, RelaxedRule, committed_law, relaxed_speedup, relaxed_walk, total_variation
from cast_trtllm import verify
from cast_trtllm.sampling import SamplingParams, target_probs
from cast_trtllm.tree import Tree
from runtime.engine import LLMEngine


def parse_relaxed(text: str) -> RelaxedRule:
    """`NAME:ALPHA` (e.g. `cactus:0.5`, `ensemble:0.3`) -> an opted-in lossy rule (checked by `RelaxedRule`)."""
    name, _, alpha = text.partition(":")
    try:
        return RelaxedRule(name, float(alpha), lossy=True)
    except ValueError as err:
        raise ValueError(f"--relaxed {text!r}: expected NAME:ALPHA with NAME one of {RULES} ({err})") from None


@dataclass(slots=True)
class _Round:
    tree: Tree
    target_logits: torch.Tensor  # [n, V]
    draft_logits: torch.Tensor  # [L, V]
    committing_rows: np.ndarray  # pack rows whose node committed a token: [0] + path


class RelaxedEngine(LLMEngine):
    """The one engine whose walk applies `self.rule` when set; keeps what the TV needs."""

    rule: RelaxedRule | None = None
    rounds: list[_Round]

    def _walk(self, seq, tree, logits, draft):
        if self.rule is None or tree.size == 0:
            return super()._walk(seq, tree, logits, draft)
        draft_logits = draft.full()[0]  # [L, V]
        acc = relaxed_walk(tree, logits, draft_logits, seq.request.sampling, self.rule, seq.generator)
        self.rounds.append(_Round(tree, logits, draft_logits, np.concatenate([[0], acc.path])))
        return acc


def _proposal(tree: Tree, row: int, vocab: int) -> torch.Tensor | None:
    """[V] drafter marginal renormalized over the retained children of pack row `row` (the walk's)."""
    children = tree.children(row)
    if len(children) == 0:
        return None
    out = torch.zeros(vocab, dtype=torch.float64)
    out[torch.from_numpy(tree.tokens[children - 1])] = torch.from_numpy(verify._proposal(tree, row, children))
    return out


def step_tvs(rule: RelaxedRule, rounds: list[_Round], sampling: SamplingParams) -> list[float]:
    """TV from p of the law behind every committed token of the traced rounds."""
    tvs = []
    for r in rounds:
        vocab = r.target_logits.shape[1]
        for row in r.committing_rows:
            p = target_probs(r.target_logits[row : row + 1].float(), sampling)[0].cpu().to(torch.float64)
            d = int(r.tree.pack_depth[row])
            q = None
            if d < r.draft_logits.shape[0]:
                q = torch.softmax(r.draft_logits[d].to(torch.float64) / sampling.temperature, dim=0).cpu()
            proposal = _proposal(r.tree, int(row), vocab)
            law = rule.bonus_law(p, q) if proposal is None else committed_law(rule, p, q, proposal)
            tvs.append(total_variation(law.to(torch.float64), p))
    return tvs


def relaxed_block(label: str, rule: RelaxedRule, relaxed: dict[str, Any], lossless: dict[str, Any],
                  tvs: list[float]) -> dict[str, Any]:
    """Report block comparing a relaxed twin with its lossless method (report.method_block dicts)."""
    def mean_len(block):
        return block["request_info"]["avg_output_length"]

    def parts(block):
        split = block["performance"]["time_split_ms"]
        al = block["decoding_stats"]["acceptance_length_percentiles"] or {"average": 1.0}
        return al["average"], split["draft"] / split["verify"] if split["verify"] else 0.0

    R_rel, c_rel = parts(relaxed)
    R_ll, c_ll = parts(lossless)
    return {
        "label": label,
        "rule": {"name": rule.name, "alpha": rule.alpha, "divergence": rule.divergence, "lossy": True},
        "mean_R": R_rel,
        "lossless_mean_R": R_ll,
        "mean_step_tv": float(np.mean(tvs)) if tvs else 0.0,
        "max_step_tv": float(np.max(tvs)) if tvs else 0.0,
        "num_steps": len(tvs),
        "mean_response_length": mean_len(relaxed),
        "lossless_mean_response_length": mean_len(lossless),
        "response_length_change": mean_len(relaxed) / mean_len(lossless) - 1.0,
        "eq4_speedup_proxy": relaxed_speedup(R_rel - 1.0, 1, c_rel, mean_len(lossless), mean_len(relaxed)),
        "lossless_eq4_speedup_proxy": relaxed_speedup(R_ll - 1.0, 1, c_ll),
        "decode_ms_per_token": relaxed["performance"]["decode_ms_per_token"],
        "lossless_decode_ms_per_token": lossless["performance"]["decode_ms_per_token"],
    }


def relaxed_blocks(specs: list, report: dict[str, Any], run: Any) -> list[dict[str, Any]]:
    """A `relaxed_block` for every relaxed twin of a bench run (`perf.harness.BenchRun`) and its report."""
    blocks = {b["label"]: b for b in report["runs"]}
    return [relaxed_block(s.label, s.relaxed, blocks[s.label], blocks[s.base_label],
                          [tv for r in run.runs[s.label] for tv in (r.step_tvs or [])])
            for s in specs if s.relaxed is not None]
