"""perf.round_compare: two methods' rounds side by side, alternating, parts timed in place."""

from __future__ import annotations

import pytest


def test_two_methods_alternate_and_every_full_round_is_timed_in_parts():
    import runtime.engine.engine as engine_module
    from perf.round_compare import PARTS, compare, method

    from .conftest import tiny_session

    engine = tiny_session().built.engine
    before = engine_module.account
    out = compare(engine, [[1, 2, 3, 4], [5, 6, 7]], 2, [method("ar"), method("cast:3")], repeats=2, max_new=6,
                  say=lambda _: None)
    assert engine_module.account is before  # the timing is removed after
    for label in ("ar", "cast:3"):
        runs = out["runs"][label]
        assert len(runs) == 2 and all(r["tokens_per_s"] > 0 and r["full_rounds"] >= 1 for r in runs)
        assert all(0 < r["drafts"] + r["trees"] + r["account"] < r["round"] + r["account"] for r in runs)
        assert all(set(PARTS) <= set(r) for r in runs)
    assert all(r["drafted_request_rounds"] == 0 and r["R"] == 1.0 for r in out["runs"]["ar"])
    assert all(r["drafted_request_rounds"] > 0 for r in out["runs"]["cast:3"])
    assert out["paired"] is not None and out["paired"][0] > 0


def test_methods_are_named_as_the_server_takes_them():
    from perf.round_compare import method

    assert method("cast:auto").draft_gate and method("cast:3").budget == 3 and method("ar").method == "ar"
    with pytest.raises(SystemExit, match="use ar, chain, cast:N or cast:auto"):
        method("cast:wide")


def test_the_host_tally_counts_every_gate_choice_and_bookkeeping_call():
    """`Timed.host_ms` (what perf/gate_overhead.py reports per round) holds at least every timed round's parts."""
    from perf.round_compare import Timed, method
    from perf.throughput import serve_method

    from .conftest import tiny_session

    engine = tiny_session().built.engine
    timed = Timed()
    timed.install()
    try:
        serve_method(engine, method("cast:3"), [[1, 2, 3, 4], [5, 6, 7]], 6, 2)
    finally:
        timed.remove()
    assert timed.rows and timed.host_ms >= sum(r[4] + r[6] for r in timed.rows) > 0
