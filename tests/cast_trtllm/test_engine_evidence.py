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


@pytest.mark.parametrize("call", [lambda: EngineEvidence(decay=0.0), lambda: EngineEvidence(alpha=1.5),
                                  lambda: EngineEvidence().add(0, 2.0, MASSES, 5, 0),
                                  lambda: EngineEvidence().add(2, 0.5, MASSES, 5, 0)])
def test_bad_input_is_refused(call):
    with pytest.raises(ValueError, match="EngineEvidence|drafted round"):
        call()
