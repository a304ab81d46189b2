"""The results page's headline: cast:auto against the fastest AR configuration, the chain
and the best fixed N of the same run."""

from perf.results_page import headline, headline_table


def _row(method, ms):
    return {"method": method, "ms_per_token": ms}


def test_headline_compares_auto_with_the_fastest_ar_the_chain_and_the_best_fixed_n():
    reports = {"gsm8k": {"summary": [_row("ar", 40.0), _row("ar@bf16", 30.0), _row("chain", 25.0),
                                     _row("cast:15", 22.0), _row("cast:63", 24.0), _row("cast:auto", 20.0)]}}
    (row,) = headline(reports)
    assert row["fastest_ar"] == "ar@bf16" and row["auto_vs_fastest_ar"] == 1.5
    assert row["best_fixed"] == "cast:15" and abs(row["auto_vs_best_fixed_pp"] - 10.0) < 1e-9
    assert abs(row["auto_vs_chain"] - 0.25) < 1e-9
    assert "| gsm8k | ar@bf16 (30.0) | 20.0 | 1.50x | +25.0% | cast:15 | +10.0 pp |" in headline_table([row])


def _timed(method, ms, R, verify, overhead):
    return {"method": method, "ms_per_token": ms, "mean_R": R, "verify_share": verify, "overhead_share": overhead}


def test_ceiling_is_the_fastest_ar_over_the_verify_time_per_token_of_the_best_fixed_n(tmp_path):
    """t_AR / (t(N) * verify share): what is left if drafting and host work were free."""
    import json

    import click
    import pytest

    from perf.ceiling import ceiling_rows, ceiling_table, read_reports

    summary = [_timed("ar", 30.0, 1.0, 0.98, 0.02), _timed("ar@bf16", 40.0, 1.0, 0.98, 0.02),
               _timed("chain", 36.0, 2.0, 0.8, 0.04), _timed("cast:3", 25.0, 2.0, 0.6, 0.05),
               _timed("cast:15", 30.0, 2.8, 0.8, 0.04), _timed("cast:auto", 24.0, 2.1, 0.7, 0.05)]
    (tmp_path / "bench_gsm8k.json").write_text(json.dumps({"summary": summary}))
    (row,) = ceiling_rows(read_reports(tmp_path))
    assert row["best_N"] == 3 and row["per_N_draft_and_host_free"] == {3: 2.0, 15: 1.25}
    assert row["ceiling_draft_free"] == pytest.approx(30.0 / (25.0 * 0.65))
    assert row["measured_auto"] == pytest.approx(1.25)
    assert "| gsm8k | 30.0 | 3 | 2.00 | 2.00x | 1.85x | 1.25x |" in ceiling_table([row])
    assert ceiling_rows({"mbpp": {"summary": summary[2:]}}) == []  # no AR run: nothing to compare with
    with pytest.raises(click.UsageError, match="no bench_<domain>.json"):
        read_reports(tmp_path / "missing")
