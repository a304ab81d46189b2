"""The round a GPU can run (issue 37), proven on the CPU: the model runner's device part is
one static-shape function of preallocated buffers (no host scalar read, no data-dependent
shape, one upload and one read per round, traced whole by torch._dynamo), the pool is
allocated once, and greedy output through it equals AR token for token, with the torch
attention and with the project's Triton pool kernel (through TRITON_INTERPRET=1 here).

The target is a tiny random-weight model of the GPU check's shape family and the drafter
is the GPU check's calibrated oracle (`perf.gpu_round_loop`): a real engine, a drafter of
controlled acceptance. The embedded model runs the same path at the end."""

from __future__ import annotations

import pytest
import torch

from perf import gpu_round_loop as loop
from runtime.backends.static_pool import PoolFullError
from runtime.engine import Request
from runtime.engine.runner_target import RunnerTarget
from runtime.model.pool_forward import device_round
from tests.runtime.engine.test_host_reads import SyncOps

CFG = loop.SHAPES["tiny"]
L = 7
MIXED = (("ar", None), ("chain", None), ("cast", 15), ("cast", "auto"))


@pytest.fixture(scope="module")
def target():
    return loop.random_target(CFG, torch.device("cpu"), torch.float32)


@pytest.fixture(scope="module")
def reference(target):
    """Five prompts and their greedy continuations (AR on the eager torch backend)."""
    ids, ar = loop.continuations(target, CFG, 5, 12, 60)
    return ids, ar, [p + r.token_ids for p, r in zip(ids, ar)]


def runner_engine(target, conts, method="cast", budget=15, attention="torch", slots=8, context=192):
    runner = RunnerTarget(target, (1,), max_slots=slots, max_context=context, attention=attention, max_depth=8)
    drafter = loop.OracleDrafter(conts, CFG.vocab_size, L, 0.25, torch.device("cpu"))
    return loop.engine_for(runner, drafter, method, budget, L), runner


def mixed_engine(target, conts, **kwargs):
    """An engine whose requests are ar / chain / cast:15 / cast:auto (per-request method)."""
    engine, runner = runner_engine(target, conts, "cast", "auto", **kwargs)
    return engine, runner


def buffers(runner) -> dict:
    out = {"pool.keys": runner.pool.keys.data_ptr(), "pool.values": runner.pool.values.data_ptr()}
    for key, b in runner.runner.buckets.items():
        out.update({(key, "host"): b.host.data_ptr(), (key, "meta"): b.meta.data_ptr(),
                    (key, "readout"): b.readout.data_ptr()})
    return out


def test_mixed_batch_joins_and_leaves_keep_every_buffer_and_one_upload_and_read(target, reference):
    ids, ar, conts = reference
    engine, runner = mixed_engine(target, conts * 8)
    seen: dict = {}
    joined, rounds = 0, 0
    while rounds < 20:
        while len(engine.active) < 4 and joined < 12:  # a request joins as one leaves
            method, budget = MIXED[joined % 4]
            engine.add_request(Request(ids[joined % 5], 6 + joined % 5, method=method, budget=budget,
                                       ignore_eos=True))
            joined += 1
        before = (runner.runner.uploads, runner.runner.reads)
        decoding = any(not s.prefilling for s in engine.active)
        engine.step()
        rounds += 1
        if decoding:
            assert (runner.runner.uploads - before[0], runner.runner.reads - before[1]) == (1, 1)
        for name, ptr in buffers(runner).items():  # a buffer, once made, is never reallocated
            assert seen.setdefault(name, ptr) == ptr, name
    assert joined > 4 and len(runner.runner.buckets) >= 2


def test_a_steady_mixed_round_makes_no_other_upload_than_its_metadata(target, reference, monkeypatch):
    """Every host array the engine's own code turns into a tensor in a steady round (the oracle
    drafter's one upload is the test drafter's, not the engine's): none; the runner's metadata
    goes up as one copy into its bucket's buffer."""
    import traceback

    ids, _, conts = reference
    engine, runner = mixed_engine(target, conts)
    for k, (method, budget) in enumerate(MIXED):
        engine.add_request(Request(ids[k], 40, method=method, budget=budget, ignore_eos=True))
    for _ in range(4):
        engine.step()
    made = []
    for name in ("from_numpy", "as_tensor", "tensor"):
        original = getattr(torch, name)

        def spy(*args, original=original, name=name, **kwargs):
            caller = traceback.extract_stack()[-2].filename
            if "/perf/" not in caller:
                made.append((name, caller))
            return original(*args, **kwargs)
        monkeypatch.setattr(torch, name, spy)
    uploads = runner.runner.uploads
    for _ in range(3):
        engine.step()
    assert made == [] and runner.runner.uploads - uploads == 3


def test_device_part_has_no_host_read_and_no_data_dependent_shape(target, reference):
    _, _, conts = reference
    engine, runner = runner_engine(target, conts, "cast", 15)
    engine.generate([Request(conts[0][:12], 8, method="cast", budget=15, ignore_eos=True)])  # a bucket with trees
    bucket = max(runner.runner.buckets.values(), key=lambda b: b.width)
    seen: list = []
    with SyncOps(seen):
        device_round(target, (1,), runner.pool, bucket.meta, runner.max_depth, runner.runner.attend)
    assert seen == []


@pytest.mark.parametrize("batch, width", [(1, 1), (4, 16)])
def test_device_part_of_a_bucket_traces_whole_with_dynamo(target, reference, batch, width):
    _, _, conts = reference
    _, runner = runner_engine(target, conts)
    bucket = runner.runner.bucket(batch, width)
    torch._dynamo.reset()
    compiled = torch.compile(lambda meta: device_round(target, (1,), runner.pool, meta, runner.max_depth,
                                                       runner.runner.attend), fullgraph=True, backend="eager")
    with torch.inference_mode():
        out = compiled(bucket.meta)  # fullgraph=True: any graph break raises
        eager = device_round(target, (1,), runner.pool, bucket.meta, runner.max_depth, runner.runner.attend)
    assert torch.equal(out[-1], eager[-1]) and torch.allclose(out[0], eager[0], atol=1e-5)


@pytest.mark.parametrize("attention", ["torch", "triton"])
def test_greedy_through_the_runner_equals_ar_and_a_mixed_batch_equals_each_alone(target, reference, attention):
    pytest.importorskip("triton") if attention == "triton" else None
    ids, ar, conts = reference
    n = 14 if attention == "triton" else 40
    for method, budget in MIXED[1:] if attention == "torch" else (("cast", 15),):
        engine, _ = runner_engine(target, conts, method, budget, attention)
        together = engine.generate([Request(p, n, method=method, budget=budget, ignore_eos=True) for p in ids[:3]])
        assert [r.token_ids for r in together] == [a.token_ids[:n] for a in ar[:3]], (method, budget)
        assert max(r.mean_accept_length for r in together) > 1.5  # trees were accepted, not only roots
    engine, _ = runner_engine(target, conts[1:2], "cast", 15, attention)
    alone = engine.generate([Request(ids[1], n, method="cast", budget=15, ignore_eos=True)])
    assert alone[0].token_ids == ar[1].token_ids[:n]


def test_sampled_requests_beside_greedy_ones_draw_the_same_tokens_as_on_the_torch_backend(target, reference):
    """A sampled request rides the runner's pass uncommitted and walks after it (Theorem 3's walk, its
    seeded uniforms): seeded, it draws exactly what it draws on the eager torch backend, so the runner
    keeps the sampled law the law tests check there; the greedy request beside it still equals AR."""
    from cast_trtllm.sampling import SamplingParams
    from runtime.engine.backend import TorchTarget

    ids, ar, conts = reference
    requests = [Request(ids[0], 20, method="cast", budget=15, ignore_eos=True,
                        sampling=SamplingParams(temperature=1.0, seed=7)),
                Request(ids[1], 20, method="cast", budget=15, ignore_eos=True)]
    outs = []
    for backend in (TorchTarget(target, (1,)), RunnerTarget(target, (1,), max_slots=4, max_context=192, max_depth=8)):
        drafter = loop.OracleDrafter(conts[:2], CFG.vocab_size, L, 0.25, torch.device("cpu"))
        outs.append([r.token_ids for r in loop.engine_for(backend, drafter, "cast", 15, L).generate(requests)])
    assert outs[0] == outs[1] and outs[1][1] == ar[1].token_ids[:20]


def test_pool_is_allocated_once_over_100_rounds_and_a_full_pool_refuses(target, reference):
    ids, ar, conts = reference
    engine, runner = runner_engine(target, conts * 40, "chain", None, slots=3, context=96)
    pool = (runner.pool.keys.data_ptr(), runner.pool.values.data_ptr())
    served, rounds = [], 0
    while rounds < 100:
        while len(engine.active) < 3:
            k = len(served)
            served.append((k % 5, engine.add_request(Request(ids[k % 5], 3 + k % 4, method="chain", ignore_eos=True))))
        engine.step()
        rounds += 1
    assert (runner.pool.keys.data_ptr(), runner.pool.values.data_ptr()) == pool
    while len(engine.active) < 3:  # every slot taken
        served.append((len(served) % 5, engine.add_request(Request(ids[len(served) % 5], 4, method="chain",
                                                                   ignore_eos=True))))
    with pytest.raises(PoolFullError, match="all 3 KV pool slots are taken"):
        engine.add_request(Request(ids[0], 4, method="chain", ignore_eos=True))
    with pytest.raises(PoolFullError, match="max_context 96"):
        RunnerTarget(target, (1,), max_slots=1, max_context=96).new_sequence(200)
    done = [(k, s) for k, s in served if s.done]
    assert len(done) > 20 and all(s.tokens == ar[k].token_ids[:len(s.tokens)] for k, s in done)


@pytest.fixture(scope="module")
def embedded_runners(embedded_checkpoint):
    """The embedded target and the shipped DFlash head on the GPU path's two runners (eager here)."""
    from runtime.engine.draft_runner import DraftRunner
    from runtime.loader import models_from_hf

    models = models_from_hf(embedded_checkpoint, drafter="default")  # the session's weights, the shipped head
    taps = tuple(models.drafter.config.target_layer_ids)
    target = RunnerTarget(models.target, taps, max_slots=4, max_context=192)
    return models, target, DraftRunner(models.drafter, models.target, max_slots=4, max_context=192)


def test_the_embedded_model_on_both_runners_stays_lossless(embedded_runners):
    from runtime.engine import LLMEngine

    models, target, drafter = embedded_runners
    prompts = [models.tokenizer(p)["input_ids"] for p in ("def fibonacci(n):", "Tom has 3 apples and buys 5 more.")]
    ar = LLMEngine(models.target, None).generate([Request(p, 24, method="ar", ignore_eos=True) for p in prompts])
    engine = LLMEngine(target, drafter)
    uploads = drafter.uploads
    out = engine.generate([Request(p, 24, method="cast", budget=15, ignore_eos=True) for p in prompts])
    assert [o.token_ids for o in out] == [a.token_ids for a in ar]
    assert max(o.mean_accept_length for o in out) > 1.5
    rounds = max(len(o.budgets) for o in out)  # both joined at once: round i is budgets[i] of each
    drafted = sum(any(len(o.budgets) > i and o.budgets[i] > 0 for o in out) for i in range(rounds))
    assert 0 < drafted < rounds  # a request with one token left verifies its root alone (`Sequence.room`)
    assert drafter.uploads - uploads == drafted  # one drafter upload per drafted round


def test_the_drafter_part_is_static_and_traces_whole(embedded_runners):
    from runtime.model.draft_forward import draft_round

    models, _, drafter = embedded_runners
    bucket = drafter.bucket(2)
    args = (drafter.context, drafter.block, drafter.pool)
    tail = (models.drafter.config.mask_token_id, drafter.num_draft_positions, drafter.rank_cap, drafter.draft_ids)
    keys = drafter.pool.keys.data_ptr()
    seen: list = []
    with torch.inference_mode(), SyncOps(seen):
        eager = draft_round(*args, bucket.meta, bucket.taps, *tail)
    assert seen == []
    torch._dynamo.reset()
    compiled = torch.compile(lambda meta, taps: draft_round(*args, meta, taps, *tail), fullgraph=True,
                             backend="eager")
    with torch.inference_mode():
        traced = compiled(bucket.meta, bucket.taps)
    assert torch.equal(traced[0], eager[0]) and drafter.pool.keys.data_ptr() == keys


def test_a_server_queues_requests_while_the_preallocated_pool_is_full(target, reference):
    """Admission by capacity under a server: a request that finds every slot taken waits for one
    (nothing fails, nothing is lost); one that can never fit fails with the pool's message."""
    import threading

    from runtime.serving.scheduler import Scheduler

    ids, ar, conts = reference
    engine, _ = runner_engine(target, conts, "chain", None, slots=2, context=96)
    scheduler = Scheduler(engine, max_batch=8, max_queue=8, request_timeout_s=120)
    results, done = {}, threading.Event()

    def finished(k):
        def on_done(live, error):
            results[k] = (live, error)
            if len(results) == 6:
                done.set()
        return on_done

    for k in range(5):
        scheduler.submit(Request(ids[k], 8, method="chain", ignore_eos=True), lambda live: None, finished(k))
    scheduler.submit(Request(ids[0], 200, method="chain", ignore_eos=True), lambda live: None, finished(5))
    scheduler.start()
    assert done.wait(120)
    scheduler.shutdown(grace_s=5)
    assert all(results[k][1] is None and results[k][0].tokens == ar[k].token_ids[:8] for k in range(5))
    assert "max_context 96" in results[5][1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graph capture needs a CUDA device")
def test_captured_rounds_equal_eager_rounds_on_cuda():
    cuda = torch.device("cuda")
    model = loop.random_target(CFG, cuda, torch.float32)
    ids, ar = loop.continuations(model, CFG, 3, 12, 40)
    conts = [p + r.token_ids for p, r in zip(ids, ar)]
    outs = []
    for graphs in (False, True):
        runner = RunnerTarget(model, (1,), graphs=graphs, max_slots=4, max_context=192, max_depth=8)
        drafter = loop.OracleDrafter(conts, CFG.vocab_size, L, 0.25, cuda)
        engine = loop.engine_for(runner, drafter, "cast", 15, L)
        outs.append([r.token_ids for r in engine.generate([Request(p, 30, method="cast", budget=15, ignore_eos=True)
                                                           for p in ids])])
        assert all(b.graph is not None for b in runner.runner.buckets.values()) == graphs
    assert outs[0] == outs[1] == [a.token_ids[:30] for a in ar]


def test_auto_sized_ahead_rides_the_runners_one_read(target, reference):
    """cast:auto through the model runner (no gate here: each request's own last masses predict its next):
    once every request drafted a whole tree, its trees are sized before the round (`trees._ahead`) and its
    candidates' scores ride the runner's one read, so the engine reads nothing else mid-round; the masses its
    rounds record are this round's (each tree is their head); greedy output equals AR's."""
    ids, ar, conts = reference
    engine, runner = runner_engine(target, conts, "cast", "auto")
    seqs = [engine.add_request(Request(ids[k], 40, budget="auto", ignore_eos=True)) for k in range(4)]
    ahead = 0
    while engine.active:
        before = (runner.runner.reads, engine.host_reads.count)
        sized = all(not s.prefilling and s.masses is not None for s in engine.active)
        engine.step()
        if sized and any(s.drafted[-1] for s in seqs if s.drafted):
            ahead += 1
            assert (runner.runner.reads - before[0], engine.host_reads.count - before[1]) == (1, 1)
            for s in seqs:
                if s.drafted[-1] and s.masses is not None and s.budgets[-1]:
                    assert s.budgets[-1] <= len(s.masses) and s.masses[0] > 0
    assert ahead >= 5
    assert [s.tokens for s in seqs] == [r.token_ids[:40] for r in ar[:4]]
