from __future__ import annotations

import pytest

from perf.plots import (
    plot_accept_histograms, plot_acceptance_report, plot_learning_curve, plot_training_curve, plot_width_sweep,
)

PNG = b"\x89PNG\r\n\x1a\n"


def test_plots_write_png_files(tmp_path):
    outs = [
        plot_width_sweep({"gsm8k": {1: 0.0, 3: 0.05, 7: 0.08}, "mt_bench": {1: 0.0, 3: 0.01, 7: -0.02}},
                         tmp_path / "sweep.png", auto_gain={"gsm8k": 0.1}),
        plot_accept_histograms({"chain": [1, 2, 2, 3], "cast:15": [2, 3, 4, 4, 6]}, tmp_path / "sub" / "hist.png"),
        plot_acceptance_report({"gsm8k": {
            "chain": {"R": 1.9}, "cast:3": {"R": 2.1}, "cast:15": {"R": 2.5},
            "depth1_reliability": {"bins": [{"mean_score": 0.15, "hit_rate": 0.2},
                                            {"mean_score": 0.85, "hit_rate": 0.8}]},
        }}, tmp_path / "report.png"),
        plot_training_curve({"loss_curve": [{"seconds": 0, "loss": 9.0}, {"seconds": 600, "loss": 4.0}],
                             "validation_tau": [{"seconds": 0, "tau": 0.0}, {"seconds": 600, "tau": 0.7}]},
                            tmp_path / "curve.png"),
        plot_training_curve({"loss_curve": [{"seconds": 0, "loss": 9.0}, {"seconds": 900, "loss": 3.0}],
                             "validation_tau": [{"seconds": 0, "tau": 0.0}, {"seconds": 600, "tau": 0.7},
                                                {"seconds": 600, "tau": 0.6, "run": 0},
                                                {"seconds": 900, "tau": 0.8, "run": 0}],
                             "runs": [{"step": 50, "seconds": 600}]},
                            tmp_path / "resumed.png"),
    ]
    for out in outs:
        assert out.read_bytes()[:8] == PNG


def test_empty_inputs_are_refused_with_a_reason(tmp_path):
    with pytest.raises(ValueError, match="at least one domain"):
        plot_acceptance_report({}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="non-empty loss_curve"):
        plot_training_curve({"loss_curve": []}, tmp_path / "y.png")
    with pytest.raises(ValueError, match="at least one report"):
        plot_learning_curve([], tmp_path / "z.png")
