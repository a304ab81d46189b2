"""The one latency probe times the engine's own pass: ONE backend verify over B slots of n
packed tokens each at prefix P, the drafter's one block pass, and leaves every prefix at P."""

import numpy as np
import pytest
import torch

from runtime.drafter import DrafterExecutor, random_drafter
from runtime.engine.backend import TorchTarget
from runtime.engine.latency_probe import LatencyProbe, Stats, probe_tree, random_prompt, verify_medians

from tests.runtime.doubles import random_target


class CountingTarget(TorchTarget):
    """The torch backend, recording the token count of every forward it runs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.passes: list[int] = []

    def _forward(self, inputs, lo, hi):
        self.passes.append(len(inputs["input_ids"]))
        return super()._forward(inputs, lo, hi)


@pytest.fixture(scope="module")
def model():
    return random_target(seed=0, vocab_size=64)


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("n", [1, 2, 16, 64])
def test_probe_trees_pack_exactly_n_tokens_in_their_shape(shape, n):
    tree = probe_tree(n, shape, np.random.default_rng(n), vocab=64)
    assert tree.num_packed == n
    if shape == "chain" and n > 1:
        assert tree.parent.tolist() == list(range(-1, n - 2))
    if shape == "tree" and n >= 16:
        assert tree.max_depth < n - 1  # branches: not a chain


def test_verify_at_n16_times_one_pass_of_16_packed_tokens_per_request(model):
    backend = CountingTarget(model)
    probe = LatencyProbe(backend, random_prompt(64, 20), batch=3, max_packed=16)
    assert backend.passes == [20, 20, 20]  # every request prefilled through the backend
    backend.passes.clear()
    samples = probe.verify_curve((1, 16), warmup=1, iters=2)
    assert sorted(backend.passes) == [3] * 3 + [48] * 3  # ONE pass per timed call: B x n tokens
    assert {n: len(v) for n, v in samples.items()} == {1: 2, 16: 2} and min(min(v) for v in samples.values()) > 0
    assert [backend.prefix_len(s) for s in probe.seqs] == [20, 20, 20]


def test_a_probe_leaves_the_prefix_rows_untouched_and_gives_its_slots_back(model):
    backend = TorchTarget(model)
    with LatencyProbe(backend, random_prompt(64, 12), batch=2, max_packed=8) as probe:
        before = [backend.pool.committed(s) for s in probe.seqs]
        trees = probe.trees(8, "tree")
        _, logits = probe.time_verify(trees)
        assert logits.shape == (16, 64)
        draft = torch.randn(2, 7, 64)
        assert probe.time_host(draft, logits, trees) > 0  # commits, then rewinds to P
        for ref, s in zip(before, probe.seqs):
            assert all(np.array_equal(a, b) for a, b in zip(ref, backend.pool.committed(s)))
    assert not any(backend.pool.in_use)


def test_drafter_pass_is_one_block_pass_over_every_request(model):
    drafter = DrafterExecutor(random_drafter(model.config, num_layers=1, block_size=5, seed=1), model)
    backend = TorchTarget(model, drafter.tap_layer_ids)
    probe = LatencyProbe(backend, random_prompt(64, 10), batch=2, max_packed=4, drafter=drafter)
    assert [s.length for s in probe.states] == [10, 10]  # the drafter's feature cache covers the prefix
    ms, scores = probe.time_draft([3, 4])
    assert ms > 0 and scores.full().shape == (2, 4, 64)
    with pytest.raises(ValueError, match="the drafter needs"):
        LatencyProbe(TorchTarget(model), random_prompt(64, 10), drafter=drafter)


def test_verify_medians_gives_one_median_per_packed_count(model):
    medians = verify_medians(TorchTarget(model), (1, 4), prefix=8, iters=3, shape="chain")
    assert set(medians) == {1, 4} and all(ms > 0 for ms in medians.values())
    with pytest.raises(ValueError, match="at least one packed count"):
        verify_medians(TorchTarget(model), (), prefix=8)


def test_stats_are_ordered_percentiles():
    s = Stats.of([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s.p10 <= s.median == 3.0 <= s.p90


@pytest.mark.parametrize("kwargs, message", [
    ({"prompt": torch.zeros(0, dtype=torch.int64)}, "non-empty 1-D"),
    ({"batch": 0}, "batch >= 1"),
    ({"max_packed": 1100}, "context window"),
])
def test_bad_probe_settings_are_refused(model, kwargs, message):
    args = {"prompt": random_prompt(64, 8), "batch": 1, "max_packed": 4} | kwargs
    with pytest.raises(ValueError, match=message):
        LatencyProbe(TorchTarget(model), **args)


def test_bad_pass_requests_are_refused(model):
    probe = LatencyProbe(TorchTarget(model), random_prompt(64, 8), max_packed=4)
    with pytest.raises(ValueError, match="exceeds the probe's max_packed 4"):
        probe.trees(5)
    with pytest.raises(ValueError, match="tree shape must be one of"):
        probe_tree(4, "star", np.random.default_rng(0), 64)
    with pytest.raises(ValueError, match="iters >= 1"):
        probe.verify_curve((1,), iters=0)
    with pytest.raises(ValueError, match="without a drafter"):
        probe.time_draft()
