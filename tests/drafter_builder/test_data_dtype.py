"""`drafter_builder.data_dtype` re-taps sequences with an exact fp32 pass: on the fp32 target's
own greedy data it must agree on every response token and reproduce the stored taps."""

from __future__ import annotations

import torch

from drafter_builder.data_dtype import LAYER_IDS, fp32_pass
from drafter_builder.shards import generate_shard
from runtime.loader import encode_prompt


def test_the_fp32_pass_agrees_with_fp32_greedy_data_and_reproduces_its_taps(embedded_hf):
    model, tok = embedded_hf
    prompts = [encode_prompt(tok, "What is 2 + 3?", chat=True), encode_prompt(tok, "Name a colour.", chat=True)]
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    recs = generate_shard(model, prompts, LAYER_IDS, 6, eos, tok.pad_token_id)
    retapped, agree, total = fp32_pass(model, recs)
    assert total == sum(len(r["ids"]) - r["prompt_len"] for r in recs) > 0
    assert agree == total  # greedy tokens are the fp32 target's own
    for a, b in zip(recs, retapped):
        assert b["taps"].shape == a["taps"].shape
        torch.testing.assert_close(b["taps"].float(), a["taps"].float(), atol=2e-2, rtol=2e-2)
