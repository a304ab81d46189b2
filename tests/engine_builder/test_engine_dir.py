"""The built engine directory is what runs: `cast-trtllm build --sku cpu --out DIR` writes
the runtime's batched graphs, `generate --engine DIR` runs them without exporting anything,
and a directory built from other weights is refused with a message saying how to rebuild."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from cast_trtllm.cli import main
from engine_builder.cli import build
from plugins.tree_attention.trt_plugin import tensorrt_status
from tests.runtime.hf_checkpoints import write_tiny_checkpoint, write_tiny_drafter

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.skipif(tensorrt_status() is None, reason="TensorRT is importable here: engines would be built")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(target dir, drafter dir, engine dir): a tiny Llama checkpoint, its z-lab drafter, their build."""
    root = tmp_path_factory.mktemp("engine")
    target = write_tiny_checkpoint("llama", root / "llama")
    drafter = write_tiny_drafter(target, root / "dflash")
    out = root / "built"
    result = CliRunner().invoke(build, ["--sku", "cpu", "--target", str(target), "--drafter", str(drafter),
                                        "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0 and "TensorRT step is for GPU SKUs" in result.output  # CPU SKU: graphs only
    return target, drafter, out


def generate(monkeypatch, cache, *args):
    monkeypatch.setenv("CAST_CACHE_DIR", str(cache))
    return CliRunner().invoke(main, ["generate", "--prompt", "hello there", "--no-chat", "--max-new-tokens", "12",
                                     "--json", *args])


def test_the_build_writes_the_runtime_graphs_and_names_them_in_the_manifest(built):
    _, _, out = built
    record = json.loads((out / "manifest.json").read_text())["runtime"]
    assert record["backend"] == "onnxruntime" and record["dtype"] == "float32"
    assert (out / record["folder"] / record["target_graphs"] / "verify.onnx").is_file()
    assert {"draft.onnx", "context.onnx"} <= {p.name for p in (out / record["folder"] / record["drafter_graphs"]).iterdir()}


def test_generate_runs_the_engine_directory_and_exports_nothing(built, tmp_path, monkeypatch):
    target, drafter, out = built
    models = ["--target", str(target), "--drafter", str(drafter)]
    ran = generate(monkeypatch, tmp_path / "empty-cache", *models, "--engine", str(out), "--method", "cast",
                   "--budget", "6")
    assert ran.exit_code == 0, ran.output
    assert f"engine directory {out}" in ran.stderr and "exporting" not in ran.stderr
    assert not (tmp_path / "empty-cache" / "onnx").exists()  # nothing exported into the cache
    reference = generate(monkeypatch, tmp_path / "ref-cache", *models, "--method", "ar", "--dtype", "float32",
                         "--device", "cpu")
    assert reference.exit_code == 0, reference.output
    lines = [r.output.strip().splitlines()[-1] for r in (ran, reference)]  # (a progress bar may share the line)
    last = [json.loads(line[line.index("{"):]) for line in lines]
    assert last[0]["token_ids"] == last[1]["token_ids"]  # greedy CAST from the built graphs equals torch fp32 AR


def test_a_directory_built_from_other_weights_is_refused_with_how_to_rebuild(built, tmp_path, monkeypatch):
    _, drafter, out = built
    other = write_tiny_checkpoint("llama", tmp_path / "other", seed=99)
    ran = generate(monkeypatch, tmp_path / "cache", "--target", str(other), "--drafter", str(drafter),
                   "--engine", str(out))
    assert ran.exit_code != 0 and "Traceback" not in ran.output
    assert "does not hold the verify graph" in ran.output and "Rebuild it with `cast-trtllm build" in ran.output


def test_a_folder_that_is_not_a_build_is_a_clear_error(tmp_path, monkeypatch):
    ran = generate(monkeypatch, tmp_path / "cache", "--engine", str(tmp_path))
    assert ran.exit_code != 0 and "no manifest.json" in ran.output and "Traceback" not in ran.output
