"""Occurrence penalties and min_p on a verified pack equal, row by row, what an autoregressive
step at that row's position would apply (its context: history + its tree path)."""

import math

import numpy as np
import pytest
import torch

from cast_trtllm.logit_processing import LogitProcessor
from cast_trtllm.penalties import Penalties
from cast_trtllm.tree import Tree

V = 12


def _tree():
    # root -> 3 -> 3 -> 5 ; root -> 7 -> 3
    return Tree(np.array([3, 7, 3, 3, 5]), np.array([1, 1, 2, 2, 3], np.int32),
                np.array([-1, -1, 0, 1, 2], np.int32), np.zeros(5))


def _by_hand(row, context, pen, temperature):
    """One AR step's row, written out token by token."""
    out = row.clone()
    for x in range(V):
        c = context.count(x)
        if c and pen.repetition != 1.0:
            out[x] = out[x] / pen.repetition if out[x] > 0 else out[x] * pen.repetition
        out[x] -= pen.presence * (c > 0) + pen.frequency * c
    if pen.min_p > 0 and temperature > 0:
        p = torch.softmax(out / temperature, 0)
        out[p < pen.min_p * p.max()] = float("-inf")
    return out


@pytest.mark.parametrize("pen, temperature", [
    (Penalties(repetition=1.3), 0.0), (Penalties(presence=0.7, frequency=0.4), 0.0),
    (Penalties(repetition=0.8, presence=-0.2, frequency=0.3, min_p=0.1), 0.7), (Penalties(min_p=0.2), 1.0)])
def test_each_pack_row_is_penalized_over_its_own_context(pen, temperature):
    torch.manual_seed(0)
    tree, history = _tree(), [1, 3, 3, 9, 2]
    logits = torch.randn(tree.num_packed, V) * 3
    paths = [[], [3], [7], [3, 3], [7, 3], [3, 3, 5]]
    got = pen.apply(logits, tree, history, temperature)
    for r in range(tree.num_packed):
        want = _by_hand(logits[r], history + paths[r], pen, temperature)
        torch.testing.assert_close(got[r], want)


def test_min_p_never_removes_the_argmax_and_is_off_for_greedy():
    logits = torch.randn(1, V)
    assert not Penalties(min_p=0.9).active(0.0)
    kept = Penalties(min_p=1.0).apply(logits, Tree.empty(), [], 1.0)
    assert torch.isfinite(kept).sum() >= 1 and torch.isfinite(kept[0, logits.argmax()])


def test_a_request_with_only_neutral_penalties_has_no_processor():
    assert LogitProcessor.of([0], 0, (), Penalties(), 1.0) is None
    assert LogitProcessor.of([0], 0, (), Penalties(min_p=0.5), 0.0) is None  # greedy: min_p cannot bite
    assert LogitProcessor.of([0], 0, (), Penalties(frequency=0.5), 0.0).needs_history


@pytest.mark.parametrize("field, kwargs", [("repetition_penalty", {"repetition": 0.0}),
                                           ("min_p", {"min_p": 1.5}), ("presence_penalty", {"presence": math.inf})])
def test_bad_values_name_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field):
        Penalties(**kwargs)
