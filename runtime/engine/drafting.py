"""A round's draft part, before its trees: the drafter's context pass over what each drafting
request committed since it last drafted, and its block pass (`LLMEngine._append_contexts`,
`LLMEngine._draft`; perf's round-parts timer wraps those two names)."""

from __future__ import annotations

import torch

from runtime.drafter.vocab import DraftScores
from runtime.engine.accounting import observe_context_row


def feed_contexts(engine, seqs: list) -> None:
    """Feed the drafter the taps each request committed since it last drafted (ONE context pass
    where the drafter batches them). A first draft's prompt rows are prefill, paid once: their
    share of the pass is kept apart (`engine.prompt_context_ms`) and priced per row for the gates."""
    taps = [torch.cat(s.pending_taps) for s in seqs]
    for s in seqs:
        s.pending_taps = []
    prompt_rows = sum(len(s.request.prompt_ids) for s in seqs if not any(s.drafted))  # a first draft's prompt
    began = engine.clock.now() if prompt_rows else 0.0
    if hasattr(engine.drafter, "append_contexts"):
        engine.drafter.append_contexts([s.draft_state for s in seqs], taps)
    else:
        for s, t in zip(seqs, taps):
            engine.drafter.append_context(s.draft_state, t)
    if prompt_rows:
        rows = sum(t.shape[0] for t in taps)
        engine.prompt_context_ms = engine.clock.device_ms(began, engine.clock.now()) * prompt_rows / rows
        engine.context_row_ms = observe_context_row(engine.context_row_ms, engine.prompt_context_ms, prompt_rows)


def draft_scores(drafter, states: list, roots: list[int]) -> DraftScores:
    """ONE drafter pass. A drafter with `draft_scores` hands back its own vocabulary's logits (top K
    taken over Vd columns); otherwise `draft`'s [B, L, V] logits."""
    if hasattr(drafter, "draft_scores"):
        return drafter.draft_scores(states, roots)
    logits = drafter.draft(states, roots)
    return DraftScores(logits, None, logits.shape[-1])


def tree_scales(engine, drafting: list) -> list[float]:
    """What each drafting request's masses are scaled by before its tree is sized: a gate's correction
    (its realized / predicted acceptance, applied once); 1 for a try alone (scaled by acceptance learned
    on random words, a try's tree fell to one node or none and could not find text turned predictable);
    0 for a load probe's screen: one node, the cheapest tree whose verify still reads acceptance (the pass
    pads every request to the widest pack: 2 of 16 requests with 3 nodes, 73 ms; with 1, 54 ms; AR 37 ms,
    2-core CPU); other methods: their acceptance."""
    screen = {id(s) for s in engine.probers} if engine.probing and engine.load_probe.screening else set()
    return [s.acceptance_scale if s.gate is None else 0.0 if id(s) in screen
            else 1.0 if s.gate.trying and engine.load == 1 else s.gate.correction for s in drafting]
