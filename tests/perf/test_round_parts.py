"""`perf.bench latency --round-parts`: the parts of the engine's own decode rounds, timed in place."""

from cast_trtllm.sampling import SamplingParams
from perf.datasets import Request
from perf.harness import MethodSpec, run_bench
from perf.page import latency_page
from tests.perf.conftest import tiny_session


def test_parts_of_real_decode_rounds_add_up_within_the_round_per_method():
    session = tiny_session()
    session.time_round_parts()
    requests = [Request(0, 12, input_ids=(1, 2, 3, 4)), Request(1, 12, input_ids=(5, 6, 7))]
    bench = run_bench(requests, [MethodSpec("ar"), MethodSpec("cast", 3)], session, session.encode,
                      SamplingParams(0.0), progress=False, after_warmup=session.round_parts_ms)
    parts = session.round_parts_ms()
    cast = parts["cast:3"]
    assert cast["rounds"] == sum(r.result.num_rounds for r in bench.runs["cast:3"])  # the warm-up is not tallied
    assert all(cast[k] > 0 for k in ("feature cache", "draft", "trees (host)", "verify", "commit (host)"))
    assert sum(v for k, v in cast.items() if k not in ("round", "rounds")) <= cast["round"] * 1.01
    assert "draft" not in parts["ar"] and parts["ar"]["verify"] > 0
    assert session.round_parts_ms() == {}  # read once: the tally restarts


def test_the_latency_page_shows_the_parts_table():
    summary = [{"method": "ar", "ms_per_token": 1.0, "tokens_per_s": 1e3, "speedup_over_ar": 1.0,
                "gain_over_chain": None, "mean_R": 1.0, "mean_budget": 0.0, "ttft_ms": 1.0, "draft_share": 0.0,
                "verify_share": 1.0, "overhead_share": 0.0, "lossless": True, "equal_to_ar": 1, "requests": 1}]
    rep = {"summary": summary, "round_parts_ms": {"ar": {"rounds": 4, "verify": 0.5, "round": 0.6}},
           "machine": {}, "engine": {}, "dataset": {"num_requests": 1},
           "settings": {"date": "today", "timer": "t"}}
    page = latency_page({"command": "c", "domains": {"d": rep}}, None)
    assert "| ar | 4 | 0.00 | 0.00 | 0.00 | 0.50 | 0.00 | 0.60 |" in page
