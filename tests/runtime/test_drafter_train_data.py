"""Training data from the target's own greedy continuations: a time-boxed build resumes
where it stopped, and refuses shards written from other prompts."""

from __future__ import annotations

import json

import pytest
import torch

from runtime.drafter.train_data import build_dataset, shard_paths

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
    again = torch.load(tmp_path / "shard_00000.pt", weights_only=True)
    assert all(torch.equal(a["taps"], b["taps"]) for a, b in zip(kept, again))
    assert json.loads((tmp_path / "meta.json").read_text())["seconds"] >= first["seconds"]
    with pytest.raises(ValueError, match="other prompts"):
        build_dataset(model, tok, PROMPTS[::-1], [1, 3], tmp_path, batch_size=2, max_new_tokens=3, budget_s=0.0)
