"""The online cost model learns ell(bucket) on the machine it runs on, whatever its prior says."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cast_trtllm.cost_cache import cost_cache_key, default_cache_dir
from cast_trtllm.cost_model import DEFAULT_BUCKETS, RATES_KEPT, OnlineCostModel, typical
from cast_trtllm.draft_gate import DraftGate
from cast_trtllm.width import WidthPolicy
from cast_trtllm.width import table_rule_width

BUCKETS = np.array(DEFAULT_BUCKETS)
MASSES = 0.95 * 0.9 ** np.arange(255)  # [255] sorted node masses of a peaked round
SLOW_MASSES = 0.9 * np.arange(1, 256) ** -0.8  # [255] a round whose width keeps paying a little
DRAFT_MS = 5.0


def true_ms(n):  # this machine: 20 ms + 0.9 ms per packed token (a 2-thread CPU, say)
    return 20.0 + 0.9 * np.asarray(n, np.float64)


def steep_prior() -> dict[int, float]:  # the shipped profile: 3x the slope (probed at 1 thread)
    return {int(n): 20.0 + 2.7 * n for n in BUCKETS}


def run_rounds(model: OnlineCostModel, rounds: int, seed: int = 0, outliers: float = 0.0,
               masses: np.ndarray = MASSES) -> list[int]:
    """Play `rounds` drafted rounds: each verify reads true_ms(bucket) with 2% noise, a share
    `outliers` of them 5x (a stall). Returns the budget chosen each round."""
    rng = np.random.default_rng(seed)
    budgets = []
    for _ in range(rounds):
        choice = model.choose(masses)
        ms = true_ms(choice.bucket) * (1 + 0.02 * rng.standard_normal())
        model.observe_verify(choice.budget + 1, ms * (5.0 if rng.random() < outliers else 1.0))
        model.observe_draft(DRAFT_MS * (1 + 0.02 * rng.standard_normal()))
        budgets.append(choice.budget)
    return budgets


def table_width(ms: np.ndarray, draft_ms: float = DRAFT_MS, masses: np.ndarray = MASSES) -> int:
    return table_rule_width(masses, BUCKETS, ms, draft_ms)[0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_3x_too_steep_prior_is_corrected_within_100_rounds_and_the_true_width_is_chosen(seed):
    truth = table_width(true_ms(BUCKETS))
    assert table_width(np.array(list(steep_prior().values()))) < truth  # the prior alone packs too narrow
    model = OnlineCostModel(prior=steep_prior())
    budgets = run_rounds(model, 100, seed=seed)
    assert table_width(model.verify_ms(), model.draft_ms()) == truth
    assert budgets[-12:].count(truth) >= 8  # the rest are neighbour probes
    read = [i for i, b in enumerate(DEFAULT_BUCKETS) if len(model.verify[1].get(b, [])) >= 3]
    np.testing.assert_allclose(model.verify_ms()[read], true_ms(BUCKETS[read]), rtol=0.05)
    np.testing.assert_allclose(model.verify_ms(), true_ms(BUCKETS), rtol=0.10)  # unread: filled


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ten_percent_stalls_do_not_move_the_learned_table(seed):
    model = OnlineCostModel(prior=steep_prior())
    run_rounds(model, 200, seed=seed, outliers=0.10)
    read = [i for i, b in enumerate(DEFAULT_BUCKETS) if len(model.verify[1].get(b, [])) >= 3]
    assert len(read) >= 3
    np.testing.assert_allclose(model.verify_ms()[read], true_ms(BUCKETS[read]), rtol=0.05)
    assert table_width(model.verify_ms(), model.draft_ms()) == table_width(true_ms(BUCKETS))


def test_cells_read_in_different_stretches_of_the_machine_keep_their_side_by_side_ratio():
    """A machine runs slow for stretches (2-core CPU: whole runs 10-15%). Where one arm runs alone for a while
    (each method's own run in the never_slower benchmark, a batch playing AR), its cell is read in that stretch
    and the other's in another; stored raw, the c = 4 table priced a drafted round 2.3x an AR round where side by
    side it ran 1.9-2.0x. The stretch moves the machine's speed, not the cells; the table answers in today's ms;
    a change read side by side still moves a cell against the other."""
    model = OnlineCostModel(buckets=(1, 4))
    ratio = lambda: model.verify_ms(4)[1] / model.verify_ms(4)[0]  # noqa: E731
    for _ in range(16):  # side by side: AR 40 ms, drafted 80 ms
        model.observe_verify(4, 40.0, batch=4)
        model.observe_verify(16, 80.0, batch=4)
    assert ratio() == pytest.approx(2.0)
    for _ in range(40):  # the AR arm alone through a slow stretch
        model.observe_verify(4, 52.0, batch=4)
    assert ratio() == pytest.approx(2.0) and model.verify_ms(4)[0] == pytest.approx(52.0)
    for _ in range(40):  # the drafted arm alone, the machine fast again
        model.observe_verify(16, 80.0, batch=4)
    assert ratio() == pytest.approx(2.0) and model.verify_ms(4)[0] == pytest.approx(40.0)
    for _ in range(32):  # side by side again: the drafted pass now costs 1.5x AR
        model.observe_verify(4, 40.0, batch=4)
        model.observe_verify(16, 60.0, batch=4)
    assert ratio() == pytest.approx(1.5, rel=0.05)
    for _ in range(3):  # a stall of a round or two moves neither the speed nor a cell
        model.observe_verify(4, 400.0, batch=4)
        model.observe_verify(16, 60.0, batch=4)
        model.observe_verify(16, 60.0, batch=4)
    assert model.verify_ms(4)[0] == pytest.approx(40.0, rel=0.05)


def test_a_cache_written_with_a_shorter_window_is_read_with_this_builds():
    model = OnlineCostModel(window=9)
    model.verify[1] = {1: [float(ms) for ms in range(11, 20)]}  # what a build with window 9 kept
    again = OnlineCostModel.from_dict(model.to_dict())
    assert again.window == OnlineCostModel().window and again.verify[1][1] == [float(ms) for ms in range(11, 20)]


def test_unmeasured_neighbours_are_probed_so_a_wrong_prior_cannot_lock_in_a_narrow_tree():
    prior = {int(n): 20.0 + 30.0 * n for n in BUCKETS}  # wildly steep: width looks ruinous
    model = OnlineCostModel(prior=prior, probe_every=4)
    first = model.choose(MASSES).bucket
    budgets = run_rounds(model, 120)
    assert len(model.verify[1]) >= 4  # buckets beyond the first choice were read
    assert budgets[-1] + 1 > first and table_width(model.verify_ms(), model.draft_ms()) == \
        table_width(true_ms(BUCKETS))


def test_every_probe_every_th_choice_plays_an_unread_neighbour_wider_first():
    model = OnlineCostModel(buckets=(1, 4, 8, 16), prior={1: 10.0, 4: 11.0, 8: 12.0, 16: 30.0}, probe_every=3)
    picks = [model.choose(MASSES).bucket for _ in range(3)]
    assert picks[:2] == [8, 8] and picks[2] == 16  # the third call probes the wider neighbour
    for _ in range(3):
        model.observe_verify(16, 30.0)
    assert [model.choose(MASSES).bucket for _ in range(3)][2] == 4  # wider is read: the narrower one


def test_without_a_prior_a_flat_machine_gets_wide_trees_and_a_steep_one_narrow_trees():
    flat, steep = OnlineCostModel(), OnlineCostModel()
    for b in DEFAULT_BUCKETS:
        for _ in range(3):
            flat.observe_verify(b, 20.0 + 0.01 * b)
            steep.observe_verify(b, 20.0 + 5.0 * b)
    assert flat.choose(SLOW_MASSES).budget == DEFAULT_BUCKETS[-1] - 1
    assert steep.choose(SLOW_MASSES).budget <= 3


def test_without_a_prior_two_read_widths_extrapolate_affinely_and_one_reads_flat():
    model = OnlineCostModel(buckets=(1, 8, 16, 32))
    model.observe_verify(8, 30.0)
    np.testing.assert_allclose(model.verify_ms(), [30.0] * 4)  # optimistic until a second width is read
    model.observe_verify(16, 38.0)
    np.testing.assert_allclose(model.verify_ms(), [23.0, 30.0, 38.0, 54.0])


def test_a_batch_without_readings_is_priced_by_packed_tokens_from_the_others():
    model = OnlineCostModel(buckets=(1, 2, 4, 8, 16, 32))
    for b in (1, 2, 4, 8, 16, 32):
        model.observe_verify(b, 10.0 + b)
    np.testing.assert_allclose(model.verify_ms(batch=4), 10.0 + 4 * np.array([1, 2, 4, 8, 16, 32]))
    model.observe_verify(8, 99.0, batch=4)  # 2 tokens each: its own cell now
    assert model.verify_ms(batch=4)[1] == 99.0


def learned_alone(verify_ms) -> OnlineCostModel:
    """A table read by one request only (B = 1, buckets 1..16, draft 8 ms), as a fresh engine
    has it when its first wave of concurrent requests joins."""
    model = OnlineCostModel(probe_every=10_000)
    for b in (1, 2, 4, 8, 16):
        for _ in range(3):
            model.observe_verify(b, float(verify_ms(b)))
    model.observe_draft(8.0)
    return model


def test_draft_cost_beyond_the_widest_batch_read_grows_as_the_verify_curve_does():
    steep = learned_alone(true_ms)  # compute-bound: a pass of 16 blocks costs ~7x one block
    ratio = true_ms(16 * steep.draft_rows) / true_ms(steep.draft_rows)
    assert steep.draft_ms(16) == pytest.approx(8.0 * ratio, rel=0.02)
    steep.observe_draft(20.0, batch=4)  # read at 4: interpolated up to it, scaled from it beyond
    assert steep.draft_ms(2) == pytest.approx(12.0)
    assert steep.draft_ms(16) == pytest.approx(20.0 * true_ms(256) / true_ms(64), rel=0.02)
    flat = learned_alone(lambda n: 20.0)  # memory-bound: one pass costs the same at any width
    assert flat.draft_ms(16) == pytest.approx(8.0)
    prior_only = OnlineCostModel(prior={1: 20.0, 256: 250.0}, prior_draft_ms=4.0)
    assert prior_only.draft_ms(1) == 4.0 and prior_only.draft_ms(8) > 4 * prior_only.draft_ms(1)


def test_a_table_learned_alone_prices_drafting_under_load_only_where_the_machine_pays_for_it():
    rounds = np.repeat(MASSES[:20] ** 2, 16)  # 16 requests drafting like the lone one did (2.9x AR alone)
    steep = learned_alone(true_ms)
    assert steep.best_rate(rounds, 16) < steep.ar_rate(16)  # 16 blocks of drafting cost ~7x one
    flat = learned_alone(lambda n: 20.0)
    assert flat.best_rate(rounds, 16) > flat.ar_rate(16)


def test_with_every_bucket_read_choose_agrees_with_width_policy_on_the_same_table():
    model = OnlineCostModel(probe_every=10_000, mass_exponent=1.5)
    for b in DEFAULT_BUCKETS:
        for _ in range(3):
            model.observe_verify(b, float(true_ms(b)))
    model.observe_draft(DRAFT_MS)
    policy = WidthPolicy(buckets=DEFAULT_BUCKETS, batch_sizes=(1,), bucket_ms=(tuple(true_ms(BUCKETS)),),
                         intercept_ms=(20.0,), slope_ms=(0.9,), fixed_ms=(DRAFT_MS,), mass_exponent=1.5)
    for masses in (MASSES, MASSES ** 3, np.full(40, 0.9)):
        assert model.choose(masses) == pytest.approx(policy.choose(masses))


def test_the_gate_with_costs_drafts_whenever_the_table_prices_the_tree_above_ar():
    model = OnlineCostModel(buckets=(1, 16), probe_every=10_000)
    for _ in range(3):
        model.observe_verify(1, 20.0)
        model.observe_verify(16, 28.0)
    model.observe_draft(5.0)
    assert model.draft_pays(2.0, 16) and not model.draft_pays(1.5, 16)  # 2/33 > 1/20 > 1.5/33
    gate, wall_clock = DraftGate(costs=model), DraftGate()
    for g in (gate, wall_clock):  # stalls made these drafted rounds slow on the wall clock
        g.record(True, 2, 80.0, expected=2.0, packed=16)
        g.record(False, 1, 20.0)
    assert gate.draft_next() and not wall_clock.draft_next()


def test_json_round_trip_keeps_readings_and_the_table(tmp_path):
    model = OnlineCostModel(prior=steep_prior(), prior_draft_ms=4.0)
    run_rounds(model, 30)
    model.observe_verify(8, 50.0, batch=2)
    path = tmp_path / "cost" / "m.json"
    model.save(path)
    again = OnlineCostModel.load(path, mass_exponent=1.3)
    assert again.to_dict() == model.to_dict() == json.loads(path.read_text())
    speed = model.speed.factor  # today's; the loaded model follows its own from its first readings
    np.testing.assert_allclose(again.verify_ms() * speed, model.verify_ms())
    np.testing.assert_allclose(again.verify_ms(batch=2) * speed, model.verify_ms(batch=2))
    assert again.draft_ms() * speed == pytest.approx(model.draft_ms()) and again.mass_exponent == 1.3


@pytest.mark.parametrize("edit, message", [
    (lambda d: d.update(schema_version=1), "cost_model.schema_version: this build reads version 2, got 1"),
    (lambda d: d.pop("buckets"), "cost_model.buckets: missing"),
    (lambda d: d["verify_ms"]["1"].update({"7": [1.0]}), 'cost_model.verify_ms["1"]["7"]: not one of the buckets'),
    (lambda d: d["verify_ms"]["1"]["8"].append(-1.0), 'cost_model.verify_ms["1"]["8"][1]: expected ms > 0'),
    (lambda d: d["draft_ms"].update({"x": []}), 'cost_model.draft_ms: key "x" is not a decimal integer'),
])
def test_a_broken_cache_file_names_the_field(tmp_path, edit, message):
    model = OnlineCostModel()
    model.observe_verify(8, 30.0)
    model.observe_draft(5.0)
    data = model.to_dict()
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"bad\.json: ") as err:
        OnlineCostModel.load(path)
    assert message in str(err.value)


def test_cache_key_names_machine_and_configuration_and_the_dir_follows_the_env(monkeypatch, tmp_path):
    key = cost_cache_key("cpu (AMD EPYC)", "sdpa", "float32", 2, "SmolLM2-135M-Instruct", "head-1a2b")
    assert key == "cpu-amd-epyc__sdpa__float32__t2__smollm2-135m-instruct__head-1a2b"
    assert key != cost_cache_key("cpu (AMD EPYC)", "sdpa", "float32", 1, "SmolLM2-135M-Instruct", "head-1a2b")
    assert key != cost_cache_key("cpu (AMD EPYC)", "sdpa", "float32", 2, "SmolLM2-135M-Instruct", "head-9f9f")
    monkeypatch.setenv("CAST_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path / "cost"
    monkeypatch.delenv("CAST_CACHE_DIR")
    assert default_cache_dir().parts[-3:] == (".cache", "cast-trtllm", "cost")


@pytest.mark.parametrize("call, message", [
    (lambda: OnlineCostModel(buckets=(4, 2)), "strictly ascending"),
    (lambda: OnlineCostModel(window=3, min_readings=5), "cannot exceed window"),
    (lambda: OnlineCostModel(prior={1: 10.0, 8: -1.0}), "packed count 8"),
    (lambda: OnlineCostModel(max_budget=500), "widest bucket"),
    (lambda: OnlineCostModel().observe_verify(2, 10.0, batch=4), ">= 1 token per request"),
    (lambda: OnlineCostModel().observe_verify(8, float("nan")), "expected ms > 0"),
    (lambda: OnlineCostModel(prior={1: 10.0}).choose(np.array([0.5]), batch=4, drafting=5), "5 drafting"),
    (lambda: cost_cache_key("", "sdpa", "float32", 2, "t", "head-1"), "letter or digit"),
])
def test_bad_input_raises_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_learned_table_of_one_head_is_not_reused_for_another():
    """The cache key carries the drafter's identity: another head (other weights) learns its own table."""
    from runtime.drafter import random_drafter
    from runtime.engine.build import head_identity
    from tests.runtime.doubles import random_target

    cfg = random_target(seed=1, vocab_size=64).config
    one, other = (random_drafter(cfg, block_size=4, seed=s) for s in (1, 2))
    assert head_identity(one) == head_identity(random_drafter(cfg, block_size=4, seed=1))
    assert head_identity(one) != head_identity(other)


def test_a_narrow_cell_read_dearer_than_a_wider_one_is_priced_at_the_wider_cost():
    model = OnlineCostModel(prior=None, min_readings=1)
    for _ in range(3):  # under load the AR cell kept catching stalls; 2 and 4 tokens read cheaper
        model.observe_verify(4, 60.0, batch=4)
        model.observe_verify(8, 45.0, batch=4)
        model.observe_verify(16, 50.0, batch=4)
    ms = model.verify_ms(batch=4)
    assert ms[0] == ms[1] == 45.0 and ms[2] == 50.0  # AR is never priced above a wider round
    assert model.ar_rate(batch=4) == pytest.approx(4 / 45.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_read_cell_is_priced_at_the_cheapest_read_cell_at_least_as_wide(seed):
    rng = np.random.default_rng(seed)
    model = OnlineCostModel(prior=steep_prior())  # filled cells come from the prior's shape
    read = sorted(rng.choice(len(DEFAULT_BUCKETS), size=5, replace=False))
    for j in read:
        for _ in range(3):
            model.observe_verify(2 * DEFAULT_BUCKETS[j], float(rng.uniform(20, 200)), batch=2)
    ms, own = model.verify_ms(batch=2), [typical(model.verify[2][DEFAULT_BUCKETS[j]]) for j in read]
    for i, j in enumerate(read):  # filled (never read) cells take no part: they do not pull a read one down
        assert ms[j] == min(own[i:])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.integers(0, 40), st.floats(1.0, 200.0),
                          st.booleans()), min_size=1, max_size=60))
def test_cached_tables_are_never_stale(readings):
    """The tables rebuild only when a reading moves a cell's estimate (or makes it known): whatever the
    readings, every cached verify row, draft cost, best rate and width choice equals one computed afresh."""
    model = OnlineCostModel(prior=steep_prior(), prior_draft_ms=DRAFT_MS)
    fresh = OnlineCostModel(prior=steep_prior(), prior_draft_ms=DRAFT_MS)  # read alike, its rates never cached
    for batch, per_request, ms, drafted in readings:
        for m in (model, fresh):
            m.observe_verify(batch * (1 + per_request), ms, batch)
            if drafted:
                m.observe_draft(ms / 4, batch)
        for b in (1, 2, 3, 4, 8):
            np.testing.assert_array_equal(model.verify_ms(b), model._table(b) * model.speed.factor)
            assert model.draft_ms(b) == model._draft(b) * model.speed.factor
            afresh = fresh.choose(MASSES[:20], b, explore=False).predicted_tokens_per_ms
            assert model.best_rate(MASSES[:20], b) == afresh
            for drafting in {1, b}:  # the budgets' round ms are kept per (batch, drafting) until the table moves
                chosen = model.choose(SLOW_MASSES[:40 * drafting], b, explore=False, drafting=drafting)
                assert (chosen.budget, chosen.bucket) == table_rule_width(
                    SLOW_MASSES[:40 * drafting], BUCKETS, model._table(b), model._draft(drafting),
                    drafting * model.max_budget, b, drafting)


def test_best_rates_kept_between_table_moves_stay_bounded_and_right():
    """A table that never moves (no reading) is asked about ever new masses, as a long-running server's drafted
    rounds would: the cache stays bounded, and every answer is still the table's."""
    model = OnlineCostModel(prior=steep_prior(), prior_draft_ms=DRAFT_MS)
    for i in range(1000):
        masses = MASSES[:20] * (1 - i / 2000)
        assert model.best_rate(masses, 4) == model.choose(masses, 4, explore=False).predicted_tokens_per_ms
        assert len(model.rates) <= RATES_KEPT


def _partial_round_model() -> OnlineCostModel:
    """A 4-request table (ms of 4 requests padded to each bucket), read 3 times per cell; draft 10 ms."""
    model = OnlineCostModel(prior={1: 10.0, 2: 11.0, 4: 15.0, 8: 25.0, 16: 45.0})
    for bucket, ms in {1: 40.0, 2: 44.0, 4: 60.0, 8: 100.0}.items():
        for _ in range(3):
            model.observe_verify(4 * bucket, ms, batch=4)
    for drafting in (1, 4):
        for _ in range(3):
            model.observe_draft(10.0, batch=drafting)
    return model


def test_a_partial_round_spreads_its_budget_over_the_drafting_requests_and_pays_the_whole_batchs_row():
    """One request of 4 drafts: each node it packs widens its own pack, and the pass pads all 4 requests to
    it. Spread over all 4 packs, 4 nodes looked like bucket 2 (4 + 3.25 tokens for 54 ms); one request
    packing 4 nodes needs bucket 8 (110 ms), so 3 nodes at bucket 4 are the best round."""
    model, masses = _partial_round_model(), np.array([0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4])
    one = model.choose(masses, batch=4, explore=False, drafting=1)
    assert (one.budget, one.bucket) == (3, 4)
    assert one.predicted_tokens_per_ms == pytest.approx((4 + 0.9 + 0.85 + 0.8) / (10.0 + 60.0))
    pooled = model.choose(masses, batch=4, explore=False)  # the same masses over all 4 packs
    assert pooled.bucket == 2 and pooled.budget == 4
    for drafting in (1, 2, 3, 4):  # the choice always fits its bucket, however few draft
        choice = model.choose(np.sort(np.tile(masses, drafting))[::-1], batch=4, explore=False, drafting=drafting)
        assert -(-choice.budget // drafting) + 1 <= choice.bucket
