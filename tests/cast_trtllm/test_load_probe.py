"""Under load the other arm is probed for the whole batch at once, only when it is a close
call, ever more rarely while probes confirm AR."""

import numpy as np
import pytest

from cast_trtllm.cost_model import OnlineCostModel
from cast_trtllm.load_probe import LoadProbe

MASSES = [np.array([0.9, 0.8, 0.6])] * 8


def _table(tree_ms: float) -> OnlineCostModel:
    """Batch 8: AR rounds 20 ms, drafted rounds `tree_ms` + 10 ms of drafting."""
    model = OnlineCostModel(buckets=(1, 2, 4, 8), probe_every=10_000)
    model.observe_draft(10.0, batch=8)
    for _ in range(3):
        model.observe_verify(8, 20.0, batch=8)
        for bucket in (2, 4, 8):
            model.observe_verify(8 * bucket, tree_ms, batch=8)
    return model


def test_a_close_call_is_probed_after_every_rounds_then_ever_more_rarely_while_ar_is_confirmed():
    probe = LoadProbe(_table(60.0), every=4, max_backoff=2)  # 8 * 3.3 / 70 = 0.38 tok/ms vs AR 0.4
    rounds = []
    for i in range(60):
        if probe.due(MASSES, 8):
            rounds.append(i)
            probe.confirmed(still_ar=True)
    assert list(np.diff([-1] + rounds)) == [4, 8, 16, 16, 16]


def test_a_probe_that_turns_the_batch_to_drafting_resets_the_interval():
    probe = LoadProbe(_table(60.0), every=4, max_backoff=2)
    for _ in range(12):  # two confirming probes: the interval is 16
        if probe.due(MASSES, 8):
            probe.confirmed(still_ar=True)
    assert probe.interval == 16
    probe.confirmed(still_ar=False)
    assert probe.interval == 4


def test_drafting_priced_far_below_ar_is_probed_at_the_longest_interval_once_two_probes_confirmed_ar():
    """Far off, a try rarely wins, but the text may turn predictable: it is still looked at."""
    probe = LoadProbe(_table(120.0), every=2, max_backoff=4)  # 8 * 3.3 / 130 = 0.2 tok/ms vs 0.4
    rounds = []
    for i in range(100):
        if probe.due(MASSES, 8):
            rounds.append(i)
            probe.confirmed(still_ar=True)
    assert list(np.diff([-1] + rounds)) == [2, 4, 32, 32]
    probe = LoadProbe(_table(60.0))
    assert not any(probe.due([], 8) for _ in range(50))  # no request has masses yet


@pytest.mark.parametrize("kwargs", [{"every": 0}, {"max_backoff": -1}, {"margin": 0.0}, {"margin": 1.5}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError, match="LoadProbe"):
        LoadProbe(_table(60.0), **kwargs)


def test_a_probe_that_cannot_pay_back_its_context_pass_waits_while_the_batch_finishes():
    """8 requests with 10 rounds left: 0.25 x 10 x 20 ms cannot cover a 40 ms drafted round plus a
    500 ms context pass over their prompts; with 400 rounds left it can."""
    for horizon, fires in ((10, False), (400, True)):
        probe = LoadProbe(_table(60.0), every=4)
        assert any(probe.due(MASSES, 8, once_ms=500.0, horizon=horizon) for _ in range(20)) == fires
