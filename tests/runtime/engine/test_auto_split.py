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

    def choose(self, masses_desc: np.ndarray, batch: int = 1) -> SimpleNamespace:
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

