"""min_tokens / bad_words on a verified pack, row by row, and logprobs of committed tokens."""

import numpy as np
import pytest
import torch

from cast_trtllm.logit_processing import LogitProcessor, committed_rows, token_logprobs
from cast_trtllm.tree import Tree

V = 10
# pack rows: 0 root; 1 = token 3 (depth 1); 2 = token 4 (depth 1); 3 = token 5 under row 1 (depth 2);
# 4 = token 6 under row 3 (depth 3)
TREE = Tree(tokens=np.array([3, 4, 5, 6]), depth=np.array([1, 1, 2, 3], np.int32),
            parent=np.array([-1, -1, 0, 2], np.int32), score=np.array([-0.1, -0.2, -0.3, -0.4]))


def _banned(out: torch.Tensor) -> set[tuple[int, int]]:
    return {(int(r), int(c)) for r, c in torch.nonzero(torch.isinf(out))}


def test_nothing_to_apply_builds_no_processor():
    assert LogitProcessor.of((2,), 0, ()) is None
    assert LogitProcessor.of((), 5, ()) is None  # no stop ids: min_tokens bans nothing
    assert LogitProcessor.of((2,), 1, ()) is not None


def test_min_tokens_bans_stop_ids_on_rows_whose_token_number_is_below_it():
    proc = LogitProcessor.of((0, 9), min_tokens=4, bad_words=())
    logits = torch.zeros(TREE.num_packed, V)
    # 2 tokens emitted: row depth d chooses token number 2 + d -> rows of depth 0, 1 are banned
    assert _banned(proc.apply(logits, TREE, [7, 7], generated=2)) == {(r, c) for r in (0, 1, 2) for c in (0, 9)}
    assert proc.apply(logits, TREE, [7] * 4, generated=4) is logits  # past min_tokens: untouched, no copy
    assert torch.count_nonzero(logits) == 0  # the input is never modified


def test_bad_words_ban_the_last_token_where_the_context_and_tree_path_end_with_the_rest():
    # (8,) always; (1, 3, 5): after history ...1 then path 3 -> row 1's child 5 banned at row 1;
    # (5, 6, 7): only after path 3, 5, 6 -> row 4; (2, 4): never (history does not end with 2)
    proc = LogitProcessor.of((), 0, [(8,), (1, 3, 5), (5, 6, 7), (2, 4)])
    out = proc.apply(torch.zeros(TREE.num_packed, V), TREE, [0, 0, 1], generated=1)
    assert _banned(out) == {(r, 8) for r in range(5)} | {(1, 5), (4, 7)}
    # the word may start in the history: root row after [..., 1, 3] bans 5
    assert (0, 5) in _banned(proc.apply(torch.zeros(TREE.num_packed, V), TREE, [1, 3], generated=2))


def test_processing_refuses_logits_that_are_not_one_row_per_packed_token():
    proc = LogitProcessor.of((), 0, [(1,)])
    with pytest.raises(ValueError, match=r"logits must be \[n=5, V\]"):
        proc.apply(torch.zeros(3, V), TREE, [0], 1)


def test_bad_words_need_tokens():
    with pytest.raises(ValueError, match="a bad word has no tokens"):
        LogitProcessor.of((), 0, [()])
    with pytest.raises(ValueError, match="outside"):
        LogitProcessor.of((), 0, [(-1,)])


def test_committed_tokens_come_from_their_parents_rows():
    assert committed_rows(np.array([1, 3, 4])).tolist() == [0, 1, 3, 4]
    assert committed_rows(np.zeros(0, np.int64)).tolist() == [0]


def test_token_logprobs_are_the_log_softmax_of_the_producing_row_with_its_top_entries():
    logits = torch.tensor([[0.0, 1.0, 2.0, float("-inf")], [3.0, 0.0, 0.0, 0.0]])
    lp, top = token_logprobs(logits, [1, 0], top=2)
    ref = torch.log_softmax(logits, dim=-1)
    assert lp == pytest.approx([ref[0, 1].item(), ref[1, 0].item()])
    assert [t for t, _ in top[0]] == [2, 1] and top[0][0][1] == pytest.approx(ref[0, 2].item())
    assert token_logprobs(logits, [1, 0], top=0)[1] == [[], []]
    with pytest.raises(ValueError, match=r"top logprobs must be in \[0, 20\]"):
        token_logprobs(logits, [1, 0], top=21)
