"""Under load the other arm is probed for the whole batch at once, only when it is a close
call, ever more rarely while probes confirm AR."""

import numpy as np
import pytest

from cast_trtllm.cost_model import OnlineCostModel
from cast_trtllm.load_probe import LoadProbe
from cast_trtllm.probe_backoff import PROBE_SHARE

MASSES = [np.array([0.9, 0.8, 0.6])] * 8
TINY = [np.array([0.01, 0.01, 0.01])] * 8  # masses that hardly add a token


def _table(tree_ms: float, draft_ms: float = 10.0) -> OnlineCostModel:
    """Batch 8: AR rounds 20 ms, drafted rounds `tree_ms` + `draft_ms` of drafting."""
    model = OnlineCostModel(buckets=(1, 2, 4, 8), probe_every=10_000)
    model.observe_draft(draft_ms, batch=8)
    for _ in range(3):
        model.observe_verify(8, 20.0, batch=8)
        for bucket in (2, 4, 8):
            model.observe_verify(8 * bucket, tree_ms, batch=8)
    return model


def _probed(probe: LoadProbe, rounds: int, masses=MASSES, **due) -> list[int]:
    """The rounds a probe fires in, every one confirming AR."""
    fired = []
    for i in range(rounds):
        if probe.due(masses, 8, **due):
            fired.append(i)
            probe.confirmed(still_ar=True)
    return fired


def test_a_cheap_close_call_is_probed_after_every_rounds_then_ever_more_rarely_while_ar_is_confirmed():
    """A probe 1% dearer than an AR round (its floor: 1 round) on masses that hardly add a token."""
    probe = LoadProbe(_table(20.1, draft_ms=0.1), every=4, max_backoff=2)
    assert list(np.diff([-1] + _probed(probe, 60, TINY))) == [4, 8, 16, 16, 16]


def test_a_dear_probe_costs_at_most_probe_share_of_the_ar_rounds_between_probes():
    """A probe costing 2.5 AR rounds more than one (60 + 10 ms against 20 ms) waits 2.5 / 0.1 = 25
    rounds, whatever the backoff says, and the backoff's longer waits still follow."""
    assert PROBE_SHARE == 0.1
    probe = LoadProbe(_table(60.0), every=4, max_backoff=4)  # 8 * 3.3 / 70 = 0.38 tok/ms vs AR 0.4: close
    assert list(np.diff([-1] + _probed(probe, 200))) == [25, 25, 25, 32, 64]


def test_new_texts_priced_at_a_close_call_on_the_pools_evidence_are_probed_at_once_not_after_the_cost_floor():
    """Every gated request new: its price is other texts' evidence, so at a close call (>= margin) the probe is
    due in the batch's first round, not after the 25 rounds that hold an old batch's probes to PROBE_SHARE of
    its AR time; priced far below the margin, new texts wait as old ones do."""
    probe = LoadProbe(_table(60.0), every=4, max_backoff=4)  # a close call (0.95x AR) whose probe costs 2.5 rounds
    assert probe.due(MASSES, 8, new=True)
    probe.confirmed(still_ar=True)
    assert not any(probe.due(MASSES, 8) for _ in range(20))  # an old batch: the floor again
    far = LoadProbe(_table(200.0), every=4, max_backoff=4)
    assert not any(far.due(MASSES, 8, new=True) for _ in range(20))
    assert not LoadProbe(_table(60.0), every=4).due(MASSES, 8, held=True, new=True)  # a veto still holds


def test_no_probe_is_due_while_a_veto_of_the_realized_guard_holds_but_its_rounds_count_towards_the_wait():
    """A try during the hold could not lift the veto and would only back the probe off (c = 4: such a
    try doubled the wait and the batch played AR to its end where cast:3 won 1.18x)."""
    probe = LoadProbe(_table(20.1, draft_ms=0.1), every=4, max_backoff=2)
    assert not any(probe.due(TINY, 8, held=True) for _ in range(10))
    assert probe.interval == 4  # nothing was tried, so nothing backed off
    assert probe.due(TINY, 8)  # the held rounds counted: due on the first round after the hold


def test_between_probes_a_tick_says_no_probe_is_due_so_the_engine_prices_once_an_interval_at_most():
    """Issue 40: a batch playing AR pays for no pricing between probes but once an interval. `tick` is False
    but on the rounds the wait is priced (when the interval is over, then every interval of a longer wait)
    and the round it ends; `due` is `tick`, then `ready`."""
    ticking, due = (LoadProbe(_table(24.0, draft_ms=5.0), every=2, max_backoff=4) for _ in range(2))
    for probe in (ticking, due):  # two confirming tries: far off, the wait is the longest (32 rounds)
        _probed(probe, 10, TINY)
    ready, fired = [], []
    for i in range(100):
        if ticking.tick():
            ready.append(i)
            if ticking.ready(TINY, 8):
                fired.append(i)
                ticking.confirmed(still_ar=True)
    assert fired == _probed(due, 100, TINY)  # the same rounds as `due`
    assert list(np.diff(fired)) == [32, 32]
    assert set(fired) <= set(ready)
    # the longest wait (32) is priced again every interval (8 rounds after two confirming tries, then 16, 32)
    assert ready == [7, 15, 23, 31, 47, 63, 95]


def test_a_long_wait_priced_on_a_slow_table_is_priced_again_when_the_table_recovers():
    """A price read while the machine ran slow (c = 4 continuous, 2-core CPU: drafting priced 0.76x AR where
    cast:3 won 1.08x) must not hold the batch on AR for the whole longest wait: every interval the wait is
    priced again, and once the table prices drafting a close call the probe is due at the backoff's interval."""
    costs = _table(24.0, draft_ms=5.0)  # drafting 0.24 more tokens in 29 ms against 20: 0.8x AR, far off
    probe = LoadProbe(costs, every=2, max_backoff=4)
    assert _probed(probe, 10, TINY) == [4, 9]  # two tries confirmed AR (each 0.45 AR round dearer: waits >= 5)
    assert _probed(probe, 12, TINY) == []  # priced 8 rounds in: still far off, the wait is the longest (32)
    for _ in range(costs.window):  # the machine is fast again: the drafted cells read 20.1 ms, the draft 0.1
        costs.observe_draft(0.1, batch=8)
        for bucket in (2, 4, 8):
            costs.observe_verify(8 * bucket, 20.1, batch=8)
    assert _probed(probe, 14, TINY) == [3]  # priced again 16 rounds in: a close call, due now, not at 32


def test_a_probe_that_turns_the_batch_to_drafting_resets_the_interval():
    probe = LoadProbe(_table(20.1, draft_ms=0.1), every=4, max_backoff=2)
    assert len(_probed(probe, 12, TINY)) == 2  # two confirming probes: the interval is 16
    assert probe.interval == 16
    probe.confirmed(still_ar=False)
    assert probe.interval == 4


def test_drafting_priced_far_below_ar_is_probed_at_the_longest_interval_once_two_probes_confirmed_ar():
    """Far off, a try rarely wins, but the text may turn predictable: it is still looked at. The
    probe costs 0.45 AR rounds (24 + 5 ms against 20 ms), so the first two wait 5 rounds, not 2 and 4."""
    probe = LoadProbe(_table(24.0, draft_ms=5.0), every=2, max_backoff=4)  # at best 8 / 25 = 0.32 tok/ms vs 0.4
    assert list(np.diff([-1] + _probed(probe, 100, TINY))) == [5, 5, 32, 32]
    probe = LoadProbe(_table(60.0))
    assert not any(probe.due([], 8) for _ in range(50))  # no request has masses yet


def test_only_a_few_requests_drafting_in_a_big_batch_must_pay_for_their_draft_pass():
    """Each gate prices drafting as if the whole batch drafted like it; one request drafting in 8
    gains its own tokens for the whole draft pass (10 ms on a 20 ms AR round): that loses."""
    probe = LoadProbe(_table(24.0, draft_ms=10.0))
    assert probe.settle(MASSES, [], 8) == (True, False)  # all eight: 8 + 8 x 2.3 tokens in 34 ms against 8 in 20
    assert probe.settle(MASSES[:1], [], 8) == (False, False)  # one: 8 + 2.3 tokens in ~34 ms
    assert probe.settle([], MASSES, 8) == (False, False)  # nobody asked: nobody drafts


def test_requests_playing_ar_join_a_round_that_drafts_where_their_few_best_nodes_pay_for_their_draft_rows():
    """In a round that drafts anyway every row is padded to its bucket: gates that priced drafting just
    under AR (each as if the whole batch drafted like it) join where the pooled round gains more
    than their share of the draft pass costs; requests whose masses add nothing stay out."""
    probe = LoadProbe(_table(24.0, draft_ms=10.0))
    probe.costs.observe_draft(5.0, batch=4)  # the draft pass grows with the requests that draft
    middling = [np.array([0.6, 0.4, 0.3])] * 4
    assert probe.settle(MASSES[:4], middling, 8) == (True, True)
    assert not probe.settle(MASSES[:4], TINY[:4], 8)[1]  # 0.12 more tokens for 5 ms more drafting
    assert probe.settle([], middling, 8) == (False, False) and not probe.settle(MASSES[:4], [], 8)[1]


def test_a_joiner_is_priced_by_the_nodes_its_own_padded_rows_hold_not_against_the_others_nodes():
    """Every request's rows are padded to the round's bucket, so a joiner's best nodes take no one's slot.
    Priced as one pool, 7 drafting requests at bucket 2 (one node each) filled the 8th request's slot with
    their own second nodes, and the joiner's 0.6 looked like no gain (c = 4 continuous, 2-core CPU: one
    request rode 30 drafted rounds on AR, 1 token each; auto 0.82x of cast:3). Its own slot gains 0.6
    tokens for a draft pass that costs no more at 8 than at 7."""
    wants, joiner = [np.array([0.9, 0.8, 0.6])] * 7, [np.array([0.6, 0.4, 0.3])]
    for draft_at_8, joins in ((10.0, True), (16.0, False)):  # at 16 ms, 0.6 tokens do not pay 6 ms more
        model = OnlineCostModel(buckets=(1, 2, 4, 8), probe_every=10_000)
        model.observe_draft(10.0, batch=7)
        model.observe_draft(draft_at_8, batch=8)
        for _ in range(3):
            for bucket, ms in ((1, 20.0), (2, 22.0), (4, 60.0), (8, 120.0)):
                model.observe_verify(8 * bucket, ms, batch=8)
        assert model.choose(np.sort(np.concatenate(wants))[::-1], 8, explore=False, drafting=7).bucket == 2
        assert LoadProbe(model).settle(wants, joiner, 8)[1] is joins


@pytest.mark.parametrize("kwargs", [{"every": 0}, {"max_backoff": -1}, {"margin": 0.0}, {"margin": 1.5},
                                    {"screen": 0.0}, {"span": 0}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError, match="LoadProbe"):
        LoadProbe(_table(60.0), **kwargs)


def test_a_probe_that_cannot_pay_back_its_context_pass_waits_while_the_batch_finishes():
    """8 requests with 10 rounds left: 0.25 x 10 x 20 ms cannot cover a 50 ms dearer round plus a
    500 ms context pass over their prompts; with 400 rounds left it can, once the 550 ms (27.5 AR
    rounds) are at most PROBE_SHARE of the rounds waited: at round 275."""
    for horizon, first in ((10, None), (400, 274)):
        probe = LoadProbe(_table(60.0), every=4)
        fired = _probed(probe, 300, once_ms=500.0, horizon=horizon)
        assert (fired[0] if fired else None) == first


def test_a_probe_first_screens_a_few_requests_and_tries_them_all_only_where_the_few_look_promising():
    """Two of 8 try first (their draft pass and one node each priced, not 8 drafting at bucket 4); their
    fresh masses, as if all 8 drafted like them, decide whether the next round tries every request."""
    probe = LoadProbe(_table(60.0), every=4)
    assert probe.trying(8) == 2 and probe.screening
    assert probe.trying(1) == 1 and not probe.screening  # a screen of all is a full probe
    fired = [i for i in range(40) if probe.due(MASSES, 8, trying=probe.trying(8))]
    assert fired and fired[0] < 25  # cheaper than the full probe's 25-round floor (test above)
    assert not probe.screened(TINY[:1], 8)  # hardly a token more: AR confirmed, the wait grows
    assert probe.interval == 8 and probe.trying(8) == 2
    probe.costs.observe_draft(1.0, batch=8)
    for _ in range(3):
        probe.costs.observe_verify(8 * 4, 21.0, batch=8)  # trees now cost little: the screen finds drafting pays
    assert probe.screened([np.array([0.95, 0.9, 0.85])], 8)
    assert probe.trying(8) == 8 and not probe.screening
    assert probe.due(MASSES, 8, trying=8)  # at once, not after the interval
    probe.confirmed(still_ar=False)
    assert probe.trying(8) == 2 and probe.interval == 4


def test_a_screen_is_never_one_nodes_trial_where_a_second_request_can_be_left_out():
    """A screen of one request is one node's Bernoulli trial; at least SCREEN_MIN requests screen where
    that still leaves one out (at 2 one screens, at 1 the probe tries all), and the share rules above it."""
    probe = LoadProbe(_table(60.0), every=4)
    sizes = {gated: probe.trying(gated) for gated in (1, 2, 3, 4, 8, 16, 17, 32)}
    assert sizes == {1: 1, 2: 1, 3: 2, 4: 2, 8: 2, 16: 2, 17: 3, 32: 4}
    assert probe.trying(4) == 2 and probe.screening


def test_a_screen_prices_one_node_for_its_few_and_their_draft_pass():
    """A screen verifies one node for each of its few: the pass pads all 8 rows to 2 tokens, and pays
    the draft pass of its few; 8 of 8 pay bucket 4 and the draft for 8."""
    probe = LoadProbe(_table(60.0, draft_ms=10.0))
    probe.costs.observe_draft(2.0, batch=1)
    assert probe._probe_ms(8, 1) == pytest.approx(probe.costs.round_ms(2, 8, drafted=False) + 2.0)
    assert probe._probe_ms(8, None) == pytest.approx(probe.costs.round_ms(4, 8))
    assert probe._probe_ms(8, 1) < probe._probe_ms(8, 8)


def test_a_promising_screen_tries_them_all_only_where_the_priced_gain_repays_that_probe():
    """Screened masses priced 8% above AR (8 x 3.78 tokens in 60 + 10 ms against 8 in 20 ms): the 7.4% of
    AR time a try of all 8 saves over 40 rounds (59 ms) cannot repay their context pass, 400 ms; over 1,000
    rounds (1.5 s) it can. Without a horizon (unbounded) it is tried."""
    fresh = [np.array([0.97, 0.93, 0.88])]
    for horizon, full in ((40, False), (1000, True), (None, True)):
        probe = LoadProbe(_table(60.0), every=4)
        rate, ar = probe.costs.best_rate(np.repeat(fresh[0], 8), 8), probe.costs.ar_rate(8)
        assert 1.0 < rate / ar < 1.1
        assert probe.screened(fresh, 8, once_ms=400.0, horizon=horizon) is full
        assert probe.interval == (4 if full else 8)  # a screen that does not lead on confirmed AR


def test_a_try_of_all_is_priced_by_the_tokens_its_rounds_commit_not_as_pure_cost_over_ar():
    """c = 4 continuous: pricing a try's 4 rounds as pure cost over AR turned down screens priced at 1.4x AR,
    and new arrivals played AR to the end where cast:3 won. Screened masses priced 1.65x AR (8 requests,
    trees 60 + 4 ms against a 20 ms AR round): the try's rounds commit more than AR would in their ms, so
    with 30 rounds left the gain (0.25 x 29 x 20 ms = 145 ms) need only repay the 40 ms context pass (as
    pure cost, 4 x 44 ms more would be out of reach); with 8 rounds left (35 ms) it cannot."""
    fresh = [np.array([0.97, 0.93, 0.88, 0.8, 0.7])]
    for horizon, full in ((30, True), (8, False)):
        probe = LoadProbe(_table(60.0, draft_ms=4.0), every=4)
        rate, ar = probe.costs.best_rate(np.repeat(fresh[0], 8), 8), probe.costs.ar_rate(8)
        assert rate / ar > 1.25 and probe._probe_ms(8, None) - probe.costs.round_ms(1, 8, drafted=False) == 44.0
        assert probe.screened(fresh, 8, once_ms=40.0, horizon=horizon) is full


def test_a_probe_counts_only_the_rounds_after_its_own_towards_its_gain():
    """A screen drafts nothing the batch keeps: a try of all follows, and only then could it draft.
    So its payback is priced over the rounds left after those two (one for a try of all): with 6 rounds
    left a cheap screen (0.25 x 4 x 20 ms = 20 ms covers 14 ms of extra cost) is due, with 4 left not,
    though 0.25 x 4 x 20 ms would cover it."""
    for horizon, due in ((6, True), (4, False)):
        probe = LoadProbe(_table(20.0, draft_ms=4.0), every=4)
        probe.costs.observe_draft(4.0, batch=1)
        fired = [i for i in range(8) if probe.due(TINY, 8, once_ms=10.0, horizon=horizon, trying=probe.trying(8))]
        assert probe.screening and probe.lead == 2 and bool(fired) is due


def test_a_backoff_learned_on_texts_that_have_all_left_gives_the_new_texts_a_fresh_look_then_settled_tries():
    """c = 4 continuous, runs back to back: a 32-round wait learned on GSM8K answers held the next batch of
    synthetic prompts (cast:3 1.04x AR) on AR for its whole run. A probe's verdict holds while one of the
    requests it was taken on is live. Then the new texts are looked at afresh (a screen after `every` rounds,
    whatever the old texts' price); a look that confirms AR puts the backoff at `settled` tries (the wait
    every << 2), and looks come every 2nd turnover, 4th, ... while they find AR."""
    probe = LoadProbe(_table(60.0), every=4, max_backoff=5)
    old, new, newer, newest = ([object(), object()] for _ in range(4))
    for _ in range(4):
        probe.confirmed(still_ar=True, live=old)
    assert probe.interval == 64
    probe.expire(old[1:] + new)
    assert probe.interval == 64  # one of them is still live
    probe.expire(new)
    assert probe.interval == 4  # all new: a fresh look
    probe.confirmed(still_ar=True, live=new)  # it found AR
    assert probe.interval == 16
    probe.expire(newer)
    assert probe.interval == 16  # the next turnover: no look (every 2nd now), settled tries
    probe.confirmed(still_ar=True, live=newer)
    probe.expire(newest)
    assert probe.interval == 4  # the 2nd turnover since the last look
    probe.confirmed(still_ar=False, live=newest)  # drafting turned on: nothing to expire, the waits start afresh
    probe.expire([])
    assert probe.interval == 4


def test_a_promising_screen_is_pending_until_the_try_of_all_is_read():
    """After a promising screen the next round tries every request, also where the screened ones now
    draft on their own (`LLMEngine._drafts` asks the probe whenever it is `pending`)."""
    probe = LoadProbe(_table(20.0, draft_ms=1.0), every=4)
    probe.trying(8)
    assert not probe.pending
    assert probe.screened([np.array([0.95, 0.9, 0.85])], 8)
    assert probe.pending and probe.trying(8) == 8
    assert probe.due(MASSES, 8, trying=8)
    probe.confirmed(still_ar=True)
    assert not probe.pending


@pytest.mark.parametrize("span", [1, 3])
def test_a_try_of_all_runs_span_rounds_before_the_gates_choices_are_judged(span):
    """An answer's first blocks accept less than its text will: c = 4 continuous, a try of all in the answers'
    2nd round, judged on that one round, held the batch on AR for its run (auto 87.0 tok/s, cast:3 95.2). The
    try stays pending (every gated request drafts) for `span` rounds; then `confirmed` reads the gates."""
    probe = LoadProbe(_table(20.0, draft_ms=1.0), every=4, span=span)
    probe.trying(8)
    assert probe.screened([np.array([0.95, 0.9, 0.85])], 8)
    rounds = 0
    while True:
        assert probe.pending and probe.trying(8) == 8 and probe.due(MASSES, 8, trying=8)
        rounds += 1
        if not probe.tried():
            break
    assert rounds == span and not probe.pending
