"""The draft gate plays the arm (drafted round or AR round) with more tokens per measured ms."""

import numpy as np
import pytest

from cast_trtllm.draft_gate import DraftGate
from cast_trtllm.engine_evidence import EngineEvidence


def _play(gate: DraftGate, rounds: int, spec_tokens: float, spec_ms: float, ar_ms: float) -> list[bool]:
    """Run `rounds` rounds against fixed arm outcomes; returns which rounds drafted."""
    drafted = []
    for _ in range(rounds):
        d = gate.draft_next()
        gate.record(d, round(spec_tokens) if d else 1, spec_ms if d else ar_ms)
        drafted.append(d)
    return drafted


def test_first_round_drafts_and_second_measures_ar():
    gate = DraftGate()
    assert gate.draft_next()
    gate.record(True, 3, 100.0)
    assert not gate.draft_next()
    gate.record(False, 1, 70.0)
    assert gate.draft_next()  # 3 / 100 > 1 / 70


def test_speculates_when_drafted_rounds_pay_and_still_probes_ar():
    gate = DraftGate(probe_every=16)
    drafted = _play(gate, 200, spec_tokens=2, spec_ms=100.0, ar_ms=70.0)  # 0.020 vs 0.014 tok/ms
    assert sum(drafted) >= 185 and gate.rounds[1] >= 200 // 17  # AR is re-measured every 16 rounds


def test_falls_back_to_ar_when_drafting_does_not_pay_and_retries_ever_more_rarely():
    gate = DraftGate(probe_every=16)
    drafted = _play(gate, 400, spec_tokens=1, spec_ms=90.0, ar_ms=70.0)
    tries = [i for i, d in enumerate(drafted) if d]
    assert tries[0] == 0 and list(np.diff(tries)) == [16, 33, 65, 129]  # each confirming try doubles the wait


def test_an_unlucky_probe_does_not_trap_the_gate_in_ar_when_forecasts_say_drafting_pays():
    """Realized R of one round is 1 most of the time even when its mean is 1.6; the
    calibrated forecast (1 + sum of node masses) keeps the estimate near the mean."""
    gate = DraftGate(probe_every=16)
    lengths = [1, 1, 3, 1, 2, 1, 1, 3, 1, 2] * 20  # mean 1.6 tokens per drafted round
    drafted = []
    for R in lengths:
        d = gate.draft_next()
        gate.record(d, R if d else 1, 100.0 if d else 70.0, expected=1.6 if d else None)  # 0.016 vs 0.0143
        drafted.append(d)
    assert sum(drafted) >= 0.9 * len(drafted)


def test_forecasts_of_an_over_confident_head_are_corrected_by_what_the_request_accepts():
    gate = DraftGate(probe_every=16)
    for _ in range(60):  # the head promises 1.8 tokens a round, the target accepts none
        d = gate.draft_next()
        gate.record(d, 1, 100.0 if d else 70.0, expected=1.8 if d else None)
    assert gate.correction < 0.35 and not gate.draft_next() and gate.rounds[0] <= 60 // 16 + 4


def test_follows_a_change_of_domain_within_its_longest_wait():
    gate = DraftGate(probe_every=4, max_backoff=2)
    _play(gate, 60, spec_tokens=1, spec_ms=90.0, ar_ms=70.0)  # chat-like: AR wins; tries wait up to 16 rounds
    later = _play(gate, 60, spec_tokens=4, spec_ms=100.0, ar_ms=70.0)  # math-like: drafting wins
    assert sum(later[20:]) >= 40 - 40 // 4 - 1  # by then it speculates but for its AR probes


def test_a_try_is_skipped_when_the_request_has_too_few_tokens_left_to_win_it_back():
    """With 3 tokens left, a try costing 20 ms over a 70 ms AR round plus a 100 ms context
    pass could win at most 0.25 x 3 x 70 ms: the gate stays AR. With 100 left it tries."""
    for horizon, tries in ((3, False), (100, True)):
        gate = DraftGate(probe_every=4, horizon=horizon, stale_rows=100, context_row_ms=1.0)
        _play(gate, 30, spec_tokens=1, spec_ms=90.0, ar_ms=70.0)
        gate.stale_rows = 100
        assert any(_play(gate, 40, spec_tokens=1, spec_ms=90.0, ar_ms=70.0)) == tries


@pytest.mark.parametrize("kwargs, message", [({"alpha": 0.0}, "alpha"), ({"probe_every": 1}, "probe_every")])
def test_bad_gate_settings_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DraftGate(**kwargs)


def test_a_round_without_tokens_or_time_is_rejected():
    with pytest.raises(ValueError, match="commits >= 1 token"):
        DraftGate().record(True, 0, 10.0)
    with pytest.raises(ValueError, match="expected committed length"):
        DraftGate().record(True, 1, 10.0, expected=0.5)


def _flat_table():
    """Verify costs 20 ms at every width, drafting 5 ms: any tree with mass beats AR."""
    from cast_trtllm.cost_model import OnlineCostModel

    model = OnlineCostModel(prior={1: 20.0, 128: 20.0}, prior_draft_ms=5.0)
    for bucket in model.buckets:
        for _ in range(3):
            model.observe_verify(bucket, 20.0)
    return model


def test_with_costs_one_empty_tree_does_not_lock_the_request_into_ar():
    """The gate prices the width rule's best tree on the request's typical masses, not
    the last tree: an unlucky round that built no tree (N = 0) leaves drafting on."""
    gate = DraftGate(costs=_flat_table())
    rich = np.array([0.9, 0.8, 0.7, 0.5, 0.3])
    gate.record(True, 4, 30.0, expected=3.2, packed=6, masses=rich)
    gate.record(True, 1, 25.0, expected=1.0, packed=1, masses=np.zeros(5))  # an empty tree
    assert gate.draft_next()


def test_with_costs_a_request_whose_trees_cannot_pay_runs_ar():
    gate = DraftGate(costs=_flat_table())
    for _ in range(3):
        gate.record(True, 1, 30.0, expected=1.01, packed=2, masses=np.array([0.01]))
    assert not gate.best_is_speculate()


def _table(ar_ms: float, tree_ms: float):
    """A cost table at batch 8: AR rounds `ar_ms`, a drafted round `tree_ms` + 10 ms of drafting."""
    from cast_trtllm.cost_model import OnlineCostModel

    model = OnlineCostModel(buckets=(1, 2, 4, 8), prior_draft_ms=10.0, probe_every=10_000)
    for _ in range(3):
        model.observe_verify(8, ar_ms, batch=8)
        for bucket in (2, 4, 8):
            model.observe_verify(8 * bucket, tree_ms, batch=8)
    return model


def _loaded_gate(model, masses) -> DraftGate:
    donor = EngineEvidence()  # the engine's pooled drafted rounds
    donor.add(1 + round(masses.sum()), 1 + masses.sum(), masses, 4, confirmed=0)
    gate = DraftGate(costs=model, probe_every=4)
    gate.inherit(donor)
    gate.batch = 8
    return gate


def _rounds(gate: DraftGate, n: int, masses) -> list[bool]:
    drafted = []
    for _ in range(n):
        d = gate.draft_next()
        drafted.append(d)
        gate.record(d, 1 + round(masses.sum()) if d else 1, 50.0, expected=1 + masses.sum() if d else None,
                    packed=4 if d else None,
                    masses=masses if d else None, batch=8)
    return drafted


@pytest.mark.parametrize("tree_ms", [80.0, 60.0])  # drafting far from AR, and close to it
def test_under_load_inherited_masses_decide_the_first_round_and_the_gate_never_probes_alone(tree_ms):
    masses = np.array([0.9, 0.8, 0.6])
    gate = _loaded_gate(_table(ar_ms=20.0, tree_ms=tree_ms), masses)  # best drafted 8 * 3.1 / (10 + tree_ms) < 0.4
    assert _rounds(gate, 40, masses) == [False] * 40  # no drafted first round, no probe of its own


def test_with_costs_the_gate_prices_both_arms_at_the_rounds_batch():
    """A compute-bound machine: verify costs grow with the pass's packed tokens, so a tree
    that pays alone (B = 1: one token's pass is as dear as seven) does not pay when 16
    requests share the pass (16 AR tokens cost what 16 trees' roots cost)."""
    from cast_trtllm.cost_model import OnlineCostModel

    model = OnlineCostModel(buckets=(1, 4, 8), prior={1: 30.0, 8: 32.0, 16: 40.0, 128: 300.0},
                            prior_draft_ms=3.0, probe_every=10_000)
    masses = np.array([0.8, 0.6, 0.3])
    alone, loaded = DraftGate(costs=model), DraftGate(costs=model)
    for gate, batch in ((alone, 1), (loaded, 16)):
        for _ in range(4):
            gate.record(True, 2, 40.0, expected=2.7, packed=4, masses=masses, batch=batch)
    assert alone.best_is_speculate() and not loaded.best_is_speculate()
    with pytest.raises(ValueError, match="batch"):
        alone.record(True, 2, 40.0, batch=0)


def test_an_inherited_gain_that_cannot_repay_the_prompt_pass_waits_until_a_try_is_cheap_enough():
    """Drafting priced barely above AR on another request's masses cannot repay a 150-row context
    pass (75 ms) over 20 tokens, and a try would cost 4 AR rounds (the pass and a 5 ms dearer
    round): it waits 4 / PROBE_SHARE = 40 rounds, longer than the request lives, so it stays on
    AR. With a cheap pass (1.5 ms) the same priced gain repays it and the request drafts at once."""
    from cast_trtllm.cost_model import OnlineCostModel
    from cast_trtllm.probe_backoff import PROBE_SHARE

    model = OnlineCostModel(buckets=(1, 4), prior={1: 20.0, 4: 21.0, 128: 300.0}, prior_draft_ms=4.0,
                            probe_every=10_000)
    donor = EngineEvidence()  # the engine's pooled drafted rounds
    donor.add(2, 1.3, np.array([0.2, 0.05, 0.05]), 4, confirmed=0)
    for row_ms, first_try in ((0.5, None), (0.01, 0)):
        gate = DraftGate(costs=model, probe_every=4, horizon=20, stale_rows=150, context_row_ms=row_ms)
        gate.inherit(donor)
        assert gate.best_is_speculate()
        if first_try is None:
            assert gate.probe_wait() == round((5.0 + 75.0) / 20.0 / PROBE_SHARE) == 40
        drafted = []
        for _ in range(8):
            d = gate.draft_next()
            drafted.append(d)
            gate.record(d, 1, 20.0, expected=1.3 if d else None, packed=4 if d else None)
            gate.horizon -= 1
        assert (drafted.index(True) if True in drafted else None) == first_try


def test_a_try_costs_at_most_probe_share_of_the_ar_rounds_it_waits():
    """The backoff's wait has a floor: a try costing 2 AR rounds more than the AR round it
    replaces waits 2 / PROBE_SHARE rounds, also at the longest wait; a cheap one keeps the backoff."""
    from cast_trtllm.probe_backoff import PROBE_SHARE, ProbeBackoff

    backoff = ProbeBackoff(every=4, max_backoff=3)
    assert backoff.interval(cost_rounds=0.1) == 4 and backoff.interval(cost_rounds=2.0) == round(2 / PROBE_SHARE)
    backoff.confirmed = 2  # settled, and priced far below AR: the longest wait, unless the floor is longer
    assert backoff.interval(0.5, cost_rounds=0.1) == 32 and backoff.interval(0.5, cost_rounds=5.0) == 50


def test_under_load_an_inherited_gain_that_cannot_repay_the_prompt_pass_does_not_draft():
    """In a batch of 8 the table decides from the first round, but a request's first draft also
    pays the drafter's context pass over its prompt: its share of the batch's saving (here 32 ms
    over its 20 tokens, not 8 x 32: the other 7 pay their own passes) must cover it."""
    from cast_trtllm.cost_model import OnlineCostModel

    model = OnlineCostModel(buckets=(1, 4), prior={1: 20.0, 8: 20.5, 32: 22.0, 128: 30.0, 512: 60.0},
                            prior_draft_ms=4.0, probe_every=10_000)  # a flat (memory-bound) machine
    donor = EngineEvidence()  # the engine's pooled drafted rounds
    donor.add(3, 2.5, np.array([0.9, 0.8, 0.6]), 4, confirmed=0)
    for row_ms, drafts in ((0.01, True), (0.5, False)):  # a 1 ms or a 50 ms pass over 100 prompt rows
        gate = DraftGate(costs=model, horizon=20, stale_rows=100, context_row_ms=row_ms, batch=8)
        gate.inherit(donor)
        assert gate.best_is_speculate() and gate.draft_next() == drafts


def test_with_costs_a_drafting_gate_plays_ar_only_to_read_the_tables_ar_cell():
    """Priced by the table, AR needs no re-measuring every probe_every rounds (at R = 2.5 each such
    round costs 1.5 tokens): the gate plays AR until ell(1) has min_readings readings, then drafts on."""
    from cast_trtllm.cost_model import OnlineCostModel

    model = OnlineCostModel(buckets=(1, 4), prior={1: 20.0, 4: 21.0, 128: 300.0}, prior_draft_ms=4.0,
                            probe_every=10_000)
    gate, played = DraftGate(costs=model), []
    for _ in range(40):
        d = gate.draft_next()
        played.append(d)
        model.observe_verify(4 if d else 1, 25.0 if d else 20.0)
        gate.record(d, 3 if d else 1, 29.0 if d else 20.0, expected=2.5 if d else None, packed=4 if d else None,
                    masses=np.array([0.9, 0.8, 0.6]) if d else None)
    assert played.count(False) == model.min_readings == 3 and not model.needs_reading(1)
    assert all(played[-20:])
    model.rounds += model.refresh_rounds + 1  # unread for refresh_rounds: read again, within probe_every rounds
    assert model.needs_reading(1) and not all(gate.draft_next() for _ in range(gate.probe_every))


def test_alone_a_new_request_on_inherited_ar_evidence_tries_its_new_text_once_where_that_is_cheap():
    """Its text is new: one try in its first round, if that try (a drafted round 5 ms dearer plus a 90-row
    context pass at 0.05 ms) costs at most PROBE_SHARE of the AR rounds it has left."""
    from cast_trtllm.cost_model import OnlineCostModel

    model = OnlineCostModel(buckets=(1, 4), prior={1: 20.0, 4: 21.0, 128: 300.0}, prior_draft_ms=4.0,
                            probe_every=10_000)
    donor = EngineEvidence()  # the engine's pooled drafted rounds
    donor.add(1, 1.1, np.array([0.05, 0.01]), 4, confirmed=0)  # AR wins on its text
    for horizon, tries in ((24, True), (4, False)):  # (5 + 4.5) / 20 = 0.48 AR rounds <= 0.05 x 24, > 0.05 x 4
        gate = DraftGate(costs=model, horizon=horizon, stale_rows=90, context_row_ms=0.05)
        gate.inherit(donor)
        assert not gate.best_is_speculate() and gate.draft_next() == tries


def test_a_drafting_gate_re_prices_only_when_its_masses_shrink_past_the_priced_win():
    """While drafting wins with room to spare, steady rounds skip the width rule (0.13 ms a request a
    round); a round whose masses shrink past the priced win re-prices, and so does the probe_every-th."""
    rich, priced = np.array([0.9, 0.8, 0.7, 0.5, 0.3]), []
    real = DraftGate.best_is_speculate

    class Counting(DraftGate):
        def best_is_speculate(self, doubt=False):
            priced.append(len(drafted))
            return real(self, doubt)
    gate = Counting(costs=_flat_table(), probe_every=4, alpha=1.0)  # typical masses: the newest round's
    drafted = []
    for _ in range(10):
        gate.record(True, 4, 30.0, expected=1 + rich.sum(), packed=6, masses=rich)
        drafted.append(gate.draft_next())
    assert all(drafted) and gate._rates[0] > 1.2 * gate._rates[1]
    assert len(priced) <= 4  # the first rounds, then once every probe_every
    n = len(priced)
    gate.record(True, 1, 30.0, expected=1 + rich.sum(), packed=6, masses=np.full(5, 0.001))  # a collapse
    assert len(priced) == n + 1 and not gate.draft_next()


def test_a_try_from_ar_sizes_its_tree_at_the_drafters_own_forecast():
    """A gate playing AR marks its drafted round a try (the engine sizes its tree unscaled: acceptance
    learned on random words would shrink it to a node or none); a drafting gate's rounds are not."""
    from cast_trtllm.cost_model import OnlineCostModel

    dear = OnlineCostModel(prior={1: 20.0, 128: 400.0}, prior_draft_ms=10.0)  # wide trees cost a lot
    gate = DraftGate(costs=dear)
    for _ in range(6):
        gate.record(True, 1, 30.0, expected=3.0, packed=6, masses=np.array([0.9, 0.8, 0.7, 0.5, 0.3]))
    assert not gate.draft_next() and gate.correction < 0.5 and gate.trying
    drafting = DraftGate(costs=_flat_table())
    drafting.record(True, 3, 30.0, expected=2.5, packed=6, masses=np.array([0.9, 0.8, 0.7]))
    assert drafting.draft_next() and not drafting.trying


def test_a_new_request_inherits_the_engines_backoff_only_up_to_settled_tries():
    """The engine's tries confirmed AR 5 times on other texts; a new text starts 2 tries in: on a close
    call its next try comes within every << 2 rounds, where drafting is priced far off the longest wait."""
    donor = EngineEvidence()
    donor.add(2, 2.5, np.array([0.9, 0.5, 0.2]), 4, confirmed=5)
    gate = DraftGate(probe_every=4)
    gate.inherit(donor)
    assert gate.backoff.confirmed == 2
    assert gate.backoff.interval(priced=0.95) == 4 << 2
    assert gate.backoff.interval(priced=0.5) == gate.backoff.longest


def _read_at(batch: int):
    """A table read at `batch`: verify rounds of 1 / 2 / 4 / 8 packed tokens a request at 20 / 24 / 28 / 36 ms."""
    from cast_trtllm.cost_model import OnlineCostModel

    model = OnlineCostModel(buckets=(1, 2, 4, 8), prior_draft_ms=6.0, probe_every=10_000)
    for _ in range(3):
        for bucket, ms in ((1, 20.0), (2, 24.0), (4, 28.0), (8, 36.0)):
            model.observe_verify(bucket * batch, ms, batch)
    return model


def _misses(batch: int) -> tuple[int, int]:
    """A gate drafting on text whose forecasts come true, then on blocks accepting nothing: (the miss after
    which its correction alone prices AR, the one after which it plays AR)."""
    model = _read_at(batch)
    masses, pool = np.array([0.6, 0.4, 0.3]), EngineEvidence()
    for _ in range(40):  # the engine's evidence: forecasts come true
        pool.add(2, 2.3, masses, 4, confirmed=0)
    gate = DraftGate(costs=model)
    gate.inherit(pool)
    for committed in (3, 2, 3, 2, 3, 2):  # this text too
        gate.record(True, committed, 34.0, expected=2.3, packed=4, masses=masses, batch=batch)
    mean_says, plays = [], []
    for _ in range(20):
        gate.record(True, 1, 34.0, expected=2.3, packed=4, masses=masses, batch=batch)
        mean_says.append(gate.best_is_speculate())
        plays.append(gate.draft_next())
    assert not any(plays[plays.index(False):])
    return mean_says.index(False), plays.index(False)


def test_a_drafting_gate_turns_to_ar_on_evidence_beyond_its_noise_not_on_a_short_run_of_misses():
    """MT-Bench at B = 1: a few blocks in a row that accept nothing drop a drafting gate's correction
    below break-even while the text is as predictable as before (cast:3 1.15x AR; auto turned 30-45% of
    rounds to AR). Alone, a drafting gate turns to AR only where drafting loses at its correction one
    posterior sd up (`DraftGate.doubted`): later than the mean alone would, but once the misses go on, it
    does. Under load the same (c = 4, synthetic prompts: an answer's first blocks turned gates to AR that
    only the load probe brought back, auto 0.89x of cast:3); the realized guard judges what the batch measures."""
    for batch in (1, 4):
        turned, doubted = _misses(batch=batch)
        assert 2 <= turned < doubted <= turned + 6


def _pool(hits: int, masses: np.ndarray) -> EngineEvidence:
    """The engine's evidence after 40 drafted rounds forecasting 2.3 tokens, `hits` of them committing 2."""
    pool = EngineEvidence()
    for i in range(40):
        pool.add(2 if i < hits else 1, 2.3, masses, 4, confirmed=0)
    return pool


def test_an_answers_first_blocks_never_turn_an_inherited_drafting_gate_to_ar():
    """c = 4, synthetic prompts, runs back to back: the first 2 blocks of each answer accepted little
    (corrections 0.59-0.64), every inherited gate turned to AR after its 2nd round and the probe kept the
    batch there (cast:3 1.1x AR). A gate drafting from its first round on inherited evidence plays its
    first `min_drafted` drafted rounds whatever they accept; misses beyond them turn it to AR."""
    masses = np.array([0.6, 0.4, 0.3])
    gate = DraftGate(costs=_read_at(4), batch=4)
    gate.inherit(_pool(40, masses))
    plays = []
    for _ in range(8):
        gate.record(True, 1, 34.0, expected=2.3, packed=4, masses=masses, batch=4)
        plays.append(gate.draft_next())
    assert not gate.best_is_speculate(doubt=True)  # the misses price AR even one sd up
    assert plays[:gate.min_drafted - 1] == [True] * (gate.min_drafted - 1) and not any(plays[gate.min_drafted - 1:])


def test_a_try_from_ar_is_judged_at_its_correction_one_sd_up():
    """A try is one round: on text where drafting barely pays, one that accepted 1 of 2.5 forecast
    tokens (below `PROMISING`, so the evidence is not restarted) turned the gate back to AR, and the
    batch waited the probe's backoff (c = 4, synthetic prompts: a try of all 4 in the answers' 2nd round,
    then 128 rounds of AR). Judged at the doubted correction, as a drafting gate is, it drafts on; the
    next misses turn it off on the same rule."""
    masses = np.array([0.6, 0.4, 0.3])
    gate = DraftGate(costs=_read_at(4), batch=4)
    gate.inherit(_pool(32, masses))
    assert not gate.draft_next()  # the engine's evidence prices AR
    gate.record(False, 1, 20.0, batch=4)
    gate.record(True, 2, 34.0, expected=3.5, packed=4, masses=masses, batch=4)  # the try
    assert not gate.best_is_speculate() and gate.best_is_speculate(doubt=True)
    assert gate.draft_next()
    for _ in range(6):
        gate.record(True, 1, 34.0, expected=2.3, packed=4, masses=masses, batch=4)
    assert not gate.draft_next()
