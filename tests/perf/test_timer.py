"""App. D timer boundaries: the decode window excludes prefill and the first draft.

The slow steps advance a virtual clock by an hour instead of sleeping, so the checks are
exact and instant on any (loaded) machine.
"""

from __future__ import annotations

import time

import pytest

from cast_trtllm.sampling import SamplingParams
from perf.harness import MethodSpec
from runtime.drafter import DrafterExecutor
from runtime.engine.backend import TorchTarget

HOUR_MS = 3_600_000.0


@pytest.fixture
def slow_down(monkeypatch):
    """slow_down(cls, name, first_only): that method costs one virtual hour per call."""
    offset = [0.0]
    real = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: real() + offset[0])

    def patch(cls, name, first_only=False):
        original, calls = getattr(cls, name), []

        def slow(self, *args):
            calls.append(1)
            if not first_only or len(calls) == 1:
                offset[0] += HOUR_MS / 1000
            return original(self, *args)

        monkeypatch.setattr(cls, name, slow)

    return patch


@pytest.mark.parametrize("spec", [MethodSpec("ar"), MethodSpec("chain"), MethodSpec("cast", 5)])
def test_decode_window_excludes_a_deliberately_slow_prefill(session, slow_down, spec):
    slow_down(TorchTarget, "prefill")  # the prompt's pass (its one chunk, inside the first round)
    result, _ = session([1, 2, 3, 4], spec, 6, SamplingParams(0.0))
    t = result.timings
    assert t.ttft_ms >= HOUR_MS and t.prefill_ms >= HOUR_MS
    assert 0 < t.decode_ms < HOUR_MS / 10
    assert result.decode_ms_per_token == pytest.approx(t.decode_ms / len(result.token_ids))
    assert t.draft_ms + t.verify_ms + t.overhead_ms == pytest.approx(t.decode_ms, rel=0.05, abs=1.0)


def test_decode_window_excludes_the_first_draft_but_counts_later_drafts(session, slow_down):
    slow_down(DrafterExecutor, "draft_scores", first_only=True)
    result, _ = session([1, 2, 3, 4], MethodSpec("cast", 5), 6, SamplingParams(0.0))
    assert result.timings.first_draft_ms >= HOUR_MS
    assert result.timings.decode_ms < HOUR_MS / 10


def test_drafts_inside_the_window_are_counted(session, slow_down):
    slow_down(DrafterExecutor, "draft_scores")
    result, _ = session([1, 2, 3, 4], MethodSpec("chain"), 6, SamplingParams(0.0))
    later_drafts = sum(result.drafted) - 1  # the first draft is outside the window
    assert result.timings.draft_ms >= later_drafts * HOUR_MS > 0
