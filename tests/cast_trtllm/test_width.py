"""Width rules (paper §3.3, Theorem 2, Proposition 3) on the paper's measured latency tables.

Latency rows come from the shipped reference profiles (paper Tables 5, 6, 11, App. F).

Mass curve used throughout (`APPENDIX_G_MASSES`): the sorted candidate masses the paper
reports for Blackwell/Qwen3-8B GSM8K rounds (Appendix G): rho_1 = 0.86, rho_48 = 0.016,
rho_64 = 0.011, joined by power-law (log-mass linear in log-rank) segments and continued
past rank 64 with the 48->64 exponent (1.30). A power law through rho_1 and rho_48
(exponent 1.03) predicts rho_64 = 0.012, close to the paper's 0.011, while a geometric
decay through the same two points predicts 0.004, so the decay here is power-law-like.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cast_trtllm.profile import REFERENCE_DIR, load_profile
from cast_trtllm.cost_curve import choose_buckets, detect_cliffs, fit_affine
from cast_trtllm.width import WidthPolicy
from cast_trtllm.width import batched_stopping_width, table_rule_width


def power_law_masses(anchors: list[tuple[int, float]], count: int = 256) -> np.ndarray:
    rank, la, lm = np.log(np.arange(1, count + 1)), *np.log(np.array(anchors, dtype=float).T)
    tail = (lm[-1] - lm[-2]) / (la[-1] - la[-2])
    return np.exp(np.where(rank > la[-1], lm[-1] + tail * (rank - la[-1]), np.interp(rank, la, lm)))


APPENDIX_G_MASSES = power_law_masses([(1, 0.86), (48, 0.016), (64, 0.011)])  # [256]


def profile(name: str):
    return load_profile(REFERENCE_DIR / f"{name}.json")


def table5_row(name: str) -> tuple[np.ndarray, np.ndarray]:
    p = profile(f"{name}__table5")
    return np.array(p.packed_counts), np.array(p.latency_ms[1024][1])


BLACKWELL_8B = "rtx-pro-6000-blackwell__qwen3-8b"
BLACKWELL_4B = "rtx-pro-6000-blackwell__qwen3-4b"
TABLE5 = [BLACKWELL_8B, BLACKWELL_4B, "a6000__qwen3-8b", "a100__qwen3-8b",
          "h100-nvl__qwen3-8b", "h100-sxm__qwen3-8b", "h100-sxm__qwen3-4b"]


def f(masses: np.ndarray, budget: int, cost_ms: float, batch: int = 1) -> float:
    """Throughput (B + g(N)) / cost; g by cumsum, summed in the same order as the rules."""
    return (batch + np.concatenate([[0.0], np.cumsum(masses)])[budget]) / cost_ms


# -- cost curve ----------------------------------------------------------------------------
def test_fit_affine_reproduces_paper_forward_slopes():
    # §3.1 / App. D: c1_fw ~ 0.056 ms per packed token for Blackwell-8B, ~0.015 for 4B
    assert fit_affine(*table5_row(BLACKWELL_8B), 16, 128)[1] == pytest.approx(0.056, abs=0.003)
    assert fit_affine(*table5_row(BLACKWELL_4B), 16, 128)[1] == pytest.approx(0.015, abs=0.001)
    moe = profile("rtx-pro-6000-blackwell__qwen3.6-35b-a3b__table11")  # App. D.1: 0.39-0.40
    assert moe.fits[1024][1].slope_ms == pytest.approx(0.395, abs=0.01)


def test_detect_cliffs_finds_blackwell_8b_n128_and_nothing_on_flat_or_transient_rows():
    assert detect_cliffs(*table5_row(BLACKWELL_8B)) == [128]
    for name in TABLE5[1:]:  # A100 / H100 NVL n=32 cells are one-point transients
        assert detect_cliffs(*table5_row(name)) == [], name
    for target in ("qwen3-8b", "qwen3-4b", "llama-3.1-8b"):  # H100 SXM at every prefix
        p = profile(f"h100-sxm__{target}__table6")
        for prefix in p.prefix_lengths:  # n=1 -> 16 at 16k rises 23.7 -> 56.7: decode switch, not a cliff
            assert detect_cliffs(p.packed_counts, p.latency_ms[prefix][1]) == [], (target, prefix)


def test_choose_buckets_keeps_the_count_below_a_cliff_and_the_widest():
    n, ms = table5_row(BLACKWELL_8B)
    buckets = choose_buckets(n, ms, max_buckets=4)
    assert len(buckets) == 4 and {96, 128} <= set(buckets) and set(buckets) <= set(n.tolist())
    assert choose_buckets(*table5_row("h100-sxm__qwen3-8b"), max_buckets=1) == [128]
    with pytest.raises(ValueError, match="max_buckets=1 is too small"):
        choose_buckets(n, ms, max_buckets=1)


# -- table rule ----------------------------------------------------------------------------
@pytest.mark.parametrize("fixed_ms", [0.0, 3.2])  # forward only / + drafter (App. F, B=1)
@pytest.mark.parametrize("masses", [
    APPENDIX_G_MASSES,
    np.minimum(1.0, 1.5 * APPENDIX_G_MASSES),              # 50% more confident drafter
    power_law_masses([(1, 0.95), (256, 0.004)]),           # flatter power law (exponent 0.99)
    0.86 * 0.9187 ** np.arange(256),                       # geometric through rho_1, rho_48
], ids=["appendix-g", "appendix-g-x1.5", "flat-power-law", "geometric"])
def test_table_rule_never_crosses_the_blackwell_8b_cliff(masses, fixed_ms):
    n, ms = table5_row(BLACKWELL_8B)
    budget, bucket = table_rule_width(masses, n, ms, fixed_ms)
    assert bucket <= 96 and budget + 1 <= 96


def test_table_rule_crosses_a_cliff_only_when_the_mass_pays_for_it():
    n, ms = table5_row(BLACKWELL_8B)
    # every node half likely: 32 more nodes add 16 tokens, worth the +24% at n = 128
    assert table_rule_width(np.full(200, 0.5), n, ms) == (127, 128)


@settings(max_examples=200, deadline=None)
@given(masses=st.lists(st.floats(0, 1), min_size=1, max_size=60),
       table=st.lists(st.tuples(st.integers(1, 8), st.floats(1, 100)), min_size=1, max_size=8),
       fixed=st.floats(0, 20), batch=st.integers(1, 4))
def test_table_rule_equals_bruteforce_over_every_budget(masses, table, fixed, batch):
    rho = np.sort(masses)[::-1]
    buckets = np.cumsum([step for step, _ in table])
    ms = np.array([v for _, v in table])
    budget, bucket = table_rule_width(rho, buckets, ms, fixed, batch=batch)
    top = min(len(rho), batch * (buckets[-1] - 1))
    values = [f(rho, m, fixed + ms[np.searchsorted(buckets, np.ceil((batch + m) / batch))], batch)
              for m in range(top + 1)]
    assert budget == int(np.argmax(values))  # smallest maximizer
    assert bucket == buckets[np.searchsorted(buckets, np.ceil((batch + budget) / batch))]


# -- Theorem 2 / Proposition 3 -------------------------------------------------------------
def theorem2(rho, ell0, c1, n_max=None):  # Theorem 2: Proposition 3's rule at B = 1
    return batched_stopping_width(rho, 1, ell0, c1, n_max)


def theorem2_width(name: str, n_max: int = 127) -> int:
    c0, c1 = fit_affine(*table5_row(name), 16, 128)  # forward-only slope, as the paper does
    return theorem2(APPENDIX_G_MASSES, c0 + c1, max(c1, 0.0), n_max)


def test_theorem2_gives_the_paper_order_flatter_curve_wider_tree():
    blackwell_8b = theorem2_width(BLACKWELL_8B)
    assert 47 <= blackwell_8b <= 63  # §3.3: threshold crossed between N = 47 and 63
    assert blackwell_8b < theorem2_width(BLACKWELL_4B)  # 0.056 vs 0.015 ms per token
    assert theorem2_width("h100-sxm__qwen3-8b") == 127  # flat: rule goes to the grid's end


@settings(max_examples=200, deadline=None)
@given(masses=st.lists(st.floats(0, 1), min_size=1, max_size=80),
       ell0=st.floats(0.5, 200), c1=st.floats(0, 5))
def test_marginal_rule_equals_bruteforce_argmax_under_affine_cost(masses, ell0, c1):
    rho = np.sort(masses)[::-1]
    chosen = theorem2(rho, ell0, c1)
    best = max(f(rho, m, ell0 + c1 * m) for m in range(len(rho) + 1))
    assert f(rho, chosen, ell0 + c1 * chosen) >= best * (1 - 1e-12)


@settings(max_examples=100, deadline=None)
@given(masses=st.lists(st.floats(0, 1), min_size=1, max_size=80),
       ell0=st.floats(0.5, 200), c1=st.floats(0, 5), more=st.floats(0, 5))
def test_marginal_width_never_grows_with_a_steeper_cost(masses, ell0, c1, more):
    rho = np.sort(masses)[::-1]
    assert theorem2(rho, ell0, c1 + more) <= theorem2(rho, ell0, c1)


def test_marginal_rule_on_an_exact_affine_table_matches_the_table_rule():
    rho, c0, c1 = APPENDIX_G_MASSES, 20.0, 0.2
    n = np.arange(1, 129)
    budget, _ = table_rule_width(rho, n, c0 + c1 * n)
    chosen = theorem2(rho, c0 + c1, c1, 127)
    assert f(rho, chosen, c0 + c1 * (chosen + 1)) == pytest.approx(f(rho, budget, c0 + c1 * (budget + 1)))


def test_marginal_rule_boundaries():
    rho = APPENDIX_G_MASSES[:100]
    assert theorem2(rho, 10.0, 0.0) == 100           # free width: all nodes
    assert theorem2(rho, 10.0, 0.0, 40) == 40        # n_max caps
    assert theorem2(rho, 10.0, 1e3) == 0             # prohibitive: root only
    with pytest.raises(ValueError, match="c1_ms >= 0"):
        theorem2(rho, 10.0, -0.01)
    with pytest.raises(ValueError, match="descending"):
        theorem2(rho[::-1], 10.0, 0.1)


def test_batched_rule_narrows_each_request_as_load_grows():
    # App. F: the verify width tax grows from +10% (B=1) to +237% (B=32)
    policy = WidthPolicy.from_profile(profile(f"{BLACKWELL_8B}__appendix-f"), 1024, rule="marginal")
    per_request = []
    for batch in (1, 8, 32):
        pooled = np.sort(np.tile(APPENDIX_G_MASSES[:63], batch))[::-1]  # Proposition 2
        per_request.append(policy.choose(pooled, batch).budget / batch)
    assert per_request[0] > per_request[1] > per_request[2]


# -- per-round policy on the reference profiles --------------------------------------------
def table_policy_choice(name: str, prefix_len: int = 1024):
    return WidthPolicy.from_profile(profile(name), prefix_len).choose(APPENDIX_G_MASSES)


def test_reference_profiles_give_the_paper_width_order():
    blackwell_8b = table_policy_choice(f"{BLACKWELL_8B}__table5")
    assert blackwell_8b.bucket < 128  # stays below the n=128 cliff (paper oracle: N = 95)
    for name in ("h100-sxm__qwen3-8b__table5", "h100-sxm__qwen3-4b__table5"):
        assert table_policy_choice(name).bucket == 128  # widest bucket
    for prefix in (1024, 4096, 8192, 16384):
        assert table_policy_choice("h100-sxm__qwen3-8b__table6", prefix).bucket == 128
    # A6000: between them (inclusive). Its Table 5 forward curve is flat (0.014 ms/token at
    # ~130 ms), so forward cost alone sends it to the widest bucket, as App. D says; the
    # paper's deployed N* = 95 there is not derivable from Table 5.
    a6000 = table_policy_choice("a6000__qwen3-8b__table5")
    assert blackwell_8b.budget < a6000.budget <= 127


def test_width_policy_respects_budget_bounds_and_interpolates_batch():
    p = profile(f"{BLACKWELL_8B}__table5")
    assert WidthPolicy.from_profile(p, 1024, max_budget=31).choose(APPENDIX_G_MASSES).budget == 31
    # App. F rows are measured at B = 8 and 32; B = 16 interpolates verify and drafter ms
    batched = WidthPolicy.from_profile(profile(f"{BLACKWELL_8B}__appendix-f"), 1024)
    pooled = np.sort(np.tile(APPENDIX_G_MASSES[:63], 16))[::-1]
    choice = batched.choose(pooled, batch=16)
    verify = np.interp(16, [8, 32], [17.2 * 1.79, 17.2 * 3.37])   # bucket 64
    drafter = np.interp(16, [1, 32], [3.2, 19.3])
    committed = 16 + pooled[:choice.budget].sum()
    assert choice.bucket == 64
    assert committed / choice.predicted_tokens_per_ms == pytest.approx(verify + drafter)


def test_width_policy_rejects_bad_configuration():
    p = profile(f"{BLACKWELL_8B}__table5")
    with pytest.raises(ValueError, match="rule must be one of"):
        WidthPolicy.from_profile(p, 1024, rule="oracle")
    with pytest.raises(ValueError, match="widest bucket - 1 = 127"):
        WidthPolicy.from_profile(p, 1024, max_budget=128)


def test_mass_calibration_narrows_an_overconfident_heads_tree_and_is_the_identity_at_one():
    p = profile(f"{BLACKWELL_8B}__table5")
    plain = WidthPolicy.from_profile(p, 1024).choose(APPENDIX_G_MASSES)
    assert WidthPolicy.from_profile(p, 1024, mass_exponent=1.0).choose(APPENDIX_G_MASSES) == plain
    shrunk = WidthPolicy.from_profile(p, 1024, mass_exponent=2.0).choose(APPENDIX_G_MASSES)
    # the policy behaves exactly as if it had been handed the calibrated masses rho ** 2
    assert shrunk == WidthPolicy.from_profile(p, 1024).choose(APPENDIX_G_MASSES ** 2)
    assert shrunk.budget < plain.budget
    with pytest.raises(ValueError, match="mass_exponent must be > 0"):
        WidthPolicy.from_profile(p, 1024, mass_exponent=0.0)


@pytest.mark.parametrize("rule", ["table", "marginal"])
def test_a_profile_policy_spreads_a_partial_rounds_budget_over_the_drafting_requests(rule):
    """4 of 16 requests draft: their budget widens their own 4 packs (the pass pads all 16 to the
    widest), and the drafter's fixed cost is that of 4 requests (App. F row, interpolated)."""
    batched = WidthPolicy.from_profile(profile(f"{BLACKWELL_8B}__appendix-f"), 1024, rule=rule)
    pooled = np.sort(np.tile(APPENDIX_G_MASSES[:63], 4))[::-1]
    choice = batched.choose(pooled, batch=16, drafting=4)
    assert choice.budget <= 4 * batched.max_budget and -(-choice.budget // 4) + 1 <= choice.bucket
    column = batched.buckets.index(choice.bucket)
    verify = np.interp(16, batched.batch_sizes, [row[column] for row in batched.bucket_ms])
    committed = 16 + (pooled[:choice.budget] ** batched.mass_exponent).sum()
    drafter = np.interp(4, batched.batch_sizes, batched.fixed_ms)
    assert committed / choice.predicted_tokens_per_ms == pytest.approx(verify + drafter)
    with pytest.raises(ValueError, match="5 drafting requests in a round of 4"):
        batched.choose(pooled, batch=4, drafting=5)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(1e-4, 1.0), min_size=1, max_size=60), st.integers(1, 4),
       st.lists(st.floats(1.0, 100.0), min_size=6, max_size=6), st.floats(0.0, 20.0))
def test_the_table_rules_best_budget_fills_its_bucket(masses, spread, ms, fixed):
    """Inside a bucket the pass costs the same and every node adds mass, so the best budget is the
    bucket's widest one (spread requests x (bucket - 1) nodes), unless the masses or n_max run out
    first: what a round's own masses can change is only the bucket (`runtime.engine.trees._ahead`)."""
    buckets = (1, 2, 4, 8, 16, 32)
    rho = np.sort(np.array(masses))[::-1]
    budget, bucket = table_rule_width(rho, buckets, np.sort(ms), fixed, None, spread, spread)
    assert budget == min(spread * (bucket - 1), len(rho))
