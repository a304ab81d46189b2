"""`generate --logprobs K --min-tokens N --bad-word W`: CAST prints AR's tokens and logprobs
(fp32, within 1e-4) under the same processing, on a tiny checkpoint with its drafter."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cast_trtllm.cli import main
from tests.runtime.hf_checkpoints import write_tiny_checkpoint, write_tiny_drafter


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama")
    target = write_tiny_checkpoint("llama", root / "target")
    return target, write_tiny_drafter(target, root / "drafter", block_size=8)


def _generate(llama, *args) -> dict:
    target, drafter = llama
    result = CliRunner().invoke(main, ["generate", "--target", str(target), "--drafter", str(drafter), "--prompt",
                                       "hi", "--json", "--dtype", "float32", "--threads", "1", "--no-chat",
                                       "--max-new-tokens", "12", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_generate_prints_cast_logprobs_equal_to_ar_under_min_tokens_and_bad_words(llama):
    args = ["--logprobs", "3", "--min-tokens", "12", "--bad-word", "a"]
    ar = _generate(llama, "--method", "ar", *args)
    cast = _generate(llama, "--method", "cast", "--budget", "15", *args)
    assert cast["token_ids"] == ar["token_ids"] and len(ar["token_ids"]) == 12  # no EOS before 12 tokens
    assert len(ar["logprobs"]) == 12 and all(len(top) == 3 for top in ar["top_logprobs"])
    assert max(abs(a - b) for a, b in zip(cast["logprobs"], ar["logprobs"])) < 1e-4
    assert [[t for t, _ in top] for top in cast["top_logprobs"]] == [[t for t, _ in top] for top in ar["top_logprobs"]]
    assert "logprobs" not in _generate(llama, "--method", "ar")  # nothing kept unless asked


def test_generate_refuses_an_empty_bad_word_and_logprobs_over_20(llama):
    target, drafter = llama
    base = ["generate", "--target", str(target), "--drafter", "none", "--prompt", "hi", "--dtype", "float32"]
    assert "a bad word has no tokens" in CliRunner().invoke(main, [*base, "--bad-word", ""]).output
    assert CliRunner().invoke(main, [*base, "--logprobs", "21"]).exit_code == 2
