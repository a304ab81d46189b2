"""Verify-cost probe: valid measured profiles, an untouched prefix cache, clear errors."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

from cast_trtllm.profile import load_profile, save_profile
from engine_builder import probe as probe_module
from engine_builder.probe import ProbeSettings, measure, to_profile
from engine_builder.probe import probe
from runtime.drafter import random_drafter
from runtime.engine.backend import TorchTarget
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


def test_probe_times_the_engines_batched_pass_of_b_packs_and_keeps_every_prefix(tiny, monkeypatch):
    passes, slots = [], []

    class Counting(TorchTarget):
        def _forward(self, inputs, lo, hi):
            if len(inputs["logit_rows"]) == len(inputs["input_ids"]):  # a verify (a prefill scores its last row)
                passes.append(len(inputs["input_ids"]))
            slots.append(self)
            return super()._forward(inputs, lo, hi)

    monkeypatch.setattr(probe_module, "make_backend", lambda name, model, taps, threads: Counting(model, taps))
    settings = ProbeSettings(prefix_lengths=(8, 16), batch_sizes=(1, 2), packed_counts=(1, 4, 8), warmup=0, iters=2)
    tables = measure(*tiny, settings)
    profile = to_profile(tables, settings, sku="cpu", device="cpu (test)", target="tiny", dtype="float32",
                         max_buckets=8, host="test", notes="")
    assert profile.batch_sizes == (1, 2) and profile.prefix_lengths == (8, 16)
    assert set(profile.drafter_ms) == {1, 2}
    assert sorted(passes) == sorted([n * b for _ in (8, 16) for b in (1, 2) for n in (1, 4, 8)] * 2)
    pool = slots[0].pool
    assert not any(pool.in_use)  # every probe gave its slots back


def test_probe_rejects_a_prefix_beyond_the_context_window(tiny):
    with pytest.raises(ValueError, match="context window"):
        measure(*tiny, ProbeSettings(prefix_lengths=(1020,), packed_counts=(1, 4)))
    with pytest.raises(ValueError, match="--backend must be one of"):
        measure(*tiny, ProbeSettings(prefix_lengths=(8,), packed_counts=(1, 4)), backend="tensorrt")


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
