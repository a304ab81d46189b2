"""The engine's pooled evidence: a new request starts from what many drafted rounds said, not
from whichever request drafted last."""

import numpy as np
import pytest

from cast_trtllm.cost_model import OnlineCostModel
from cast_trtllm.draft_gate import DraftGate
from cast_trtllm.engine_evidence import EngineEvidence, blend

MASSES = np.array([0.9, 0.8, 0.6, 0.4])


def _table() -> OnlineCostModel:
    """At batch 8 a drafted round pays where the head is right, not where it promises 3x what it gets."""
    return OnlineCostModel(buckets=(1, 2, 4, 8), prior={1: 20.0, 8: 24.0, 32: 32.0, 64: 45.0, 128: 70.0, 512: 250.0},
                           prior_draft_ms=6.0, probe_every=10_000)


def test_one_lucky_round_after_many_poor_ones_does_not_turn_new_requests_to_drafting():
    evidence = EngineEvidence()
    for _ in range(40):  # the head promises 3.7 tokens a round and the target takes none
        evidence.add(1, 3.7, MASSES, 5, confirmed=1)
    evidence.add(5, 3.7, MASSES, 5, confirmed=0)  # one request's try accepts all four
    gate = DraftGate(costs=_table(), batch=8)
    gate.inherit(evidence)
    assert evidence.realized / evidence.predicted < 0.1 and not gate.draft_next()
    trusting = EngineEvidence()  # the same head where the target does accept what it promises
    for _ in range(40):
        trusting.add(4, 3.7, MASSES, 5, confirmed=0)
    gate = DraftGate(costs=_table(), batch=8)
    gate.inherit(trusting)
    assert gate.draft_next()


def test_old_acceptance_decays_and_masses_blend_descending():
    evidence = EngineEvidence(decay=0.5)
    evidence.add(3, 3.0, MASSES, 5, confirmed=0)
    evidence.add(1, 3.0, MASSES[:2] / 2, 3, confirmed=2)
    assert evidence.realized == pytest.approx(0.5 * 2) and evidence.predicted == pytest.approx(0.5 * 2 + 2)
    assert evidence.packed == 3 and evidence.confirmed == 2 and len(evidence.masses) == 4
    assert np.all(np.diff(evidence.masses) <= 0)
    assert np.allclose(blend(None, MASSES, 0.2), MASSES)


@pytest.mark.parametrize("call", [lambda: EngineEvidence(decay=0.0), lambda: EngineEvidence(decay=1.5),
                                  lambda: EngineEvidence().add(0, 2.0, MASSES, 5, 0),
                                  lambda: EngineEvidence().add(2, 0.5, MASSES, 5, 0)])
def test_bad_input_is_refused(call):
    with pytest.raises(ValueError, match="EngineEvidence|drafted round"):
        call()


def test_a_request_turned_to_ar_by_a_poor_opening_re_prices_on_the_engines_ratio_as_its_evidence_fades():
    """MT-Bench at B = 1: an answer's first blocks accept nothing, the gate turns to AR; the engine's
    pooled ratio says this head pays on the domain, so once the opening's evidence has faded (a few
    `memory` half-lives of AR tokens) the gate drafts again without waiting for a lucky try. A
    standalone gate (no pool) keeps its evidence: nothing to fade towards."""
    pool = EngineEvidence()
    for _ in range(40):  # the domain: the head's forecasts come true
        pool.add(4, 3.7, MASSES, 5, confirmed=0)
    gate, alone = DraftGate(costs=_table(), probe_every=10_000), DraftGate(costs=_table(), probe_every=10_000)
    gate.inherit(pool)
    for g in (gate, alone):
        for _ in range(16):  # the opening: forecasts of 2.7 tokens, none accepted (this table pays drafting
            # at a quarter of that, so a drafting gate needs this many to be sure: `DraftGate.doubted`)
            g.record(True, 1, 30.0, expected=3.7, packed=5, masses=MASSES)
        assert g.correction < 0.5 and not g.best_is_speculate()
    for _ in range(3 * 16):  # AR rounds: three half-lives of committed tokens
        gate.record(False, 1, 20.0)
        alone.record(False, 1, 20.0)
    assert gate.correction > 2 * alone.correction and gate.draft_next()  # faded towards the pool's ~1.1
    assert alone.correction < 0.3 and not alone._best


def test_a_try_that_finds_the_text_changed_restarts_without_the_pool():
    """Alone, the pool holds this request's own old text: a promising try leaves it, as it leaves the
    request's own evidence, so a head that is right again is not held off by what it got wrong."""
    pool = EngineEvidence()
    for _ in range(40):
        pool.add(1, 3.7, MASSES, 5, confirmed=2)  # the old text: nothing accepted
    gate = DraftGate(costs=_table(), probe_every=4)
    gate.inherit(pool)
    assert not gate.best_is_speculate()
    while not gate.draft_next():
        gate.record(False, 1, 20.0)
    gate.record(True, 4, 30.0, expected=3.7, packed=5, masses=MASSES)  # the try accepts 3 of 2.7
    assert gate.pool is None and gate.correction > 1.0 and gate._best  # drafting on (after one AR re-read)


def test_new_text_tries_come_ever_more_rarely_while_they_find_ar_and_every_arrival_once_one_finds_drafting():
    pool = EngineEvidence()

    def due(n: int) -> list[bool]:
        return [pool.new_text_due() for _ in range(n)]
    assert due(3) == [True] * 3
    pool.new_text_tried(found=False)
    assert due(4) == [False, True, False, True]  # every 2nd
    pool.new_text_tried(found=False)
    assert due(8) == [False, False, False, True] * 2  # every 4th
    for _ in range(5):
        pool.new_text_tried(found=False)
    assert due(16) == ([False] * 7 + [True]) * 2  # at most every 8th (NEW_TEXT_EVERY)
    pool.new_text_tried(found=True)
    assert due(2) == [True, True]


def test_pooled_masses_are_the_windows_mean_not_the_last_few_request_rounds():
    """One request-round's masses swing (c = 4, 2-core CPU: sums 0.6-6.4 about ~2.5), and a new batch is priced
    on the pool: a batch's last few low rounds must not set the next batch's price."""
    evidence = EngineEvidence()
    evidence.add(2, 2.0, MASSES, 5, confirmed=0)
    evidence.add(2, 2.0, MASSES / 2, 5, confirmed=0)
    assert np.allclose(evidence.masses, 0.75 * MASSES)  # the mean of the first rounds, not an EWMA from the first
    for _ in range(60):
        evidence.add(3, 3.0, MASSES, 5, confirmed=0)
    for _ in range(5):  # the batch's last uncapped rounds, drafting on text the head is unsure of
        evidence.add(1, 1.5, MASSES / 4, 5, confirmed=0)
    assert evidence.masses.sum() > 0.85 * MASSES.sum()  # an EWMA of weight 0.2 read 0.43x here
    for _ in range(200):  # the texts did change: the pool follows within its window
        evidence.add(1, 1.5, MASSES / 4, 5, confirmed=0)
    assert evidence.masses.sum() < 0.3 * MASSES.sum()


def test_one_lucky_token_in_a_try_does_not_restart_the_evidence_where_chance_gives_it_often():
    """At T = 1 a try that accepts 1 token of the drafter's 1.7 forecast, where the request's evidence expects
    ~0.2 (a ~20% chance), says nothing about a changed text: the evidence and the pool stay, and the gate keeps
    AR. The same try where the evidence expects almost nothing (a text the head never got right) restarts it."""
    from cast_trtllm.probe_backoff import text_changed

    assert not text_changed(1, 1.7, 0.2) and not text_changed(1, 0.6, 0.2) and not text_changed(2, 1.9, 0.34)
    assert text_changed(3, 2.7, 0.01) and text_changed(2, 1.7, 0.05) and text_changed(1, 1.7, 0.02)
    assert not text_changed(0, 1.7, 0.0) and not text_changed(1, 3.0, 0.0)  # under PROMISING of the forecast
    assert not text_changed(1, 0.0, 0.0)  # a try with no forecast
    pool = EngineEvidence()
    for i in range(50):  # the old text: 1 forecast token a round, a fifth of them accepted
        pool.add(2 if i % 5 == 0 else 1, 2.0, MASSES, 5, confirmed=2)
    for accepted, restarts in ((1, False), (3, True)):
        gate = DraftGate(costs=_table(), probe_every=4)
        gate.inherit(pool)
        gate.realized, gate.predicted = 0.2, 4.0  # this request's own: 0.2 of 4 forecast tokens accepted
        while not gate.draft_next():
            gate.record(False, 1, 20.0)
        before = gate.correction
        assert 0.05 < before < 0.2 and not gate.best_is_speculate()  # AR: a try's 1 token is a 15-25% chance
        gate.record(True, 1 + accepted, 30.0, expected=2.7, packed=5, masses=MASSES)  # the try: of 1.7 forecast
        assert (gate.pool is None) == restarts and (gate.correction > 1.0) == restarts
