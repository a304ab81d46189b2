"""`cast-trtllm build` without TensorRT: ONNX files + manifest written; the CPU SKU then exits 0
(its TensorRT step is for GPU SKUs), a GPU SKU stops with the reason."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from engine_builder.build import plugin_ptx
from engine_builder.cli import build
from engine_builder.skus import load_sku
from plugins.tree_attention.trt_plugin import tensorrt_status
from tests.runtime.doubles import random_target
from tests.runtime.hf_checkpoints import write_tiny_checkpoint

pytestmark = pytest.mark.skipif(tensorrt_status() is None, reason="TensorRT is importable here: engines would be built")


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    """A tiny random HF Llama checkpoint (2 layers): `--target DIR` through the one loader."""
    return write_tiny_checkpoint("llama", tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory, target_dir):
    """A head tapping target layer 0 only, so a 1-layer build keeps every layer it needs."""
    from transformers import AutoConfig

    from runtime.drafter import random_drafter, save_drafter
    from runtime.model.llama import TargetConfig

    cfg = TargetConfig.from_hf(AutoConfig.from_pretrained(target_dir))
    path = tmp_path_factory.mktemp("drafter")
    save_drafter(random_drafter(cfg, num_layers=1, block_size=5, target_layer_ids=(0,)), path)
    return path


def run(*args: str):
    return CliRunner().invoke(build, list(args), catch_exceptions=False)


def test_a_cpu_build_without_tensorrt_writes_graphs_and_manifest_and_says_tensorrt_is_for_gpus(tmp_path, target_dir,
                                                                                              drafter_dir):
    out = tmp_path / "build"
    result = run("--sku", "cpu", "--target", str(target_dir), "--num-layers", "1", "--drafter", str(drafter_dir),
                 "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "the TensorRT step is for GPU SKUs" in result.output and "manifest.json" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    spec = load_sku("cpu")
    assert manifest["sku"]["name"] == "cpu" and manifest["sku"]["packed_buckets"] == list(spec.packed_buckets)
    assert manifest["target"] | {"config": None} == {
        "source": str(target_dir), "name": manifest["target"]["name"], "exported_layers": 1, "full_layers": 2,
        "truncated": True, "config": None}
    assert set(manifest["graphs"]) == {"verify_onnx", "verify_plugin", "draft", "context"}
    for record in manifest["graphs"].values():
        assert (out / record["file"]).stat().st_size == record["bytes"] > 0
    assert manifest["graphs"]["verify_onnx"]["outputs"] == ["logits", "new_keys", "new_values", "taps"]
    profiles = manifest["optimization_profiles"]["verify"]
    assert [p["bucket"] for p in profiles] == list(spec.packed_buckets)
    lows = [p["n"]["min"] for p in profiles]
    assert lows == [1] + [b + 1 for b in spec.packed_buckets[:-1]]  # buckets tile 1..max without gaps
    assert profiles[-1]["shapes"]["bitmask"]["max"] == [64, manifest["mask_words"]] and manifest["mask_words"] == 2
    assert manifest["plugin"]["ptx"] == [] and "no compute capability" in manifest["plugin"]["note"]
    assert manifest["engines"] == [] and manifest["tensorrt"].startswith("no TensorRT engines")
    assert manifest["versions"]["torch"] and manifest["versions"]["onnx"]


def test_a_gpu_sku_build_without_tensorrt_keeps_its_clear_error(tmp_path, target_dir):
    result = run("--sku", "h200", "--target", str(target_dir), "--drafter", "none", "--num-layers", "1",
                 "--flavour", "onnx", "--out", str(tmp_path / "build"))
    assert result.exit_code == 1 and "TensorRT is not importable" in result.output


def test_the_drafter_flag_goes_through_the_one_loader(tmp_path, target_dir):
    result = run("--sku", "cpu", "--target", str(target_dir), "--out", str(tmp_path / "b"))  # --drafter default
    assert result.exit_code == 1 and "no DFlash drafter is shipped" in result.output and "--drafter none" in result.output


def test_bucket_max_shape_runs_in_onnxruntime(tmp_path, target_dir):
    ort = pytest.importorskip("onnxruntime")
    out = tmp_path / "build"
    result = run("--sku", "cpu", "--target", str(target_dir), "--drafter", "none", "--out", str(out), "--flavour", "onnx",
                 "--onnx-only", "--json")
    assert result.exit_code == 0, result.output
    manifest = json.loads(result.stdout)
    assert set(manifest["graphs"]) == {"verify_onnx"} and manifest["drafter"] is None
    shapes = manifest["optimization_profiles"]["verify"][-1]["shapes"]
    n, past = shapes["input_ids"]["max"][0], 100
    words = np.zeros(shapes["bitmask"]["max"], dtype=np.uint32)
    for i in range(n):  # causal rows
        for k in range(i + 1):
            words[i, k // 32] |= np.uint32(1 << (k % 32))
    kv = np.zeros([shapes["past_keys"]["max"][0], past, *shapes["past_keys"]["max"][2:]], np.float32)
    session = ort.InferenceSession(str(out / "verify_onnx.onnx"), providers=["CPUExecutionProvider"])
    logits, keys, _ = session.run(None, {"input_ids": np.arange(n), "position_ids": past + np.arange(n),
                                         "bitmask": words.view(np.int32), "past_keys": kv, "past_values": kv})
    assert logits.shape == (n, manifest["target"]["config"]["vocab_size"]) and np.isfinite(logits).all()
    assert keys.shape[1] == n


def test_unknown_sku_is_a_clear_error(tmp_path, target_dir):
    result = run("--sku", "no-such-gpu", "--target", str(target_dir), "--drafter", "none", "--out", str(tmp_path))
    assert result.exit_code == 1 and "unknown SKU 'no-such-gpu'" in result.output


def test_gpu_sku_gets_the_kernel_ptx_for_its_arch(tmp_path):
    record = plugin_ptx(load_sku("h200"), random_target(seed=0), 4, tmp_path)
    if not record["ptx"]:
        pytest.skip(record["note"])  # e.g. this process imported triton in interpreter mode
    (ptx,) = record["ptx"]
    text = (tmp_path / ptx["file"]).read_text()
    assert ptx["arch"] == 90 and ".target sm_90" in text and ptx["kernel"] in text
