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
