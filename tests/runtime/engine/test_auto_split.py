"""auto under load: the shared budget's split never packs a request wider than the per-request
width its rule priced (the pass pads every request to its widest pack)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cast_trtllm.spec_config import SpecConfig
from runtime.engine.trees import MeanBudget, choose_trees, device_trees

B, L, K = 4, 6, 4


class PricedRule:
    """A width rule that chose `budget` nodes priced as packs padded to `bucket` tokens."""

    max_budget, mass_exponent = 64, 1.0

    def __init__(self, budget: int, bucket: int) -> None:
        self.budget, self.bucket = budget, bucket

    def choose(self, masses_desc: np.ndarray, batch: int = 1, drafting: int | None = None) -> SimpleNamespace:
        return SimpleNamespace(budget=min(self.budget, len(masses_desc)), bucket=self.bucket)


def marginals(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """[B, L, K] ids and descending log-probs; request 0 is near certain, the others are not."""
    rng = np.random.default_rng(seed)
    ids = np.stack([[rng.choice(100, K, replace=False) for _ in range(L)] for _ in range(B)]).astype(np.int64)
    p = rng.dirichlet(np.ones(K) * 0.5, (B, L))
    p[0] = np.array([0.97, 0.01, 0.01, 0.01])
    lp = np.log(np.sort(p, axis=-1)[..., ::-1])
    return ids, np.ascontiguousarray(lp)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("on_device", [False, True])
def test_a_shared_budget_never_packs_a_request_wider_than_the_bucket_its_rule_priced(seed, on_device):
    ids, lp = marginals(seed)
    args = (["cast"] * B, ["auto"] * B, [10] * B)

    def sizes(rule) -> list[int]:
        if on_device:
            read = lambda t: t.cpu().numpy()  # noqa: E731
            return device_trees(*args, torch.from_numpy(ids), torch.from_numpy(lp), SpecConfig(),
                                lambda prefix: rule, [1.0] * B, read)[1]
        return [t.size for t in choose_trees(*args, ids, lp, SpecConfig(), lambda prefix: rule, [1.0] * B)[0]]

    assert sizes(PricedRule(12, 4)) == [3, 3, 3, 3]  # 12 nodes priced at 4 tokens per request
    unpriced = sizes(MeanBudget(3))  # no bucket priced: the confident request takes more than its share
    assert sum(unpriced) == 12 and unpriced[0] > 3


class MassRule:
    """A width rule that takes every node whose mass is at least `floor` (records what it was shown)."""

    max_budget, mass_exponent = 64, 1.0

    def __init__(self, floor: float) -> None:
        self.floor, self.shown = floor, []

    def choose(self, masses_desc: np.ndarray, batch: int = 1, drafting: int | None = None) -> SimpleNamespace:
        self.shown.append(masses_desc)
        return SimpleNamespace(budget=int((masses_desc >= self.floor).sum()))


@pytest.mark.parametrize("on_device", [False, True])
def test_the_rule_sees_masses_scaled_once_and_the_gate_gets_them_as_drafted(on_device):
    """A request's scale (its gate's realized / forecast correction) shrinks what the width rule
    prices, once; the masses handed back (to the draft gate, which applies its own correction, and
    to the engine's pooled evidence) are the drafted ones: scaled there too, they were counted twice."""
    ids, lp = marginals(0)
    args = (["cast"], ["auto"], [10])
    for scale in (1.0, 0.5):
        rule = MassRule(0.6)
        if on_device:
            _, size, masses = device_trees(*args, torch.from_numpy(ids[:1]), torch.from_numpy(lp[:1]), SpecConfig(),
                                           lambda prefix: rule, [scale], lambda t: t.cpu().numpy())
        else:
            trees, masses = choose_trees(*args, ids[:1], lp[:1], SpecConfig(), lambda prefix: rule, [scale])
            size = [trees[0].size]
        drafted = masses[0]
        assert np.allclose(rule.shown[0], np.minimum(drafted * scale, 1.0))
        assert size[0] == int((np.minimum(drafted * scale, 1.0) >= 0.6).sum())
        assert drafted[0] > 0.9  # request 0 is near certain: its root-most masses as drafted
    assert size[0] < int((drafted >= 0.6).sum())  # at scale 0.5 the rule took fewer nodes


@pytest.mark.parametrize("on_device", [False, True])
def test_a_screen_scale_of_0_verifies_one_node_and_hands_back_the_masses_as_drafted(on_device):
    """A load probe's screen: the cheapest tree whose verify still reads acceptance, whatever its masses."""
    ids, lp = marginals(0)
    args = (["cast", "cast"], ["auto", "auto"], [10, 10])
    rule = MassRule(0.0)  # would take every node
    if on_device:
        _, size, masses = device_trees(*args, torch.from_numpy(ids[:2]), torch.from_numpy(lp[:2]), SpecConfig(),
                                       lambda prefix: rule, [0.0, 1.0], lambda t: t.cpu().numpy())
    else:
        trees, masses = choose_trees(*args, ids[:2], lp[:2], SpecConfig(), lambda prefix: rule, [0.0, 1.0])
        size = [t.size for t in trees]
    assert size[0] == 1 and size[1] > 1
    assert masses[0][0] > 0.9 and len(masses[0]) > 1


class RecordingRule(MassRule):
    """MassRule that keeps the round each call priced: (batch, drafting)."""

    def __init__(self, floor: float) -> None:
        super().__init__(floor)
        self.rounds = []

    def choose(self, masses_desc: np.ndarray, batch: int = 1, drafting: int | None = None) -> SimpleNamespace:
        self.rounds.append((batch, drafting))
        return super().choose(masses_desc, batch, drafting)


@pytest.mark.parametrize("on_device", [False, True])
@pytest.mark.parametrize("auto, batch", [(1, 4), (2, 4), (2, None), (1, None)])
def test_auto_prices_the_round_the_verify_runs_every_request_padded_and_its_budget_over_those_drafting(
        on_device, auto, batch):
    """Requests that do not draft still ride the verify padded to the widest pack: the rule is asked for
    the round's batch, its budget spread over the auto requests drafting (None: the drafting ones are all)."""
    ids, lp = marginals(0)
    rule = RecordingRule(0.5)
    args = (["cast"] * auto, ["auto"] * auto, [10] * auto)
    if on_device:
        device_trees(*args, torch.from_numpy(ids[:auto]), torch.from_numpy(lp[:auto]), SpecConfig(),
                     lambda prefix: rule, [1.0] * auto, lambda t: t.cpu().numpy(), batch=batch)
    else:
        choose_trees(*args, ids[:auto], lp[:auto], SpecConfig(), lambda prefix: rule, [1.0] * auto, batch=batch)
    assert rule.rounds == [(batch or auto, auto)]


@pytest.mark.parametrize("seed", [0, 1])
def test_depth_caps_trim_every_method_alike_on_host_and_device(seed):
    """A request that may emit only d + 1 more tokens gets no node deeper than d (`trees.cap_depth`), on the
    host search and on the device one alike: chains stop at d, fixed budgets keep the best nodes down to d,
    auto's shared budget sees only those."""
    ids, lp = marginals(seed)
    methods, budgets, depths = ["chain", "cast", "cast", "cast"], [None, 6, "auto", "auto"], [2, 1, 3, L]
    args = (methods, budgets, [10] * B)
    host, _ = choose_trees(*args, ids, lp, SpecConfig(), lambda prefix: MeanBudget(4), [1.0] * B, depths=depths)
    device, sizes, _ = device_trees(*args, torch.from_numpy(ids), torch.from_numpy(lp), SpecConfig(),
                                    lambda prefix: MeanBudget(4), [1.0] * B, lambda t: t.cpu().numpy(), depths=depths)
    assert [t.size for t in host] == sizes and sizes[:2] == [2, K]  # depth 1 holds K nodes, not 6
    for b, tree in enumerate(host):
        assert tree.depth.max() <= depths[b] and np.isfinite(tree.score).all()
        assert device.depth[b, :sizes[b]].tolist() == tree.depth.tolist()
        assert device.tokens[b, :sizes[b]].tolist() == tree.tokens.tolist()
    uncapped, _ = choose_trees(*args, ids, lp, SpecConfig(), lambda prefix: MeanBudget(4), [1.0] * B)
    assert uncapped[0].size == L and uncapped[1].depth.max() > 1  # the caps, not the drafts, trimmed them


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rule", [PricedRule(12, 4), MassRule(0.3)], ids=["priced", "mass"])
def test_sized_ahead_on_the_rounds_own_masses_picks_what_reading_them_picks_and_reads_nothing_itself(seed, rule):
    """`trees._ahead` runs the same rule on predicted masses before the round: handed this round's own
    masses it sizes every tree as the mid-round read does, with depth caps, reads nothing itself, and the
    masses it hands back land with the round's read, equal to the read path's. (Not `MeanBudget`: masses
    are kept to a request's share of the budget, so a split on them cannot give one request more than it.)"""
    from runtime.engine.walks import HostReads

    ids, lp = (torch.from_numpy(a) for a in marginals(seed))
    args = (["cast"] * B, ["auto"] * B, [10] * B)
    depths = [L, 2, L, 1]
    read_tree, read_sizes, read_masses = device_trees(*args, ids, lp, SpecConfig(), lambda prefix: rule, [1.0] * B,
                                                      lambda t: t.cpu().numpy(), depths=depths)
    reads = HostReads()
    tree, sizes, masses = device_trees(*args, ids, lp, SpecConfig(), lambda prefix: rule, [1.0] * B, reads,
                                       depths=depths, predicted=read_masses)
    assert sizes == read_sizes and reads.count == 0 and len(reads.riders) == 1
    assert torch.equal(tree.score, read_tree.score) and torch.equal(tree.tokens, read_tree.tokens)
    assert all(not m.any() for m in masses)  # not landed yet
    reads(torch.zeros(3, dtype=torch.int64))  # the round's one read
    assert reads.count == 1 and reads.riders == []
    for got, want in zip(masses, read_masses):
        np.testing.assert_allclose(got, want)


def test_a_rider_lands_with_the_read_in_its_own_dtype_and_shape():
    from runtime.engine.walks import HostReads

    reads, got = HostReads(), []
    scores = torch.tensor([[0.0, -1.5], [-torch.inf, 2.25]], dtype=torch.float64)
    reads.ride(scores, got.append)
    out = reads(torch.arange(5))
    assert reads.count == 1 and out.tolist() == list(range(5)) and out.dtype == np.int64
    assert len(got) == 1 and got[0].dtype == np.float64 and np.array_equal(got[0], scores.numpy())
    with pytest.raises(ValueError, match="int64 or float64"):
        reads.ride(torch.zeros(2, dtype=torch.float32), got.append)
