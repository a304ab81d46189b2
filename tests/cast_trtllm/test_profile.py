"""Width-profile schema: validation names the wrong field, JSON round-trips, curve lookup."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cast_trtllm.profile import (
    REFERENCE_DIR, Provenance, WidthProfile, build_profile, load_profile, reference_profiles,
    save_profile,
)

N = [1, 16, 24, 32, 48, 64, 96, 128]
ROW = [17.2, 21.9, 23.3, 23.6, 24.1, 24.6, 24.4, 30.3]  # paper Table 5, Blackwell/Qwen3-8B


def measured_profile() -> WidthProfile:
    return build_profile(
        sku="rtx-pro-6000-blackwell", device="NVIDIA RTX PRO 6000 Blackwell Server Edition",
        target="Qwen3-8B", dtype="bfloat16", packed_counts=N,
        latency_ms={1024: {1: ROW, 4: [v * 1.5 for v in ROW]},
                    8192: {1: [v * 1.2 for v in ROW], 4: [v * 2.0 for v in ROW]}},
        provenance=Provenance("measured", date="2026-01-02", torch_version="2.13.0",
                              transformers_version="4.57.0", host="node-1"),
        max_buckets=5, drafter_ms={1: 3.2, 4: 5.0}, overhead_ms={1: 0.4})


def test_build_profile_fits_detects_cliffs_and_places_buckets():
    p = measured_profile()
    assert p.fit_range == (16, 128)  # n = 1 (decode kernels) left out of the fit
    assert p.fits[1024][1].slope_ms == pytest.approx(0.0576, abs=1e-3)
    assert p.cliffs[1024][1] == (128,)
    assert len(p.buckets) == 5 and {96, 128} <= set(p.buckets)


def test_save_then_load_round_trips(tmp_path):
    p = measured_profile()
    save_profile(p, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == p


@pytest.mark.parametrize("path", reference_profiles(), ids=lambda p: p.name)
def test_reference_profiles_load_and_rewrite_byte_identical(path, tmp_path):
    p = load_profile(path)
    assert p.provenance.source.startswith("reference: CAST paper")
    save_profile(p, tmp_path / path.name)
    assert (tmp_path / path.name).read_text() == path.read_text()


def test_at_least_the_paper_tables_ship_as_reference_profiles():
    sources = {load_profile(p).provenance.source for p in reference_profiles()}
    assert sources == {f"reference: CAST paper {t}" for t in
                       ("Table 5", "Table 6", "Table 11", "Appendix F")}


def broken(edit) -> dict:
    data = json.loads(json.dumps(measured_profile().to_dict()))  # as read from a file
    edit(data)
    return data


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["latency_ms"]["1024"]["1"].pop(),
     'profile.latency_ms["1024"]["1"]: expected 8 values (one per packed count), got 7'),
    (lambda d: d["latency_ms"]["8192"]["4"].__setitem__(3, -1.0),
     'profile.latency_ms["8192"]["4"][3]: expected a latency in ms > 0 (packed count 32), got -1.0'),
    (lambda d: d["latency_ms"]["1024"].pop("4"),
     'profile.latency_ms["1024"]: expected one entry per batch size [1, 4], got [1]'),
    (lambda d: d["latency_ms"].update({"1k": d["latency_ms"].pop("1024")}),
     'profile.latency_ms: key "1k" is not a decimal integer'),
    (lambda d: d.update(buckets=[16, 100]),
     "profile.buckets: [100] are not measured packed counts"),
    (lambda d: d.update(packed_counts=[1, 16, 16, 32, 48, 64, 96, 128]),
     "profile.packed_counts: expected strictly ascending integers >= 1"),
    (lambda d: d.update(schema_version=2), "profile.schema_version: this build reads version 1, got 2"),
    (lambda d: d.pop("dtype"), "profile.dtype: missing"),
    (lambda d: d.update(latency=1), "profile: unknown field(s) ['latency']"),
    (lambda d: d["provenance"].update(source="guessed"), 'profile.provenance.source: expected "measured"'),
    (lambda d: d["provenance"].update(date=None), "profile.provenance.date: required for a measured profile"),
    (lambda d: d["drafter_ms"].update({"16": 9.0}), "profile.drafter_ms: batch sizes [1, 4, 16]"),
    (lambda d: d["fits"]["8192"]["1"].pop("slope_ms"), 'profile.fits["8192"]["1"].slope_ms: missing'),
    (lambda d: d["cliffs"]["1024"].update({"1": [100]}), 'profile.cliffs["1024"]["1"]: expected a list'),
    (lambda d: d.update(fit_range=[100, 110]), "profile.fit_range: [100, 110] must hold >= 2"),
])
def test_validation_error_names_the_field(edit, message):
    with pytest.raises(ValueError) as err:
        WidthProfile.from_dict(broken(edit))
    assert message in str(err.value)


def test_load_profile_prefixes_errors_with_the_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(broken(lambda d: d.pop("sku"))))
    with pytest.raises(ValueError, match=r"bad\.json: profile\.sku: missing"):
        load_profile(path)
    path.write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_profile(path)


def test_prefix_bucket_is_the_smallest_measured_prefix_at_or_above():
    p = load_profile(REFERENCE_DIR / "h100-sxm__qwen3-8b__table6.json")
    assert p.prefix_bucket(1024) == 1024 and p.prefix_bucket(2000) == 4096
    assert p.prefix_bucket(100_000) == 16384  # beyond the grid: largest measured


def test_fixed_ms_adds_drafter_and_overhead_interpolated_in_batch():
    p = measured_profile()
    assert p.fixed_ms(1) == pytest.approx(3.2 + 0.4)
    assert p.fixed_ms(2) == pytest.approx(3.2 + (5.0 - 3.2) / 3 + 0.4)
    f = load_profile(REFERENCE_DIR / "rtx-pro-6000-blackwell__qwen3-8b__appendix-f.json")
    assert f.fixed_ms(8) == pytest.approx(3.2 + (19.3 - 3.2) * 7 / 31)
