"""The issue-40 report's pieces that run without a model: AIPerf's CSV (CR LF line ends, a
per-user row listed before the aggregate one), the page of a report, and one cell on a tiny random model."""

from perf.aiperf_summary import throughput
from perf.never_slower import page


def test_aiperf_csv_with_cr_lf_gives_the_aggregate_output_token_throughput(tmp_path):
    csv = tmp_path / "profile_export_aiperf.csv"
    csv.write_bytes(b"Metric,avg,min\r\nOutput Token Throughput Per User (tokens/sec/user),18.14,11.04\r\n"
                    b"Output Token Throughput (tokens/sec),14.18\r\nRequest Count,16.00\r\n")
    assert throughput(csv) == 14.18


def test_the_page_has_one_row_per_cell_with_ratios_over_ar():
    row = {"tokens_per_s": 10.0, "vs_ar": 1.0, "cpu_vs_ar": 1.0, "drafted_share": 0.0, "mean_R": 1.0,
           "equal_to_ar": 2, "requests": 2, "runs_tokens_per_s": [10.0, 9.8, 9.5]}
    report = {"command": "python -m perf.never_slower --out x", "machine": {"cpu_model": "cpu"}, "engine": {},
              "wall_minutes": 1.0, "cells": [{"part": "B = 1", "workload": "gsm8k", "concurrency": 1, "rows": {
                  "ar": row, "cast:3": row | {"vs_ar": 1.25, "cpu_vs_ar": 1.2, "paired_vs_ar": 1.21},
                  "cast:auto": row | {"vs_ar": 0.99, "paired_vs_ar": 1.01, "runs_tokens_per_s": [8.0, 7.7, 7.9]}}}]}
    text = page(report | {"code": "8c2cfb6"})
    assert "| B = 1 | gsm8k | 1 | 10.0 | 1.25 | 0.99 | MISS | 0.806 (<= 0.846) | 3 | 1.21 / 1.01 | 1.20 / 1.00 | 0% | 1.00 | 2 / 2 of 2 |" in text
    older = report | {"cells": [{**report["cells"][0], "rows": {k: {f: v for f, v in r.items() if f != "paired_vs_ar"}
                                                            for k, r in report["cells"][0]["rows"].items()}}]}
    assert "| 3 | - | 1.20 / 1.00 |" in page(older)  # a report from before the paired column
    assert "--out x` at code 8c2cfb6 —" in text and "at code unknown" in page(report)  # older reports: no code


def test_a_report_names_the_commit_it_measured():
    """The figures belong to a commit: this checkout's (CI clones it), "-dirty" with uncommitted changes."""
    import re
    import subprocess

    from perf.never_slower import code_version
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    version = code_version()
    assert re.fullmatch(r"[0-9a-f]{7,}(-dirty)?", version) and version.startswith(head)


def test_the_bar_is_098_of_ar_where_no_width_pays_and_the_static_width_where_one_does_or_within_noise_of_them():
    from perf.never_slower_bar import verdict

    def rows(static, auto, static_runs=(10.0, 10.2, 9.9, 10.1), auto_runs=(9.9, 10.3, 9.8, 10.1)):
        return {"cast:3": {"vs_ar": static, "runs_tokens_per_s": list(static_runs)},
                "cast:auto": {"vs_ar": auto, "runs_tokens_per_s": list(auto_runs)}}
    assert verdict(rows(0.80, 0.98)) == "meets" and verdict(rows(0.80, 0.97)) == "MISS"
    assert verdict(rows(1.00, 0.975, auto_runs=(20, 5, 10, 10))) == "MISS"  # no width pays, AR's runs unknown
    ar_runs = {"ar": {"vs_ar": 1.0, "runs_tokens_per_s": [10.0, 10.4, 9.8, 10.0]}}
    lucky = rows(0.80, 0.96, auto_runs=(9.95, 10.0, 9.9, 10.1)) | ar_runs  # AR's one lucky run sets the best
    assert verdict(lucky) == "within noise"  # paired 0.994: what identical work reads
    behind = rows(0.80, 0.96, auto_runs=(9.7, 10.0, 9.5, 9.7)) | ar_runs  # 3% under AR in every repeat
    assert verdict(behind) == "MISS"
    assert verdict(rows(1.30, 1.31)) == "meets"
    assert verdict(rows(1.30, 1.29)) == "within noise"  # paired by repeat, 0.25% under cast:3
    steady = [x * 0.99 for x in (10.0, 10.2, 9.9, 10.1)]  # 1% under in every repeat: what A/A runs read
    assert verdict(rows(1.30, 1.29, auto_runs=steady)) == "within noise"
    slower = (9.6, 9.8, 9.5, 9.7)  # every repeat 3-5% under cast:3's
    assert verdict(rows(1.30, 1.29, auto_runs=slower)) == "MISS"
    scattered = (9.0, 11.0, 8.5, 10.0)  # 4.5% under on the mean, though too scattered to bound under 1
    assert verdict(rows(1.30, 1.29, auto_runs=scattered)) == "MISS"
    assert verdict(rows(1.30, 1.29, static_runs=(10.0,), auto_runs=(9.9,))) == "MISS"  # one run: no noise to be within


def test_paired_bounds_the_mean_ratio_by_repeat_with_students_t():
    import math

    import numpy as np
    import pytest

    from perf.never_slower_bar import paired
    mean, upper = paired([9.0, 11.0, 10.0], [10.0, 10.0, 10.0])
    d = np.log([0.9, 1.1, 1.0])
    assert mean == pytest.approx(math.exp(d.mean()))
    assert upper == pytest.approx(math.exp(d.mean() + 2.920 * d.std(ddof=1) / math.sqrt(3)))
    assert paired([10.0, 10.0], [10.0, 10.0]) == (1.0, 1.0)  # no spread: the bound is the mean
    assert paired([10.0], [10.0]) is None and paired([1.0, 2.0], [1.0]) is None  # unpaired: no bound


def test_a_cell_runs_every_method_interleaved_and_counts_outputs_equal_to_ar():
    import pytest

    from cast_trtllm.cost_model import OnlineCostModel
    from perf.never_slower import METHODS, cell

    from .conftest import tiny_session

    engine = tiny_session().built.engine  # cast:auto needs a width rule: a cost table of this shape's kind
    drafter = engine.drafter
    cost = OnlineCostModel(prior={1: 2.0, 16: 3.0, 32: 5.0}, prior_draft_ms=0.5, mass_exponent=drafter.mass_exponent,
                           draft_rows=1 + drafter.num_draft_positions)
    engine.width, engine.cost = (lambda prefix: cost), cost
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    rows, reference = cell(engine, prompts, 6, 2, repeats=2, min_seconds=60.0, max_repeats=3)
    assert set(rows) == {m.label for m in METHODS} and len(reference) == 2
    for row in rows.values():  # short runs: repeated up to max_repeats, after one untimed run each
        assert len(row["runs_tokens_per_s"]) == 3 and row["tokens_per_s"] > 0 and row["cpu_s"] > 0
        assert len(row["runs_drafted_share"]) == len(row["runs_mean_R"]) == 3  # every run's, beside the best's
        assert row["drafted_share"] in row["runs_drafted_share"] and min(row["runs_mean_R"]) >= 1.0
        assert row["warmup_wall_s"] > 0
        assert row["equal_to_ar"] == row["requests"] == 2  # fp32: every method's greedy output is AR's
    assert rows["ar"]["vs_ar"] == 1.0 and rows["ar"]["drafted_share"] == 0.0 and rows["ar"]["paired_vs_ar"] == 1.0
    for row in rows.values():  # the median of per-repeat ratios over AR's run in the same repeat
        ratios = sorted(x / a for x, a in zip(row["runs_tokens_per_s"], rows["ar"]["runs_tokens_per_s"]))
        assert row["paired_vs_ar"] == pytest.approx(ratios[1])


def test_a_run_in_waves_serves_every_prompt_once_each_wave_all_at_once():
    from perf.harness import MethodSpec
    from perf.never_slower import serve_waves

    from .conftest import tiny_session

    engine = tiny_session().built.engine
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9], [10, 11, 12]]
    served, joined = [], engine.add_request
    engine.add_request = lambda req: served.append(len(engine.active)) or joined(req)  # live when each joins
    try:
        wall, seqs = serve_waves(engine, MethodSpec("ar"), prompts, 5, 2, waves=2)
    finally:
        del engine.add_request
    assert wall > 0 and len(seqs) == 4 and served == [0, 1, 0, 1]  # a wave joins once the last one finished
    _, whole = serve_waves(engine, MethodSpec("ar"), prompts, 5, 4)  # one wave of 4
    assert sorted(s.tokens for s in seqs) == sorted(s.tokens for s in whole)  # the same requests, all served


def test_cells_where_no_width_pays_get_the_floor_repeats():
    from perf.never_slower_bar import timed_repeats

    slow_static = {"ar": 6.0, "cast:3": 7.5, "cast:auto": 6.1}  # warm-up walls: cast:3 slower than AR
    assert timed_repeats(slow_static, 3, 30.0, 20, 8) == 8  # 30 s alone would give 5
    assert timed_repeats(slow_static, 3, 30.0, 20, 0) == 5
    fast_static = {"ar": 6.0, "cast:3": 4.0, "cast:auto": 4.1}  # a width pays: the time rule alone
    assert timed_repeats(fast_static, 3, 30.0, 20, 8) == 8  # 30 / 4 s
    assert timed_repeats(fast_static, 3, 12.0, 20, 8) == 3
    assert timed_repeats({"ar": 0.5, "cast:3": 0.6}, 3, 30.0, 20, 8) == 20  # short runs: up to max_repeats
    assert timed_repeats({"a": 1.0, "b": 1.0}, 3, 0.0, 20, 8) == 3  # an A/A cell (`never_slower_aa`)


def test_the_server_part_joins_the_page_from_an_aiperf_run_folder(tmp_path):
    import json

    import pytest

    from perf.never_slower import aiperf_part

    with pytest.raises(SystemExit, match="aiperf_run.sh"):
        aiperf_part(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps([
        {"concurrency": 8, "method": "ar", "tokens_per_s": 50.0, "runs": [50.0, 48.0], "vs_ar": 1.0},
        {"concurrency": 8, "method": "auto", "tokens_per_s": 51.0, "runs": [51.0, 47.5], "vs_ar": 1.02},
        {"concurrency": 8, "method": "cast3", "tokens_per_s": 40.0, "runs": [40.0, 39.0], "vs_ar": 0.80}]))
    (tmp_path / "command.txt").write_text("LEVELS=\"8\" perf/aiperf_run.sh OUT\n")
    report = {"command": "x", "machine": {}, "engine": {}, "wall_minutes": 1.0, "cells": [],
              "aiperf": aiperf_part(tmp_path)}
    text = page(report)
    assert '`LEVELS="8" perf/aiperf_run.sh OUT`' in text and "| 8 | auto | 51.0 | 1.02 | - | - | 51.0, 47.5 | meets |" in text


def test_the_aa_run_judges_cast3_against_itself_by_the_bar_and_by_the_rule_it_replaced():
    import pytest

    from perf.never_slower_aa import gap_rule, judged, methods, prompts

    def row(vs_ar, runs):
        return {"vs_ar": vs_ar, "runs_tokens_per_s": runs}
    # the twin's best run 1% under cast:3's, every method's best two runs 0.5% apart: the old rule called it
    # MISS; paired by repeat, the twin reads faster in two of three, and the bar cannot tell them apart
    rows = {"ar": row(1.0, [10.0, 9.95, 9.0]), "cast:3": row(1.2, [12.0, 11.94, 11.0]),
            "cast:auto": row(1.188, [11.88, 11.95, 11.5])}
    out = judged(rows)
    assert gap_rule(rows) == "MISS" and out["bar"] == "within noise"
    assert out["best_run_ratio"] == pytest.approx(0.99) and out["paired"][1] >= 1.0
    assert out["bar_on_ar"] == "MISS"  # AR in auto's place, every repeat 17% under cast:3: the bar sees it
    # no width pays: the twin is AR's, held to the 0.98 x AR floor (the gap rule judged width cells only)
    flat = judged({"ar": row(1.0, [10.0, 9.9]), "cast:3": row(0.8, [8.0, 7.9]), "cast:auto": row(0.97, [9.7, 9.9])})
    assert flat["bar"] == "MISS" and flat["gap_rule"] == "-" and "bar_on_ar" not in flat
    assert flat["paired"][0] == pytest.approx((0.97 * 1.0) ** 0.5)
    assert [m.label for m in methods("c16:all-at-once=ar")] == ["ar", "cast:3", "ar"]
    assert [m.label for m in methods("b1:gsm8k")] == ["ar", "cast:3", "cast:3"]
    with pytest.raises(SystemExit, match="b1:<domain>"):
        prompts(lambda text: [1], "c4:sometimes", 2)
    with pytest.raises(SystemExit, match="twin"):
        methods("c4:continuous=chain")


def test_the_aa_page_judges_its_stored_runs_again(tmp_path):
    import json

    from perf.never_slower_aa import main
    runs = {"ar": [10.0, 9.9, 10.1], "cast:3": [12.0, 12.1, 11.9], "cast:auto": [11.9, 12.0, 11.8]}
    (tmp_path / "aa.json").write_text(json.dumps({"command": "x", "code": "abc1234", "machine": {}, "wall_minutes": 1.0,
                                                  "cells": [{"cell": "b1:gsm8k", "runs": runs, "bar": "stale"}]}))
    main(["--out", str(tmp_path / "aa"), "--page-only"])
    cell = json.loads((tmp_path / "aa.json").read_text())["cells"][0]
    assert cell["bar"] == "within noise" and cell["bar_on_ar"] == "MISS" and cell["runs"] == runs
    assert "| b1:gsm8k | 1.20 | 0.992 |" in (tmp_path / "aa.md").read_text()


def test_the_aiperf_summary_keeps_repeats_in_number_order(tmp_path):
    """The server part's bar pairs the methods' runs by repeat: r10 comes after r9, not after r1."""
    import json

    from perf.aiperf_summary import main
    for method, base in (("ar", 10.0), ("auto", 20.0)):
        for r in (1, 2, 10):
            run = tmp_path / f"c8-{method}-r{r}" / "artifacts"
            run.mkdir(parents=True)
            (run / "profile_export_aiperf.csv").write_bytes(
                f"Metric,avg\r\nOutput Token Throughput (tokens/sec),{base + r}\r\n".encode())
    main(str(tmp_path))
    rows = {r["method"]: r for r in json.loads((tmp_path / "summary.json").read_text())}
    assert rows["ar"]["runs"] == [11.0, 12.0, 20.0] and rows["auto"]["runs"] == [21.0, 22.0, 30.0]


def test_the_aiperf_summary_reads_each_runs_drafting_from_the_servers_counter_steps(tmp_path):
    """A run's rounds are the steps of the server's counters since the run before it ran (`order.txt`), so one
    method's drafting is told from the others' though the counters sum every method's runs."""
    import json

    import pytest

    from perf.aiperf_summary import main
    totals = 0.0, 0.0, 0.0  # rounds, drafted rounds, committed tokens, as the server counts them
    order = []
    for name, (rounds, drafted, committed), tps in (("c4-ar-r0", (100, 0, 100), 40.0), ("c4-auto-r0", (100, 5, 110), 41.0),
                                                    ("c4-auto-r1", (90, 30, 120), 42.0), ("c4-ar-r1", (100, 0, 100), 40.0)):
        totals = totals[0] + rounds, totals[1] + drafted, totals[2] + committed
        run = tmp_path / name
        (run / "artifacts").mkdir(parents=True)
        (run / "artifacts" / "profile_export_aiperf.csv").write_bytes(
            f"Metric,avg\r\nOutput Token Throughput (tokens/sec),{tps}\r\n".encode())
        (run / "server_metrics.txt").write_text(
            "# HELP cast_rounds_total Verify rounds of all requests.\n# TYPE cast_rounds_total counter\n"
            f"cast_rounds_total {totals[0]}\ncast_drafted_rounds_total {totals[1]}\n"
            f"cast_committed_tokens_total {totals[2]}\n")
        order.append(name)
    (tmp_path / "order.txt").write_text("\n".join(order) + "\n")
    main(str(tmp_path))
    rows = {r["method"]: r for r in json.loads((tmp_path / "summary.json").read_text())}
    assert rows["auto"]["drafted_share"] == pytest.approx(35 / 190)
    assert rows["auto"]["committed_per_round"] == pytest.approx(230 / 190)
    assert rows["ar"]["drafted_share"] == 0.0
    assert rows["auto"]["paired_vs_ar"][0] == pytest.approx((41 / 40 * 42 / 40) ** 0.5)
    assert "| 4 | auto | 42.0 | 1.05 | 1.037 (<= " in (tmp_path / "summary.md").read_text()
    (tmp_path / "c4-auto-r1" / "server_metrics.txt").unlink()  # a run that did not finish: said, not skipped
    with pytest.raises(SystemExit, match="c4-auto-r1"):
        main(str(tmp_path))


def test_an_unknown_domain_is_named_before_anything_runs(capsys):
    """A re-run of named B = 1 cells (`--domains`) says which name it does not know and what to pick from."""
    import pytest

    from perf.never_slower import main
    with pytest.raises(SystemExit):
        main(["--out", "unused", "--domains", "gsm8k,gsm8", "--parts", "b1"])
    err = capsys.readouterr().err
    assert "unknown ['gsm8']" in err and "mt_bench" in err
