"""Verify-cost probe: valid measured profiles, an untouched prefix cache, clear errors."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from cast_trtllm.profile import load_profile, save_profile
from engine_builder.probe import Bench, ProbeSettings, Timer, measure, time_grid, to_profile
from engine_builder.probe_cli import probe
from runtime.drafter import random_drafter
from tests.runtime.doubles import random_target

TINY = ProbeSettings(prefix_lengths=(32,), packed_counts=(1, 4), warmup=1, iters=2)


@pytest.fixture(scope="module")
def embedded(embedded_models):
    drafter = random_drafter(embedded_models.target.config, num_layers=1, block_size=5)
    return embedded_models.target, embedded_models.tokenizer, drafter


@pytest.fixture(scope="module")
def tiny():
    """A 2-layer random target with a character tokenizer: fast enough for batched probes."""
    model = random_target(seed=0, vocab_size=64)
    tokenizer = lambda text: SimpleNamespace(input_ids=[ord(c) % 64 for c in text])  # noqa: E731
    return model, tokenizer, random_drafter(model.config, num_layers=1, block_size=5, seed=1)


def test_probe_of_the_embedded_target_writes_a_valid_measured_profile(embedded, tmp_path):
    tables = measure(*embedded, TINY)
    profile = to_profile(tables, TINY, sku="cpu", device="cpu (test)", target="SmolLM2-135M", dtype="float32",
                         max_buckets=8, host="test", notes="tiny")
    save_profile(profile, tmp_path / "p.json")
    loaded = load_profile(tmp_path / "p.json")  # schema-validated round trip
    assert loaded.to_dict() == profile.to_dict()
    assert loaded.provenance.source == "measured" and loaded.provenance.date
    assert loaded.provenance.torch_version == torch.__version__ and loaded.provenance.transformers_version
    assert loaded.packed_counts == (1, 4) and loaded.prefix_lengths == (32,) and loaded.batch_sizes == (1,)
    row = loaded.latency_ms[32][1]
    assert len(row) == 2 and all(ms > 0 for ms in row)
    assert set(loaded.buckets) <= {1, 4} and loaded.buckets[-1] == 4
    assert loaded.drafter_ms[1] > 0 and loaded.overhead_ms[1] > 0
    for stats in tables["verify"][32][1].values():
        assert stats.p10 <= stats.median <= stats.p90


def test_probe_leaves_the_prefix_cache_as_it_found_it(embedded):
    model, tokenizer, drafter = embedded
    from engine_builder.probe import prefix_ids

    bench = Bench(model, drafter, prefix_ids(tokenizer, 32), batch=1, max_packed=4)
    before = bench.executor.cache.k[:, :, :32].clone()
    draft_logits = bench.draft([7])
    time_grid(bench, draft_logits, TINY, np.random.default_rng(0), Timer(torch.device("cpu")))
    assert bench.executor.prefix_len == 32
    assert torch.equal(bench.executor.cache.k[:, :, :32], before)


def test_batched_probe_times_the_ragged_verify_and_keeps_every_cache(tiny):
    settings = ProbeSettings(prefix_lengths=(8, 16), batch_sizes=(1, 2), packed_counts=(1, 4, 8), warmup=0, iters=2)
    tables = measure(*tiny, settings)
    profile = to_profile(tables, settings, sku="cpu", device="cpu (test)", target="tiny", dtype="float32",
                         max_buckets=8, host="test", notes="")
    assert profile.batch_sizes == (1, 2) and profile.prefix_lengths == (8, 16)
    assert set(profile.drafter_ms) == {1, 2}
    model, tokenizer, drafter = tiny
    from engine_builder.probe import prefix_ids

    bench = Bench(model, drafter, prefix_ids(tokenizer, 16), batch=3, max_packed=8)
    time_grid(bench, bench.draft([1, 2, 3]), settings, np.random.default_rng(1), Timer(torch.device("cpu")))
    assert [c.length for c in bench.caches] == [16, 16, 16]


def test_probe_rejects_a_prefix_beyond_the_context_window(tiny):
    with pytest.raises(ValueError, match="context window"):
        measure(*tiny, ProbeSettings(prefix_lengths=(1020,), packed_counts=(1, 4)))


@pytest.mark.parametrize("args, message", [
    (["--sku", "nope"], "unknown SKU"),
    (["--sku", "cpu", "--packed", "4,1"], "strictly ascending"),
    (["--sku", "cpu", "--packed", "4"], "at least 2 packed counts"),
    (["--sku", "cpu", "--packed", "1,x"], "comma list of integers"),
    (["--sku", "cpu", "--iters", "0"], "--iters >= 1"),
    (["--sku", "cpu", "--batch", "64"], "max_batch"),
    (["--sku", "cpu", "--threads", "0"], "--threads must be >= 1"),
])
def test_probe_cli_rejects_bad_arguments_with_a_clear_error(args, message, tmp_path):
    result = CliRunner().invoke(probe, args + ["--out", str(tmp_path / "p.json")])
    assert result.exit_code != 0
    assert message in result.output
    assert not (tmp_path / "p.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_probe_cli_refuses_a_gpu_sku_without_a_gpu(tmp_path):
    result = CliRunner().invoke(probe, ["--sku", "h100-sxm", "--out", str(tmp_path / "p.json")])
    assert result.exit_code != 0 and "no CUDA device" in result.output
