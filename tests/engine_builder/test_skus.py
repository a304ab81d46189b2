"""Per-SKU build specs, and the reference profiles generated from the paper's tables."""

from __future__ import annotations

import pytest

from cast_trtllm.profile import load_profile, reference_profiles
from engine_builder import make_reference_profiles
from engine_builder.skus import SKU_DIR, list_skus, load_sku, sku_for_device

REQUIRED = {"h100-sxm", "h200", "b200", "rtx-pro-6000-blackwell", "a100", "a6000", "l40s", "cpu"}


def test_every_required_sku_ships_and_loads():
    assert REQUIRED <= set(list_skus())
    for name in list_skus():
        spec = load_sku(name)
        assert spec.name == name
        assert spec.max_batch >= 1 and spec.packed_buckets[-1] > 1
        if name == "cpu":
            assert (spec.dtype, spec.cuda_graphs, spec.compute_capability) == ("float32", False, None)
        else:
            assert spec.dtype == "bfloat16" and spec.cuda_graphs


def test_every_reference_profile_names_a_shipped_sku():
    for path in reference_profiles():
        assert load_profile(path).sku in list_skus(), path.name


@pytest.mark.parametrize("device, sku", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000-blackwell"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA RTX A6000", "a6000"),
    ("NVIDIA L40S", "l40s"),
    ("cpu", "cpu"),
])
def test_sku_for_device_matches_the_reported_device_name(device, sku):
    assert sku_for_device(device).name == sku


def test_sku_for_device_returns_none_for_an_unknown_gpu():
    assert sku_for_device("NVIDIA RTX 6000 Ada Generation") is None


def write_spec(tmp_path, **changes):
    text = (SKU_DIR / "cpu.yaml").read_text()
    for key, value in changes.items():
        lines = [ln for ln in text.splitlines() if not ln.startswith(f"{key}:")]
        text = "\n".join(lines + ([f"{key}: {value}"] if value is not None else []))
    path = tmp_path / "custom.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("changes, message", [
    ({"packed_buckets": "[1, 8, 4]"}, "custom.yaml: packed_buckets: expected strictly ascending"),
    ({"dtype": "int8"}, "custom.yaml: dtype: expected one of"),
    ({"max_batch": "0"}, "custom.yaml: max_batch: expected an integer >= 1"),
    ({"cuda_graphs": "true"}, "custom.yaml: cuda_graphs: a SKU without a compute_capability"),
    ({"compute_capability": "9.0"}, 'custom.yaml: compute_capability: expected a quoted string'),
    ({"buckets": "[1]"}, "unknown keys ['buckets']"),
    ({"prefix_buckets": None}, "missing keys ['prefix_buckets']"),
])
def test_invalid_spec_error_names_the_key(tmp_path, changes, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_sku(write_spec(tmp_path, **changes))


def test_unknown_sku_lists_the_shipped_ones():
    with pytest.raises(ValueError, match="unknown SKU 'h300'.*h100-sxm"):
        load_sku("h300")


@pytest.mark.skipif(not make_reference_profiles.DEFAULT_TABLES.exists(),
                    reason="../shared/data/cast_paper_tables.json not present")
def test_committed_reference_profiles_equal_the_script_output():
    assert make_reference_profiles.main(["--check"]) == 0
