"""perf.auto_ahead: both ways of sizing auto on device trees, side by side, on a frozen table."""

from __future__ import annotations


def test_both_sizings_run_on_one_frozen_table_and_everything_is_put_back():
    """The tiny random target and drafter, with a FAKE flat cost table (no accelerator here): both ways
    run twice, sized ahead never reads more than once a decode round, greedy output equals AR's, and the
    engine's device-tree switch, the engine module's functions and the cost model's readers are restored."""
    import runtime.engine.engine as engine_module
    from cast_trtllm.cost_model import OnlineCostModel
    from cast_trtllm.spec_config import SpecConfig
    from perf.auto_ahead import AHEAD, OWN, page, run_cell
    from runtime.engine import LLMEngine

    from .conftest import TINY, tiny_session

    base = tiny_session().built.engine
    cost = OnlineCostModel(prior={1: 10.0, 64: 10.5}, prior_draft_ms=0.5, rank_cap=4)
    engine = LLMEngine(base.target, base.drafter, None, (), SpecConfig(rank_cap=4), lambda prefix: cost, cost)
    readers = (OnlineCostModel.observe_verify, OnlineCostModel.observe_draft, engine_module.account,
               engine_module.device_trees)
    row = run_cell(engine, lambda text: [3 + ord(ch) % (TINY.vocab_size - 3) for ch in text[:24]], "b1:gsm8k",
                   max_new=32, num_prompts=2)
    assert (OnlineCostModel.observe_verify, OnlineCostModel.observe_draft, engine_module.account,
            engine_module.device_trees) == readers and engine.device_trees is False
    assert set(row) == {OWN, AHEAD} and all(len(runs) == 2 for runs in row.values())
    for runs in row.values():
        assert all(r["equal_to_ar"] == r["requests"] == 2 and r["decode_rounds"] > 0 for r in runs)
        assert all(r["tokens_per_priced_ms"] > 0 and r["request_rounds"] >= r["decode_rounds"] for r in runs)
    assert all(r["device_reads"] <= r["decode_rounds"] for r in row[AHEAD])
    text = page({"command": "c", "code": "x", "minutes": 0.1, "machine": {}, "cells": {"b1:gsm8k": row}})
    assert text.count("| b1:gsm8k |") == 2
