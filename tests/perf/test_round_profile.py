"""perf.round_profile times the parts of the engine's own rounds and leaves the engine as it was."""

import click
import pytest

from perf.round_profile import profile_rounds
from tests.perf.conftest import tiny_session


def test_parts_of_real_rounds_add_up_within_the_round_and_the_engine_is_restored():
    engine = tiny_session().built.engine
    report = profile_rounds(engine, [[1, 2, 3, 4], [5, 6, 7]], max_new_tokens=12, budget=3)
    parts = report["parts_ms_per_round"]
    assert {"draft", "trees (host)", "verify", "commit (host)"} <= set(parts)
    assert report["rounds"] >= 2 and report["tokens"] == 2 * 11
    assert all(ms > 0 for ms in parts.values())
    assert sum(parts.values()) <= report["ms_per_round"] * 1.01
    for obj, name in ((engine, "_trees"), (engine, "_commit"), (engine, "_draft"), (engine.target, "verify")):
        assert name not in vars(obj)  # the timers are gone: the class's methods show through again
    again = profile_rounds(engine, [[1, 2, 3]], max_new_tokens=4, budget=3)
    assert again["tokens"] == 3


def test_a_run_without_rounds_is_refused():
    with pytest.raises(click.UsageError, match="no round ran"):
        profile_rounds(tiny_session().built.engine, [[1, 2]], max_new_tokens=1, budget=3)
