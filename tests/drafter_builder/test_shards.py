"""Training data from the target's own greedy continuations: a time-boxed build resumes
where it stopped, and refuses shards written from other prompts; a new run knows what
earlier runs answered; the final-layer tap carries the target's greedy law."""

from __future__ import annotations

import json

import pytest
import torch

from drafter_builder.shards import answered_prompts, build_dataset, shard_paths
from runtime.loader import encode_prompt

PROMPTS = [("gsm8k_train", "What is 2 + 3?"), ("self_chat", "Name a colour."), ("mbpp_train", "Sum a list."),
           ("gsm8k_train", "Halve 10."), ("self_chat", "Say hi.")]


def test_a_time_boxed_build_resumes_and_keeps_the_shards_it_already_wrote(embedded_hf, tmp_path):
    model, tok = embedded_hf
    first = build_dataset(model, tok, PROMPTS, [1, 3], tmp_path, batch_size=2, max_new_tokens=3, budget_s=0.0)
    assert first["sequences"] == 2 and len(shard_paths(tmp_path)) == 1  # the time box stopped it after one window
    kept = torch.load(tmp_path / "shard_00000.pt", weights_only=True)
    full = build_dataset(model, tok, PROMPTS, [1, 3], tmp_path, batch_size=2, max_new_tokens=3,
                         budget_s=float("inf"))
    assert full["sequences"] == 5 and len(shard_paths(tmp_path)) == 3
    assert full["sources"] == {"gsm8k_train": 2, "self_chat": 2, "mbpp_train": 1}
    assert full["dtype"] == "float32"  # the decoding precision is recorded
    again = torch.load(tmp_path / "shard_00000.pt", weights_only=True)
    assert all(torch.equal(a["taps"], b["taps"]) for a, b in zip(kept, again))
    assert json.loads((tmp_path / "meta.json").read_text())["seconds"] >= first["seconds"]
    with pytest.raises(ValueError, match="other prompts"):
        build_dataset(model, tok, PROMPTS[::-1], [1, 3], tmp_path, batch_size=2, max_new_tokens=3, budget_s=0.0)


def test_answered_prompts_are_those_of_every_other_data_run(embedded_hf, tmp_path):
    """A new data run drops prompts an earlier run answered (a greedy repeat adds nothing)."""
    model, tok = embedded_hf
    build_dataset(model, tok, PROMPTS[:2], [1, 3], tmp_path / "a", batch_size=2, max_new_tokens=2, budget_s=float("inf"))
    build_dataset(model, tok, PROMPTS[3:4], [1, 3], tmp_path / "b", batch_size=2, max_new_tokens=2, budget_s=float("inf"))
    ids = {i: tuple(encode_prompt(tok, p, chat=True)) for i, (_, p) in enumerate(PROMPTS)}
    assert answered_prompts(tmp_path) == {ids[0], ids[1], ids[3]}
    assert answered_prompts(tmp_path, skip=tmp_path / "b") == {ids[0], ids[1]}  # a run resuming keeps its own
    assert answered_prompts(tmp_path / "empty") == set()


def test_the_final_layer_tap_is_the_normed_last_hidden_state_so_lm_head_of_it_is_the_greedy_law(embedded_hf, tmp_path):
    """Distillation (kd_weight) reads the target's law as lm_head(final tap): guard that premise."""
    model, tok = embedded_hf
    last = model.config.num_hidden_layers - 1
    build_dataset(model, tok, PROMPTS[:2], [1, last], tmp_path, batch_size=2, max_new_tokens=6, budget_s=float("inf"))
    lm_head = model.get_output_embeddings().weight
    hidden = model.config.hidden_size
    for rec in torch.load(tmp_path / "shard_00000.pt", weights_only=True):
        ids, pl = rec["ids"].long(), rec["prompt_len"]
        final = rec["taps"][:, hidden:].float()  # [T-1, H], tap of position p predicts ids[p+1]
        greedy = (final[pl - 1 :] @ lm_head.T).argmax(-1)
        response = ids[pl:]
        assert torch.equal(greedy[: response.numel()], response)
