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


def test_sampled_runs_seed_each_request_and_both_methods_alike():
    from perf.round_compare import method
    from perf.throughput import requests_for

    greedy = requests_for(method("ar"), [[1, 2], [3]], 4)
    assert all(not r.sampling.temperature for r in greedy)
    ar, auto = (requests_for(method(m), [[1, 2], [3]], 4, temperature=1.0, seed=2000) for m in ("ar", "cast:auto"))
    assert [(r.sampling.temperature, r.sampling.seed) for r in ar] == [(1.0, 2000), (1.0, 2001)]
    assert [r.sampling.seed for r in auto] == [2000, 2001] and auto[0].draft_gate and ar[0].method == "ar"


def test_aiperf_prompts_are_rendered_and_tokenized_as_the_server_does(tmp_path, embedded_hf):
    import json

    from perf.round_compare import aiperf_prompts
    from runtime.serving.openai.app import render_chat

    _, tokenizer = embedded_hf
    chats = [[{"role": "user", "content": "Exit Page Aside"}], [{"role": "user", "content": "Enter Stanley"}]]
    path = tmp_path / "inputs.json"
    path.write_text(json.dumps({"data": [{"session_id": f"s{i}", "payloads": [{"messages": m, "stream": True}]}
                                         for i, m in enumerate(chats)]}))
    ids = aiperf_prompts(tokenizer, str(path), 5)
    first = tokenizer(render_chat(tokenizer, chats[0]), add_special_tokens=False)["input_ids"]  # as the server
    assert ids[0] == ids[2] == ids[4] == first and ids[1] == ids[3] != first  # repeated in order
    bare = tokenizer("Exit Page Aside")["input_ids"]
    assert tokenizer.decode(first).count("Exit Page Aside") == 1 and len(first) > len(bare)  # the template's turns
    path.write_text(json.dumps({"records": []}))
    with pytest.raises(SystemExit, match="not an AIPerf inputs.json"):
        aiperf_prompts(tokenizer, str(path), 2)


def test_a_replay_needs_at_least_one_request_per_concurrency_slot():
    from perf.round_compare import main

    with pytest.raises(SystemExit, match="--per-slot is >= 1"):
        main(["--methods", "ar,cast:auto", "--per-slot", "0", "--aiperf-inputs", "unused.json"])
