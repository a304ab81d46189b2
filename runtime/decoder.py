"""One decoding loop for autoregressive, DFlash-chain and CAST decoding.

The methods differ only in the tree each round verifies:
- `ar`: the empty tree (pack = [b]); no drafter.
- `chain`: standard DFlash, the top-1 token at each of the L block positions.
- `cast`: the exact top-N tree by path product (fixed budget N, or a width policy's
  per-round budget from the round's sorted prefix masses). With `draft_gate`, a
  `cast_trtllm.draft_gate.DraftGate` may also skip drafting for a round (an AR round on
  the empty tree) when measured drafted rounds commit fewer tokens per ms than AR ones;
  the drafter's feature cache is then caught up at the next drafted round.

Round contract (ARCHITECTURE.md; paper §2, App. C). Entry: the target KV cache and the
drafter feature cache cover x; the pending root b is committed but not yet run. Draft
on [b, mask…] → tree → verify [b, z_1..z_N] → walk → commit y_1:A + next root c:
KV compacted to x∘b∘y_1:A, feature cache appended with exactly those positions.
Greedy (T = 0) is token-identical to AR; T > 0 uses the lossless stochastic walk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np
import torch

from cast_trtllm.draft_gate import DraftGate
from cast_trtllm.sampling import SamplingParams, sample_tokens
from cast_trtllm.tree import Tree, build_chain, build_tree, sorted_prefix_masses, topk_per_position
from cast_trtllm.verify import Acceptance, greedy_walk, stochastic_walk
from runtime.result import GenerationResult, Stopwatch, Timings
from runtime.stopping import StopChecker
from runtime.target import TargetExecutor

METHODS = ("ar", "chain", "cast")


class WidthChooser(Protocol):
    """Per-round width rule, e.g. `cast_trtllm.width.WidthPolicy`."""

    max_budget: int
    rank_cap: int
    mass_exponent: float  # calibration beta: a node's acceptance ~= rho ** beta

    def choose(self, masses_desc: np.ndarray) -> Any:  # returns an object with `.budget`
        ...


class DraftSource(Protocol):
    """What the loop needs from a drafter (`runtime.drafter.DrafterExecutor`)."""

    tap_layer_ids: tuple[int, ...]
    num_draft_positions: int

    def reset(self, capacity: int) -> None: ...
    def append_context(self, taps: torch.Tensor) -> None: ...
    def draft(self, root_token: int) -> torch.Tensor: ...  # [L, V] logits


@dataclass(frozen=True, slots=True)
class DecodeConfig:
    method: str = "cast"
    budget: int = 15  # cast: fixed N (ignored when width_policy is set)
    width_policy: WidthChooser | None = None
    rank_cap: int = 8  # K: tokens kept per drafted position (policy's own K wins)
    max_new_tokens: int = 128
    draft_gate: bool = False  # cast: skip drafting in rounds where AR measures faster (DraftGate);
    # which rounds draft then follows wall time, so T > 0 output keeps the target law but is
    # not bit-reproducible from the seed
    gate_probe_every: int = 16  # DraftGate.probe_every: rounds between tries of the other arm
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.budget < 1:
            raise ValueError(f"budget must be >= 1, got {self.budget}")
        if self.rank_cap < 1:
            raise ValueError(f"rank_cap must be >= 1, got {self.rank_cap}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.draft_gate and self.method != "cast":
            raise ValueError(f"draft_gate applies to method 'cast', not {self.method!r}")

    @property
    def max_pack(self) -> int:
        """Upper bound on packed tokens per verify, excluding the chain's L."""
        return 1 + (self.width_policy.max_budget if self.width_policy is not None else self.budget)


class Decoder:
    def __init__(
        self,
        target: TargetExecutor,
        drafter: DraftSource | None,
        tokenizer: Any = None,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        if drafter is not None and tuple(target.tap_layer_ids) != tuple(drafter.tap_layer_ids):
            raise ValueError(
                f"target taps {target.tap_layer_ids} differ from the drafter's target_layer_ids "
                f"{drafter.tap_layer_ids}"
            )
        self.target, self.drafter = target, drafter
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)

    # ------------------------------------------------------------------ tree per method
    def _tree(self, cfg: DecodeConfig, draft_logits: torch.Tensor | None) -> Tree:
        if cfg.method == "ar" or draft_logits is None:  # AR, or a round the draft gate left undrafted
            return Tree.empty()
        if cfg.method == "chain":
            ids, lp = topk_per_position(draft_logits, 1)
            return build_chain(ids.cpu().numpy(), lp.cpu().numpy())
        policy = cfg.width_policy
        ids, lp = topk_per_position(draft_logits, policy.rank_cap if policy is not None else cfg.rank_cap)
        ids, lp = ids.cpu().numpy(), lp.cpu().numpy()  # [L, K]
        if policy is None:
            return build_tree(ids, lp, cfg.budget)
        budget = policy.choose(sorted_prefix_masses(lp, policy.max_budget)).budget
        return build_tree(ids, lp, int(budget))

    @staticmethod
    def _expected(cfg: DecodeConfig, tree: Tree, draft_logits: torch.Tensor | None) -> float | None:
        """Forecast committed length of a drafted round: 1 + sum of calibrated node masses."""
        if draft_logits is None:
            return None
        beta = cfg.width_policy.mass_exponent if cfg.width_policy is not None else 1.0  # fixed N: plug-in
        return 1.0 + float((np.exp(tree.score) ** beta).sum())

    def _walk(self, cfg: DecodeConfig, tree: Tree, logits: torch.Tensor, gen: torch.Generator) -> Acceptance:
        if cfg.sampling.greedy:
            return greedy_walk(tree, logits.argmax(dim=-1))
        if tree.size == 0:  # AR step: the same law and generator use as plain sampling
            return Acceptance(np.zeros(0, np.int64), np.zeros(0, np.int64), int(self._sample(logits, cfg, gen)))
        return stochastic_walk(tree, logits, cfg.sampling, gen)

    @staticmethod
    def _sample(logits: torch.Tensor, cfg: DecodeConfig, gen: torch.Generator) -> int:
        """One autoregressive token from the last row of logits [n, V]."""
        return int(sample_tokens(logits[-1:].cpu(), cfg.sampling, gen)[0])

    # ------------------------------------------------------------------ the loop
    def generate(self, prompt_ids: Sequence[int], cfg: DecodeConfig) -> GenerationResult:
        speculative = cfg.method != "ar"
        if speculative and self.drafter is None:
            raise ValueError(f"method {cfg.method!r} needs a drafter")
        prompt = torch.as_tensor(list(prompt_ids), dtype=torch.int64)
        window = self.target.model.config.context_window
        if prompt.numel() == 0:
            raise ValueError("the prompt is empty")
        if prompt.numel() >= window:
            raise ValueError(f"the prompt has {prompt.numel()} tokens; the context window holds {window}")
        max_new = min(cfg.max_new_tokens, window - prompt.numel())
        block = self.drafter.num_draft_positions if speculative else 0
        capacity = prompt.numel() + max_new + max(cfg.max_pack, block + 1)
        self.target.reset(capacity)
        if speculative:
            self.drafter.reset(capacity)
        stop = StopChecker(self.tokenizer, self.eos_token_ids, cfg.stop_strings, max_new)
        gen = cfg.sampling.generator("cpu")
        clock, t = Stopwatch(self.target.device), Timings()

        start = clock.now()
        out = self.target.prefill(prompt)
        root = self._sample(out.logits, cfg, gen)  # first pending root b
        t.ttft_ms = (clock.now() - start) * 1e3
        if speculative:
            self.drafter.append_context(out.taps)
        t.prefill_ms = (clock.now() - start) * 1e3
        tokens: list[int] = []
        keep, reason = stop.check(tokens, [root])
        tokens += [root][:keep]
        result = GenerationResult(cfg.method, "", tokens, reason or "", prompt.numel(), timings=t)

        if reason is None:
            draft_logits = None
            gate = DraftGate(probe_every=cfg.gate_probe_every) if cfg.draft_gate else None
            pending_taps: list[torch.Tensor] = []  # committed taps not yet in the drafter (AR rounds)
            if speculative:
                mark = clock.now()
                draft_logits = self.drafter.draft(root)
                t.first_draft_ms = (clock.now() - mark) * 1e3
            round_draft_ms = t.first_draft_ms  # the gate bills each round its own draft
            opened = clock.now()
            while reason is None:
                mark = clock.now()
                tree = self._tree(cfg, draft_logits)
                pack = torch.from_numpy(np.concatenate([[root], tree.tokens]).astype(np.int64))
                verify_start = clock.now()
                verified = self.target.verify(pack, tree)
                verify_end = clock.now()
                acc = self._walk(cfg, tree, verified.logits, gen)
                keep, reason = stop.check(tokens, acc.committed.tolist())
                taps = self.target.commit(acc.path[: min(keep, acc.num_accepted)])
                tokens += acc.committed[:keep].tolist()
                result.accept_lengths.append(keep)
                result.budgets.append(tree.size)
                result.drafted.append(draft_logits is not None)
                draft_start = clock.now()
                if gate is not None:
                    round_ms = round_draft_ms + (draft_start - mark) * 1e3
                    gate.record(draft_logits is not None, max(keep, 1), round_ms, self._expected(cfg, tree, draft_logits))
                draft_logits = None
                if reason is None:
                    root = acc.next_root
                    if speculative:
                        pending_taps.append(taps)
                        if gate is None or gate.draft_next():
                            self.drafter.append_context(torch.cat(pending_taps) if len(pending_taps) > 1 else taps)
                            pending_taps = []
                            draft_logits = self.drafter.draft(root)
                done = clock.now()
                round_draft_ms = (done - draft_start) * 1e3
                t.verify_ms += (verify_end - verify_start) * 1e3
                t.draft_ms += round_draft_ms
                t.overhead_ms += ((verify_start - mark) + (draft_start - verify_end)) * 1e3
            t.decode_ms = (clock.now() - opened) * 1e3
            result.finish_reason = reason
        if self.tokenizer is not None:
            result.text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return result
