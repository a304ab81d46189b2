"""Batched CAST with continuous batching (paper §5, App. B.4 and F).

One round over the B active requests:
1. draft: ONE batched drafter pass → marginals q_1..q_L of every request;
2. allocate: one tree per request from the batch policy —
   `chain` (top-1 block chain), `fixed` (top-N tree, same N for all), `uniform`
   (top-W tree per request), `best_first` (one shared budget M split by global
   best-first mass, Proposition 2; M from the width profile's batched rule,
   Proposition 3, when a `WidthPolicy` is given, else `mean_budget * B`);
3. verify: ONE ragged target pass over all packs (`batch_forward.ragged_verify`);
4. walk + commit per request (greedy or Theorem 3), KV compaction, feature append.
Requests join (`add`: prefill + first pending root) and leave (stop condition) between
rounds; each carries its own sampling parameters, stop strings and token limit.
Per request, `method` ("cast" | "chain" | "ar") and a fixed `budget` override the
batch policy; only `cast` requests without a fixed budget share the policy's budget.
Greedy output equals autoregressive greedy output for every request and policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from cast_trtllm.sampling import SamplingParams, sample_tokens
from cast_trtllm.tree import Tree, allocate_shared_budget, build_chain, build_tree, sorted_prefix_masses, topk_per_position
from cast_trtllm.verify import Acceptance, greedy_walk, stochastic_walk
from cast_trtllm.width import WidthPolicy
from runtime.batch_drafter import BatchDraftSource
from runtime.batch_forward import ragged_verify
from runtime.result import GenerationResult
from runtime.stopping import StopChecker
from runtime.target import TargetExecutor

POLICIES = ("chain", "fixed", "uniform", "best_first")
METHODS = ("cast", "chain", "ar")


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    """How `cast` requests without a fixed budget get their trees each round."""

    name: str = "best_first"
    fixed_width: int = 48  # fixed: N per request (paper App. F: N = 48)
    uniform_width: int = 8  # uniform: W per request (paper App. F: W = 8)
    mean_budget: int = 4  # best_first without a width policy: M = mean_budget * B
    max_width: int = 64  # best_first: cap on one request's share of M
    rank_cap: int = 8  # K: tokens kept per drafted position
    width_policy: WidthPolicy | None = None  # best_first: M from Proposition 3

    def __post_init__(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"batch policy must be one of {POLICIES}, got {self.name!r}")
        for key in ("fixed_width", "uniform_width", "mean_budget", "max_width", "rank_cap"):
            if getattr(self, key) < (1 if key == "rank_cap" else 0):
                raise ValueError(f"BatchPolicy.{key} must be >= {1 if key == 'rank_cap' else 0}")

    @property
    def max_request_width(self) -> int:
        """Most nonroot nodes one request can pack in a round under this policy."""
        return max(self.fixed_width, self.uniform_width, self.max_width)


@dataclass(frozen=True, slots=True)
class GenRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int = 64
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0))
    stop_strings: tuple[str, ...] = ()
    method: str = "cast"
    budget: int | None = None  # fixed tree size N for this request; None = batch policy

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("the prompt is empty")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.budget is not None and self.budget < 0:
            raise ValueError(f"budget must be >= 0, got {self.budget}")


@dataclass(slots=True)
class LiveRequest:
    """Live state of one request: caches, pending root, emitted tokens."""

    request: GenRequest
    target: TargetExecutor  # owns the request's target KV cache
    draft_state: Any  # the drafter's per-request feature cache
    stop: StopChecker
    generator: torch.Generator
    root: int = -1  # pending root b
    tokens: list[int] = field(default_factory=list)
    accept_lengths: list[int] = field(default_factory=list)
    budgets: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


class BatchDecoder:
    def __init__(
        self,
        model: Any,  # runtime.model.llama.LlamaTarget
        drafter: BatchDraftSource,
        policy: BatchPolicy = BatchPolicy(),
        tokenizer: Any = None,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        self.model, self.drafter, self.policy = model, drafter, policy
        self.tokenizer, self.eos_token_ids = tokenizer, tuple(eos_token_ids)
        self.taps = tuple(drafter.tap_layer_ids)
        self.active: list[LiveRequest] = []

    @property
    def context_window(self) -> int:
        return self.model.config.context_window

    # ------------------------------------------------------------------ join
    def add(self, req: GenRequest) -> LiveRequest:
        """Prefill a new request and emit its first token (its first pending root)."""
        window = self.context_window
        prompt = torch.as_tensor(req.prompt_ids, dtype=torch.int64)
        if prompt.numel() >= window:
            raise ValueError(f"the prompt has {prompt.numel()} tokens; the context window holds {window}")
        max_new = min(req.max_new_tokens, window - prompt.numel())
        widest = max(req.budget or 0, self.policy.max_request_width, self.drafter.num_draft_positions)
        capacity = prompt.numel() + max_new + widest + 1
        target = TargetExecutor(self.model, self.taps)
        target.reset(capacity)
        seq = LiveRequest(
            req, target, self.drafter.new_state(capacity),
            StopChecker(self.tokenizer, self.eos_token_ids, req.stop_strings, max_new),
            req.sampling.generator("cpu"),
        )
        out = target.prefill(prompt)
        root = int(sample_tokens(out.logits[-1:].cpu(), req.sampling, seq.generator)[0])
        keep, seq.finish_reason = seq.stop.check([], [root])
        seq.tokens += [root][:keep]
        if not seq.done:
            seq.root = root
            self.drafter.append_context(seq.draft_state, out.taps)
            self.active.append(seq)
        return seq

    # ------------------------------------------------------------------ trees
    def _trees(self, seqs: Sequence[LiveRequest], draft_logits: torch.Tensor) -> list[Tree]:
        """One tree per drafted request. draft_logits: [B, L, V]."""
        pol = self.policy
        ids, lp = topk_per_position(draft_logits.reshape(-1, draft_logits.shape[-1]), pol.rank_cap)
        B, L = draft_logits.shape[:2]
        ids, lp = ids.cpu().numpy().reshape(B, L, -1), lp.cpu().numpy().reshape(B, L, -1)  # [B, L, K]
        trees: list[Tree | None] = [None] * B
        shared = []  # requests whose tree comes from the batch policy
        for b, seq in enumerate(seqs):
            req = seq.request
            if req.method == "ar":
                trees[b] = Tree.empty()
            elif req.method == "chain":
                trees[b] = build_chain(ids[b], lp[b])
            elif req.budget is not None:
                trees[b] = build_tree(ids[b], lp[b], req.budget)
            else:
                shared.append(b)
        if shared:
            for b, tree in zip(shared, self._policy_trees(ids[shared], lp[shared])):
                trees[b] = tree
        return trees

    def _policy_trees(self, ids: np.ndarray, lp: np.ndarray) -> list[Tree]:
        pol, B = self.policy, len(ids)
        if pol.name == "chain":
            return [build_chain(i, l) for i, l in zip(ids, lp)]
        if pol.name in ("fixed", "uniform"):
            width = pol.fixed_width if pol.name == "fixed" else pol.uniform_width
            return [build_tree(i, l, width) for i, l in zip(ids, lp)]
        if pol.width_policy is None:
            total = pol.mean_budget * B
        else:  # Proposition 3 over the pooled order statistics of the B universes
            limit = B * pol.width_policy.max_budget
            pooled = np.sort(np.concatenate([sorted_prefix_masses(l, limit) for l in lp]))[::-1][:limit]
            total = int(pol.width_policy.choose(pooled, batch=B).budget)
        return allocate_shared_budget(list(zip(ids, lp)), total, cap=pol.max_width)

    # ------------------------------------------------------------------ one round
    @torch.inference_mode()
    def step(self) -> list[LiveRequest]:
        """One round for every active request. Returns the requests that finished."""
        if not self.active:
            return []
        batch = self.active
        speculative = [b for b, s in enumerate(batch) if s.request.method != "ar"]
        trees = [Tree.empty()] * len(batch)
        if speculative:
            drafted = [batch[b] for b in speculative]
            logits = self.drafter.draft([s.draft_state for s in drafted], [s.root for s in drafted])  # [B', L, V]
            for b, tree in zip(speculative, self._trees(drafted, logits)):
                trees[b] = tree
        packs = [np.concatenate([[s.root], t.tokens]).astype(np.int64) for s, t in zip(batch, trees)]
        logits, taps = ragged_verify(self.model, [s.target.cache for s in batch], packs, trees, self.taps)
        finished, row = [], 0
        for seq, tree in zip(batch, trees):
            rows = slice(row, row + tree.num_packed)
            row += tree.num_packed
            self._commit(seq, tree, logits[rows], None if taps is None else taps[rows])
            if seq.done:
                finished.append(seq)
        self.active = [s for s in batch if not s.done]
        return finished

    def _commit(self, seq: LiveRequest, tree: Tree, logits: torch.Tensor, taps: torch.Tensor | None) -> None:
        """Walk one verified pack and commit it. logits: [n, V]; taps: [n, F]."""
        acc = self._walk(seq, tree, logits)
        keep, seq.finish_reason = seq.stop.check(seq.tokens, acc.committed.tolist())
        kept_rows = np.concatenate([[0], acc.path[: min(keep, acc.num_accepted)]]).astype(np.int64)
        seq.target.cache.compact(kept_rows)
        seq.tokens += acc.committed[:keep].tolist()
        seq.accept_lengths.append(keep)
        seq.budgets.append(tree.size)
        if not seq.done:
            seq.root = acc.next_root
            if taps is not None and seq.request.method != "ar":
                self.drafter.append_context(seq.draft_state, taps[torch.from_numpy(kept_rows).to(taps.device)])

    @staticmethod
    def _walk(seq: LiveRequest, tree: Tree, logits: torch.Tensor) -> Acceptance:
        params = seq.request.sampling
        if params.greedy:
            return greedy_walk(tree, logits.argmax(dim=-1))
        if tree.size == 0:  # AR step: the same law and generator use as plain sampling
            token = int(sample_tokens(logits[-1:].cpu(), params, seq.generator)[0])
            return Acceptance(np.zeros(0, np.int64), np.zeros(0, np.int64), token)
        return stochastic_walk(tree, logits, params, seq.generator)

    # ------------------------------------------------------------------ static batch
    def result(self, seq: LiveRequest) -> GenerationResult:
        text = self.tokenizer.decode(seq.tokens, skip_special_tokens=True) if self.tokenizer is not None else ""
        return GenerationResult(
            self.policy.name, text, list(seq.tokens), seq.finish_reason or "", len(seq.request.prompt_ids),
            accept_lengths=list(seq.accept_lengths), budgets=list(seq.budgets),
        )

    def generate(self, requests: Sequence[GenRequest]) -> list[GenerationResult]:
        """Run a static batch to completion (all join at once)."""
        seqs = [self.add(r) for r in requests]
        while self.active:
            self.step()
        return [self.result(s) for s in seqs]
