"""perf.goodput on a tiny random target + drafter: report schema and greedy losslessness."""

from __future__ import annotations

import numpy as np
import pytest

from perf.goodput import POLICIES, make_policy, measure_goodput
from perf.goodput_report import format_goodput
from runtime.drafter import DrafterExecutor
from runtime.drafter import random_drafter
from tests.runtime.doubles import random_target

VOCAB, L = 64, 4
CELL_KEYS = {"batch_size", "policy", "budget", "goodput_tok_s", "ratio_to_chain", "committed_tokens", "decode_s",
             "rounds", "mean_R", "mean_packed_per_round", "mean_packed_per_request_round", "equal_to_chain"}


@pytest.fixture(scope="module")
def report():
    target = random_target(seed=3, vocab_size=VOCAB)
    drafter = DrafterExecutor(random_drafter(target.config, num_layers=1, block_size=L + 1, seed=4, init_std=0.3),
                                 target)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, VOCAB, size=int(rng.integers(2, 20))).tolist() for _ in range(5)]
    policies = [make_policy(name, shared_width=3, fixed_width=12, max_width=8, rank_cap=4) for name in POLICIES]
    return measure_goodput(target, drafter, prompts, [1, 3], policies, max_new_tokens=10, progress=False)


def test_report_has_one_cell_per_batch_size_and_policy_with_every_field(report):
    cells = report["cells"]
    assert [(c["batch_size"], c["policy"]) for c in cells] == [(b, p) for b in (1, 3) for p in POLICIES]
    for c in cells:
        assert set(c) == CELL_KEYS
        assert c["goodput_tok_s"] > 0 and c["decode_s"] > 0 and c["rounds"] > 0
        assert c["mean_R"] >= 1 and c["mean_packed_per_request_round"] >= 1
    assert all(c["ratio_to_chain"] == 1.0 for c in cells if c["policy"] == "chain")


def test_committed_tokens_are_the_outputs_after_each_first_token(report):
    for c in report["cells"]:
        outputs = report["outputs"][str(c["batch_size"])][c["policy"]]
        assert c["committed_tokens"] == sum(len(t) - 1 for t in outputs)
        assert all(len(t) == 10 for t in outputs)  # no EOS: every request runs its full budget


def test_every_policy_outputs_equal_the_chain_token_for_token(report):
    for outputs in report["outputs"].values():
        assert all(outputs[name] == outputs["chain"] for name in POLICIES)
    assert report["lossless"] == {"all_policies_equal_chain": True, "mismatches": [],
                                  "chain_equal_across_batch_sizes": True}
    assert all(c["equal_to_chain"] for c in report["cells"])


def test_uniform_and_best_first_verify_the_same_nodes_at_batch_size_one(report):
    one = {c["policy"]: c for c in report["cells"] if c["batch_size"] == 1}
    assert one["uniform"]["mean_packed_per_request_round"] == one["best_first"]["mean_packed_per_request_round"] == 4


def test_markdown_table_has_a_row_per_cell(report):
    lines = format_goodput(report["cells"], markdown=True).splitlines()
    assert len(lines) == 2 + len(report["cells"]) and lines[2].startswith("| 1 | chain |")


def test_measure_goodput_without_chain_is_rejected():
    with pytest.raises(ValueError, match="include chain"):
        measure_goodput(None, None, [[1, 2]], [1], [make_policy("uniform", 3, 12, 8, 4)], 4)
