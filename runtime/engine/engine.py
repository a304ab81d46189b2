"""The one engine: every command, benchmark and server runs `LLMEngine`.

Shaped like nano-vllm's `LLMEngine`: `add_request` (prefill + first pending root),
`step` (one round for every live request), `generate` (run requests to completion).
A round (ARCHITECTURE.md; paper §2, App. C):
  draft  — ONE batched drafter pass over the requests that draft this round;
  trees  — one tree per request (`runtime.engine.trees`; where N is chosen);
  verify — ONE ragged, ancestor-masked target pass over every request's pack
           [b, z_1..z_N] (a request that does not draft packs the empty tree [b]);
  walk   — on the device for every request without logit processing or logprobs, greedy or
           sampled (Theorem 3's lossless rejection sampling), ONE host read per round
           (`runtime.engine.walks`); the others walk on the host from their processed rows;
  commit — KV compacted to x∘b∘y_1:A in one device gather; taps of those rows queued for the drafter.
On CUDA the trees are built on the device (`runtime.device_trees`) and verify + walk + commit
run through the model runner (`runtime.engine.runner_round`: one upload, a captured part, one
read). A single request is B = 1 of the same code. Greedy output is token-identical to AR.
Timings follow App. D (decode window after prefill and the first draft; draft / verify / overhead).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence as Seq

import numpy as np
import torch

from cast_trtllm.draft_gate import DraftGate
from cast_trtllm.engine_evidence import EngineEvidence
from cast_trtllm.load_probe import LoadProbe
from cast_trtllm.realized_guard import RealizedGuard
from cast_trtllm.spec_config import AUTO, SpecConfig
from cast_trtllm.tree import Tree
from cast_trtllm.verify import Acceptance
from runtime.drafter.executor import DrafterExecutor
from runtime.engine.backend import TargetBackend, TorchTarget
from runtime.engine.sequence import Request, Sequence
from runtime.drafter.vocab import DraftScores
from runtime.engine.trees import WidthSource, choose_trees, device_trees
from runtime.engine.accounting import account, brief, rounds_left, scout, together
from runtime.engine.drafting import draft_scores, feed_contexts, tree_scales
from runtime.engine.prefill import first_token, take_chunks
from runtime.engine.runner_round import runner_round
from runtime.engine.walks import HostReads, host_walk, queue_taps, walk_round
from runtime.device import upload
from runtime.device_trees import TreeBatch
from runtime.model.llama import LlamaTarget
from runtime.result import GenerationResult, Stopwatch
from runtime.stopping import StopChecker


class LLMEngine:
    def __init__(
        self,
        target: LlamaTarget | TargetBackend,  # a bare model runs on the torch backend
        drafter: DrafterExecutor | None,
        tokenizer: Any = None,
        eos_token_ids: Iterable[int] = (),
        spec: SpecConfig = SpecConfig(),
        width: WidthSource | None = None,
        cost: Any = None,  # learns the live cost curve: observe_verify(packed, ms, batch), observe_draft(ms, batch)
        max_num_tokens: int = 512,  # tokens per round's pass: decode packs, then prompt chunks in what is left
    ) -> None:
        if not isinstance(max_num_tokens, int) or max_num_tokens < 1:
            raise ValueError(f"max_num_tokens (tokens per round) must be an integer >= 1, got {max_num_tokens!r}")
        self.max_num_tokens = max_num_tokens
        if drafter is not None:
            spec.check_budget_fits(spec.budget, drafter.num_draft_positions)
        taps = drafter.tap_layer_ids if drafter is not None else ()
        self.target = TorchTarget(target, taps) if isinstance(target, LlamaTarget) else target
        if drafter is not None and hasattr(self.target, "runner"):  # its static walk covers trees this deep
            self.target.check_depth(spec.draft_positions(drafter.num_draft_positions))
        if drafter is not None and tuple(self.target.tap_layer_ids) != tuple(taps):
            raise ValueError(f"the target backend taps layers {self.target.tap_layer_ids}; the drafter needs {taps}")
        self.drafter, self.tokenizer = drafter, tokenizer
        self.eos_token_ids = tuple(eos_token_ids)
        self.spec, self.width, self.cost = spec, width, cost
        self.clock = Stopwatch(self.target.device)
        self.active: list[Sequence] = []
        self.load_probe = None if cost is None else LoadProbe(cost, every=spec.gate_probe_every)
        self.probing, self.probers = False, []  # this round is the load probe's; the requests it tries
        self.capped: set[int] = set()  # this round's requests whose trees stop short of max_tokens (`_trees`)
        self.guard = None if cost is None else RealizedGuard()  # under load: drafting that measured slower stops
        self.load = 0  # live requests this round, prompts still prefilling included
        self.evidence = EngineEvidence()  # drafted auto rounds, pooled over requests: new requests start from it
        self.host_reads, self.device_trees = HostReads(), self.target.device.type == "cuda"  # CPU: host search
        self.prompt_context_ms = 0.0  # this round's drafter context pass over first drafts' prompts (prefill-like)
        self.context_row_ms = 0.0  # the drafter's context pass per row, as measured over prompts (gates price it)

    @property
    def context_window(self) -> int:
        return self.target.config.context_window

    # ------------------------------------------------------------------ join
    def check_request(self, req: Request) -> tuple[str, int | str]:
        """(method, budget) this engine runs `req` with; ValueError saying what to fix if it cannot."""
        method = req.method or self.spec.method
        budget = self.spec.budget if req.budget is None else req.budget
        if method != "ar":
            if self.drafter is None:
                raise ValueError(f"method {method!r} needs a drafter; load one (--drafter DIR) or use method 'ar'")
            self.spec.check_budget_fits(budget, self.drafter.num_draft_positions)
            if method == "cast" and budget == AUTO and self.width is None:
                raise ValueError("budget 'auto' needs a width rule; this engine was built without one")
        return method, budget

    def _max_nodes(self, method: str, budget: int | str) -> int:
        if method == "ar":
            return 0
        L = self.spec.draft_positions(self.drafter.num_draft_positions)
        return L if method == "chain" else self.spec.max_nodes(L) if budget == AUTO else int(budget)

    def add_request(self, req: Request) -> Sequence:
        """Admit a request: check it and take its cache slots. Its prompt is prefilled inside the
        coming rounds, in chunks under the per-round token budget, then its first token is sampled."""
        method, budget = self.check_request(req)
        window = self.context_window
        n = len(req.prompt_ids)
        if n >= window:
            raise ValueError(f"the prompt has {n} tokens; the context window holds {window}")
        max_new = min(req.max_new_tokens, window - n)
        capacity = n + max_new + self._max_nodes(method, budget) + 1
        target = self.target.new_sequence(capacity)
        gate = (budget == AUTO and self.spec.draft_gate) if req.draft_gate is None else req.draft_gate
        gated = method == "cast" and gate
        seq = Sequence(
            req, method, budget, target,
            self.drafter.new_state(capacity) if method != "ar" else None,
            StopChecker(self.tokenizer, req.stop_ids(self.eos_token_ids), req.stop_strings, max_new),
            req.sampling.generator("cpu"),
            gate=DraftGate(probe_every=self.spec.gate_probe_every, costs=self.cost, stale_rows=n) if gated else None,
        )
        if seq.gate is not None:  # alone or under load it decides from the table at once (on masses drafted
            seq.gate.inherit(self.evidence)  # before), and tries drafting on the engine's backoff (issue 40)
        seq.arrival = self.clock.now()  # its prompt is prefilled in the coming rounds (`step`)
        self.active.append(seq)
        return seq

    def abort(self, seq: Sequence, reason: str = "aborted") -> None:
        """Drop a live request and free its caches."""
        if seq in self.active:
            self.active.remove(seq)
            self._release(seq)
        if not seq.done:
            seq.finish_reason, seq.error = "abort", reason

    def _release(self, seq: Sequence) -> None:
        """Give a finished request's target and drafter cache slots back to their pools."""
        self.target.release(seq.target)
        if seq.draft_state is not None and hasattr(self.drafter, "release"):  # a drafter whose caches are pooled
            self.drafter.release(seq.draft_state)

    # ------------------------------------------------------------------ one round
    def _drafts(self, batch: list[Sequence]) -> list[Sequence]:
        """The requests that draft this round (the draft gates, the load probe and max_concurrency decide).
        Gates price at the live load (prompts still prefilling included): the batch a drafting request's
        one-off context pass must pay back in, not the first rounds' few decoding requests."""
        limit, load = self.spec.max_concurrency, self.load
        self.probing, self.probers = False, []
        if limit is not None and len(batch) > limit:
            return []
        gated = [s for s in batch if s.gate is not None and s.room > 1]  # one token left: nothing to draft for
        for s in gated:
            if s.gate.rounds == (0, 0):  # a request's first round: its gate prices it at this load
                s.gate.batch = load
                s.draft_next = brief(self, s).draft_next()
        if load > 1:
            scout(self, [s for s in gated if s.budget == AUTO and s.gate.masses is None], load)
        if load > 1 and self.guard is not None and self.guard.vetoed:  # until a probe confirms drafting
            for s in gated:
                s.draft_next = False
        if self.load_probe is not None and load > 1 and not any(s.method != "ar" and s.gate is None
                                                                       for s in batch):  # none drafts anyway
            chosen = {id(s) for s in together(self, gated, load)}  # priced as the round runs them
            for s in gated:  # a gate with no masses yet (a cold engine's scout) drafts as it chose
                s.draft_next = id(s) in chosen if s.gate.masses is not None else s.draft_next
        full = self.load_probe is not None and self.load_probe.pending  # a screen looked promising: all try
        new = bool(gated) and all(s.gate.rounds == (0, 0) for s in gated)  # new texts priced on the pool's evidence
        if (self.load_probe is not None and load > 1 and gated and (full or not any(s.draft_next for s in gated))
                and self.load_probe.tick(self.guard is not None and self.guard.holding, new)):  # else: waiting
            masses = [m for m in (s.gate.typical_masses() for s in gated) if m is not None]
            trying = sorted(gated, key=lambda s: s.gate.once_ms)[:self.load_probe.trying(len(gated))]  # cheapest
            self.probing = self.load_probe.ready(masses, load, sum(s.gate.once_ms for s in trying),
                                                 rounds_left([s.gate for s in trying]), len(trying), new)
            self.probers = trying if self.probing else []
        tried = {id(s) for s in self.probers}
        return [s for s in batch if s.method != "ar" and s.room > 1 and (s.draft_next or id(s) in tried)]

    @torch.inference_mode()
    def step(self) -> list[Sequence]:
        """One round for every live request. Returns the requests that finished."""
        if not self.active:
            return []
        clock, live = self.clock, self.active
        t0 = clock.now()
        batch = [s for s in live if not s.prefilling]  # decoding; prompts still prefilling get chunks
        self.load = len(live)  # what gates price at (`_drafts`)
        drafting = self._drafts(batch)
        scores = None
        self.prompt_context_ms = 0.0
        if drafting:
            self._append_contexts([s for s in drafting if s.pending_taps])
            scores = self._draft([s.draft_state for s in drafting], [s.root for s in drafting])
        t1 = clock.now()
        trees, tree_batch, sizes, drafts, masses = self._trees(batch, drafting, scores)
        chunks = take_chunks([s for s in live if s.prefilling], self.max_num_tokens - sum(1 + n for n in sizes),
                             not batch)
        t2 = t3 = clock.now()
        if batch:
            walk = None if type(self)._walk is LLMEngine._walk else lambda b, tree, rows: self._walk(  # host rule
                batch[b], tree, rows, drafts[b])
            uniforms = (1 + (self.spec.draft_positions(self.drafter.num_draft_positions) if self.drafter else 0),
                        self.spec.rank_cap)  # what a device-sampled request draws per round: (levels, K)
            if walk is None and hasattr(self.target, "runner"):  # one upload, the captured part, one read
                accs, trees, processed, queue, t3 = runner_round(self, batch, trees, tree_batch, sizes, uniforms)
            else:
                roots = torch.as_tensor([s.root for s in batch], dtype=torch.int64, device=self.target.device)
                logits, taps = self.target.verify_trees([s.target for s in batch], roots, tree_batch, sizes)
                t3 = clock.now()
                accs, trees, processed = walk_round(batch, trees, tree_batch, sizes, roots, logits, self.host_reads,
                                                    walk, uniforms)
                queue = lambda kept, taps=taps: queue_taps(batch, sizes, kept, taps)  # noqa: E731
            kept = [self._commit(seq, tree, acc, processed.get(b), draft)
                    for b, (seq, tree, acc, draft) in enumerate(zip(batch, trees, accs, drafts))]
            self.target.commit_many([s.target for s in batch], kept)  # KV compaction on the device
            queue(kept)
        t4 = clock.now()
        for seq, ids in chunks:  # after the decode pass, each in a pass of its own (see runtime.engine.prefill)
            first_token(seq, ids, *self.target.prefill(seq.target, torch.from_numpy(ids)), clock.now())
        finished = [s for s in live if s.done]
        for seq in finished:
            self._release(seq)
        account(self, batch, trees, masses, drafting, (t0, t1, t2, t3, t4))
        self.active = [s for s in live if not s.done]
        return finished

    def _append_contexts(self, seqs: list[Sequence]) -> None:  # ONE context pass (runtime.engine.drafting)
        feed_contexts(self, seqs)

    def _draft(self, states: list, roots: list[int]) -> DraftScores:  # ONE block pass
        return draft_scores(self.drafter, states, roots)

    def _trees(self, batch: list[Sequence], drafting: list[Sequence], scores: DraftScores | None):
        """(host trees, or None: built on the device; TreeBatch; nodes; drafts; auto's masses) per request."""
        B, drafts, masses = len(batch), [None] * len(batch), [None] * len(batch)
        self.capped = set()
        if scores is None:
            trees = [Tree.empty()] * B
            return trees, self._upload(trees), [0] * B, drafts, masses
        ids, lp = scores.topk(self.spec.rank_cap, self.spec.draft_positions(scores.num_positions),
                              host=not self.device_trees)  # [B', L, K]
        args = ([s.method for s in drafting], [s.budget for s in drafting],
                [self.target.prefix_len(s.target) for s in drafting], ids, lp, self.spec, self.width,
                tree_scales(self, drafting))
        depths = [s.room - 1 for s in drafting]  # deeper nodes could not commit (`trees.cap_depth`)
        self.capped = {id(s) for s, d in zip(drafting, depths) if d < lp.shape[1]}  # masses of a part: `account`
        drafts_now = {id(s) for s in drafting}
        where = [b for b, seq in enumerate(batch) if id(seq) in drafts_now]  # drafting's rows of the batch
        if self.device_trees:
            chosen, size, chosen_masses = device_trees(*args, read=self.host_reads, batch=B, depths=depths, predicted=[
                s.masses if s.gate is None else s.gate.masses for s in drafting])  # auto: one read a round
            trees, tree_batch = None, chosen.scatter(upload(where, ids.device), B)
        else:
            chosen, chosen_masses = choose_trees(*args, batch=B, depths=depths)
            trees = [chosen[where.index(b)] if b in where else Tree.empty() for b in range(B)]
            tree_batch, size = self._upload(trees), [t.size for t in chosen]
        sizes = [0] * B
        for j, b in enumerate(where):
            sizes[b], drafts[b], masses[b] = size[j], scores.row(j), chosen_masses[j]
        return trees, tree_batch, sizes, drafts, masses

    def _upload(self, trees: list[Tree]) -> TreeBatch | None:  # a runner takes them in its one upload
        return None if hasattr(self.target, "runner") else TreeBatch.from_host(trees, self.target.device)

    def _walk(self, seq: Sequence, tree: Tree, logits: torch.Tensor, draft: DraftScores | None) -> Acceptance:
        """A host walk of one verified pack (logits [n, V] processed; draft: its block's marginals,
        unused here: a relaxed-rule engine reads them)."""
        return host_walk(seq, tree, logits)

    def _commit(self, seq: Sequence, tree: Tree, acc: Acceptance, logits: torch.Tensor | None,
                draft: DraftScores | None) -> np.ndarray:
        """Record one walked pack; -> the pack rows whose K/V stay. logits: [n, V] processed
        (None when the walk ran on the device: nothing on the host needs them)."""
        keep, seq.finish_reason = seq.stop.check(seq.tokens, acc.committed.tolist())
        kept_rows = np.concatenate([[0], acc.path[: min(keep, acc.num_accepted)]]).astype(np.int64)
        seq.emit(acc, keep, logits)
        seq.accept_lengths.append(keep)
        seq.budgets.append(tree.size)
        seq.drafted.append(draft is not None)
        if not seq.done:
            seq.root = acc.next_root
        return kept_rows

    def generate(self, requests: Seq[Request]) -> list[GenerationResult]:
        """Run requests to completion (all join at once); results in request order."""
        seqs = [self.add_request(r) for r in requests]
        while self.active:
            self.step()
        return [s.result(self.tokenizer) for s in seqs]
