"""The DFlash head shipped for the embedded target: it loads, it is the head its
training record describes, it fits the repository budget, and it has learned the
target (depth-1 agreement with the target's greedy token far above a random head's)."""

import json

import pytest
import torch

from drafter_builder.blocks import FrozenTarget
from drafter_builder.replay import score_anchors
from cast_trtllm.spec_config import SpecConfig
from runtime.drafter import DEFAULT_DRAFTER, load_drafter, random_drafter
from runtime.drafter.config import CONFIG_NAME, WEIGHTS_NAME
from runtime.engine import LLMEngine, Request
from runtime.loader import encode_prompt
from tests.runtime.doubles import prefilled

PROMPTS = [  # fixed, not from any training or evaluation pool
    "Tom has 3 boxes with 12 pencils each. He gives away 10 pencils. How many are left?",
    "Write a Python function that returns the largest element of a list.",
    "Give me three tips for staying focused while studying.",
]


@pytest.fixture(scope="module")
def shipped(embedded):
    return load_drafter(DEFAULT_DRAFTER, embedded.model.config)


def test_shipped_head_matches_its_training_record_and_size_budget(shipped):
    record = json.loads((DEFAULT_DRAFTER / "training.json").read_text())
    assert record["drafter_config"] == json.loads((DEFAULT_DRAFTER / CONFIG_NAME).read_text())
    assert shipped.config.block_size == 16
    assert shipped.config.draft_vocab_size == record["vocab"]["draft_vocab_size"] == shipped.d2t.numel()
    assert (DEFAULT_DRAFTER / WEIGHTS_NAME).stat().st_size <= 25 * 2**20
    assert record["steps"] > 0 and record["validation_tau"][-1]["tau"] > record["validation_tau"][0]["tau"]


def _depth1_hit_rate(drafter, embedded, frozen, continuations):
    hits = total = 0
    for rec in continuations:
        s = score_anchors(drafter, frozen, rec, rank_cap=1)
        nxt = torch.as_tensor(s.ids[s.prompt_len + 1 :])
        hits += int((torch.as_tensor(s.topk_ids[:, 0, 0]) == nxt).sum())
        total += len(nxt)
    return hits / total


def test_shipped_head_predicts_the_targets_next_token_far_more_often_than_a_random_head(embedded, shipped):
    model = embedded.model
    frozen = FrozenTarget(model.embed_tokens.weight, model.lm_head.weight)
    layers = shipped.config.target_layer_ids
    continuations = []
    for text in PROMPTS:
        prompt = encode_prompt(embedded.tokenizer, text, chat=True)
        out = LLMEngine(model, None, spec=SpecConfig(method="ar")).generate([Request(prompt, 24)])[0]
        ids = torch.tensor(prompt + out.token_ids)
        taps = prefilled(model, ids[:-1], layers)[3]
        continuations.append({"ids": ids, "prompt_len": len(prompt), "taps": taps})
    trained = _depth1_hit_rate(shipped, embedded, frozen, continuations)
    random_head = random_drafter(model.config, block_size=16, target_layer_ids=layers, mask_token_id=16,
                                 intermediate_size=shipped.config.intermediate_size, seed=1)
    untrained = _depth1_hit_rate(random_head, embedded, frozen, continuations)
    print(f"depth-1 agreement: shipped {trained:.3f}, random {untrained:.3f}")
    assert trained >= 0.35 and trained > untrained + 0.3
