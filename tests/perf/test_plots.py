from __future__ import annotations

from cast_trtllm.profile import load_profile, reference_profiles
from perf.plots import plot_accept_histograms, plot_verify_latency, plot_width_sweep

PNG = b"\x89PNG\r\n\x1a\n"


def test_plots_write_png_files(tmp_path):
    profiles = [load_profile(p) for p in reference_profiles()[:3]]
    outs = [
        plot_width_sweep({"gsm8k": {1: 0.0, 3: 0.05, 7: 0.08}, "mt_bench": {1: 0.0, 3: 0.01, 7: -0.02}},
                         tmp_path / "sweep.png", predicted={"gsm8k": 5.2}),
        plot_verify_latency(profiles, tmp_path / "latency.png"),
        plot_accept_histograms({"chain": [1, 2, 2, 3], "cast:15": [2, 3, 4, 4, 6]}, tmp_path / "sub" / "hist.png"),
    ]
    for out in outs:
        assert out.read_bytes()[:8] == PNG
