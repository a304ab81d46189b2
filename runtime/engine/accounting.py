"""A round's bookkeeping after its commit: App. D timings per request, the live cost
model's readings, and each draft gate's record of what its round cost and committed."""

from __future__ import annotations

import numpy as np

from cast_trtllm.probe_backoff import PROBE_SHARE
from cast_trtllm.spec_config import AUTO
from cast_trtllm.tree import Tree
from runtime.engine.sequence import Sequence
from runtime.engine.trees import expected_committed


def account(engine, batch: list[Sequence], trees: list[Tree], masses: list, drafting: list[Sequence],
            marks) -> None:
    """marks: (t0 start, t1 drafted, t2 trees built, t3 verified, t4 committed) in seconds."""
    t0, t1, t2, t3, t4 = marks
    clock = engine.clock  # device time of the passes (CUDA events, already waited for by the round's read)
    draft_ms, verify_ms = clock.device_ms(t0, t1), clock.device_ms(t2, t3)
    if engine.cost is not None and batch:  # every round measures the live configuration's costs: the verify
        # and what follows it (walk, commit, KV compaction, taps), all of which grow with the packed width
        # (c = 4, 2-core CPU: a round of 8 packed tokens a request ran 2.6 ms more of it than one of 4).
        # The pass pads every request to the widest pack, so that width is the reading's bucket, not the mean
        padded = max(t.num_packed for t in trees) * len(batch)
        engine.cost.observe_verify(padded, clock.device_ms(t2, t4), len(batch))
        if drafting:  # what drafting adds per round: the drafter call and the tree host work; a first
            # draft's context pass over its prompt is paid once, so it stays out (engine.prompt_context_ms)
            per_round = max(draft_ms - engine.prompt_context_ms, 0.0) + (t2 - t1) * 1e3
            engine.cost.observe_draft(per_round, len(drafting))
    overhead_ms = max((t4 - t0) * 1e3 - draft_ms - verify_ms, 0.0)  # the round's wall time outside the passes
    drafted = {id(s) for s in drafting}
    for seq, tree, mass in zip(batch, trees, masses):
        t = seq.timings
        first = seq.num_rounds == 1
        if first and id(seq) in drafted:  # the first draft is outside the decode window
            t.first_draft_ms = draft_ms
        else:
            t.draft_ms += draft_ms
            t.decode_ms += draft_ms
        seq.round_ms.append((t4 - t0) * 1e3 - (t.first_draft_ms if first else 0.0))
        was = id(seq) in drafted
        priced = was and (mass is not None or seq.gate is not None)  # its forecast, computed once
        expected = expected_committed(tree, _beta(engine, seq)) if priced else None
        if mass is not None:  # a drafted auto round: how its forecast compares with what committed
            seq.forecast += expected - 1.0
            seq.accepted += seq.accept_lengths[-1] - 1
            if id(seq) not in engine.capped:  # a whole tree's: what a gateless request's next is sized on
                seq.masses = mass
        t.verify_ms += verify_ms
        t.overhead_ms += overhead_ms
        t.decode_ms += verify_ms + overhead_ms
        if seq.gate is not None:
            # a tree capped near max_tokens drafted only the levels it could commit: its masses are a part of
            # the text's, and blended in they shrank the typical masses (zero-padded) of the gate and of the
            # engine's pool the next requests inherit (c = 4 continuous, 2-core CPU: each new batch's gates
            # priced AR on the last batch's capped tails and played it for its first 6-7 rounds)
            whole = id(seq) not in engine.capped
            typical = mass if whole else None
            seq.gate.record(was, max(seq.accept_lengths[-1], 1), (t4 - t0) * 1e3, expected,
                            packed=tree.num_packed if was and whole else None, masses=typical, batch=engine.load)
            seq.draft_next = brief(engine, seq).draft_next()
            if was and mass is not None:  # a drafted auto round: the engine's pooled evidence
                engine.evidence.add(max(seq.accept_lengths[-1], 1), expected, typical, tree.num_packed,
                                    seq.gate.backoff.confirmed)
    probed(engine, batch, masses)
    guard(engine, batch, drafting, (t4 - t0) * 1e3 - engine.prompt_context_ms)


def probed(engine, batch: list[Sequence], masses: list) -> None:
    """After the load probe's round: a screen's few decide whether all try next round; a try of all
    whether the batch turns to drafting (the requests whose tries want it, priced together), which
    ends a veto of the realized guard only once its hold is over (`RealizedGuard.lift`)."""
    probe = engine.load_probe
    if not engine.probing:
        return
    if probe.screening:
        fresh = {id(s): m for s, m in zip(batch, masses) if m is not None}
        gated = [s.gate for s in batch if s.gate is not None]
        probe.screened([np.minimum(fresh[id(s)] * s.gate.correction, 1.0) for s in engine.probers if id(s) in fresh],
                       engine.load, sum(g.once_ms for g in gated), rounds_left(gated), batch)
        return
    if probe.tried():  # a try of all runs its `span` rounds before the gates' choices are judged
        return
    drafts = bool(together(engine, [s for s in batch if s.gate is not None], engine.load))
    probe.confirmed(still_ar=not (drafts and (engine.guard is None or engine.guard.lift())), live=batch)


def guard(engine, batch: list[Sequence], drafting: list[Sequence], wall_ms: float) -> None:
    """Under load, the round's measured cost against AR's (`RealizedGuard`); of drafted rounds, only
    those the gates chose (a probe's try is the probe's cost). A veto backs the load probe off."""
    if engine.guard is None:
        return
    live = [s for s in engine.active if not s.done]
    engine.guard.expire(live)
    engine.load_probe.expire(live)
    if len(batch) < 2 or (drafting and engine.probing) or wall_ms <= 0 or any(s.gate is None for s in drafting):
        return  # alone, a probe's try, or a round drafted for requests without a gate: not the gates' choice
    committed = sum(max(s.accept_lengths[-1], 1) for s in batch)
    ar_ms = engine.cost.round_ms(1, len(batch), drafted=False)
    if engine.guard.observe(bool(drafting), len(batch), committed, wall_ms, ar_ms, tuple(batch)):
        engine.load_probe.confirmed(still_ar=True, live=batch)


def rounds_left(gates) -> float | None:
    """The mean tokens these draft gates' requests may still commit (None: none is bounded)."""
    left = [g.horizon for g in gates if g.horizon is not None]
    return sum(left) / len(left) if left else None


def together(engine, gated: list[Sequence], load: int) -> list[Sequence]:
    """Under load, the gated requests that draft next round, priced as the round runs them
    (`LoadProbe.settle`): those whose gates chose to (at their doubted masses, `DraftGate.doubted`), joined
    by AR-playing ones where that raises the round's tokens/ms; none where those few alone lose to AR.
    A try of all is judged by the same rule (`probed`)."""
    wants = wanting(gated)
    others = joiners(gated, PROBE_SHARE * engine.cost.round_ms(1, load, drafted=False)) if wants else []
    drafts, join = engine.load_probe.settle([s.gate.typical_masses(doubt=True) for s in wants],
                                            [s.gate.typical_masses() for s in others], load)
    return wants + others if join else wants if drafts else []


def wanting(seqs: list[Sequence]) -> list[Sequence]:
    """The gated requests whose gates chose to draft next, with masses to price them by (under load
    `LoadProbe.settle` prices them together)."""
    return [s for s in seqs if s.gate is not None and s.draft_next and s.gate.masses is not None]


def joiners(seqs: list[Sequence], cheap_ms: float) -> list[Sequence]:
    """The gated requests playing AR that could join a drafted round: with masses to price them by,
    and a context pass over their rows since the last draft of at most `cheap_ms`."""
    return [s for s in seqs if s.gate is not None and not s.draft_next and s.gate.masses is not None
            and s.gate.once_ms <= cheap_ms]


def scout(engine, cold: list[Sequence], batch: int) -> None:
    """Under load, auto requests with no masses of their own (a cold engine's first wave) do not all
    draft to learn them: once any request has drafted they inherit its masses and the table decides;
    until then only the oldest (the scout) drafts."""
    source = engine.evidence
    for i, s in enumerate(cold):
        if source.masses is not None:
            s.gate.batch = batch
            s.gate.inherit(source)
            s.draft_next = brief(engine, s).draft_next()
        elif i > 0:
            s.draft_next = False


def brief(engine, seq: Sequence):
    """Hand a request's draft gate what its expected-value checks read: the tokens it may still
    commit and the drafter's context pass per row (measured; until then, a block pass per row)."""
    gate = seq.gate
    gate.horizon = seq.room
    row_ms = engine.context_row_ms
    if not row_ms and engine.cost is not None and engine.drafter is not None:
        row_ms = engine.cost.draft_ms(1) / (1 + engine.drafter.num_draft_positions)
    gate.context_row_ms = row_ms
    return gate


def observe_context_row(current: float, ms: float, rows: int, alpha: float = 0.2, min_rows: int = 32) -> float:
    """EWMA of the drafter's context pass, ms per row (0: none read yet), from passes over >= `min_rows`
    prompt rows: a short pass is mostly its fixed cost (a 6-row prompt read 40 ms a row), which every
    drafted round's draft reading already holds."""
    if rows < min_rows:
        return current
    reading = ms / rows
    return reading if current == 0.0 else current + alpha * (reading - current)


def _beta(engine, seq: Sequence) -> float:
    """Calibration exponent of the node masses of an `auto` request (1 for the others)."""
    if seq.budget == AUTO and engine.width is not None:
        return float(engine.width(engine.target.prefix_len(seq.target)).mass_exponent)
    return 1.0
