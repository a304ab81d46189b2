"""The onnxruntime backend keeps the target's law and the round contract: its verify rows
equal the torch reference's (fp32, <= 1e-4), its KV after commits equals a fresh prefill,
and the one engine on it reproduces AR token for token (chain, CAST N = 1 and 15)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from cast_trtllm.spec_config import SpecConfig
from cast_trtllm.tree import Tree, build_tree, topk_per_position
from runtime.drafter import DrafterExecutor, random_drafter
from runtime.engine import LLMEngine, Request
from runtime.engine.backend import TorchTarget
from runtime.backends.slot_pool import CacheFullError
from tests.runtime.doubles import ScriptedDrafter, random_target, tiny_target

ort = pytest.importorskip("onnxruntime")
from runtime.backends.ort_target import OrtTarget  # noqa: E402  (needs onnxruntime)

VOCAB, TAPS, ATOL = 64, (0, 1), 1e-4
PROMPTS = [(1, 2, 3), (40, 41, 7, 7, 7, 2), (9,), (63, 0, 12, 33, 8, 5, 5, 19, 21)]


@pytest.fixture(scope="module")
def model():
    return random_target(seed=5, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("onnx")


@pytest.fixture(scope="module")
def backends(model, cache_dir):
    """(onnxruntime, torch) backends over the same weights, tapping TAPS."""
    return OrtTarget(model, TAPS, threads=1, cache_dir=cache_dir), TorchTarget(model, TAPS)


def random_tree(budget: int, seed: int, depth: int = 6) -> Tree:
    """A best-first tree over the top-8 of random drafter logits (budget 0: the root alone)."""
    logits = torch.randn(depth, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3
    ids, logprobs = topk_per_position(logits, 8)
    return build_tree(ids.numpy(), logprobs.numpy(), budget)


def kept_rows(tree: Tree, seed: int) -> np.ndarray:
    """[0] + the root-to-node path of a random packed node (pack indices, increasing)."""
    node = int(np.random.default_rng(seed).integers(0, tree.num_packed))
    path = [node]
    while tree.pack_parent[path[-1]] > 0:
        path.append(int(tree.pack_parent[path[-1]]))
    return np.array(sorted({0, *path}), dtype=np.int64)


def test_verify_rows_match_the_torch_target_on_random_trees_at_several_prefixes(backends):
    ort_target, torch_target = backends
    prompt = torch.randint(0, VOCAB, (11,), generator=torch.Generator().manual_seed(0))
    seqs = [b.new_sequence(200) for b in backends]
    outs = [b.prefill(s, prompt) for b, s in zip(backends, seqs)]
    for (a, b) in zip(*outs):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=ATOL, rtol=0)
    for round_, budget in enumerate((0, 15, 40, 3, 63, 1)):  # 40, 63: two bitmask words
        tree = random_tree(budget, seed=round_)
        pack = np.concatenate([[round_ + 1], tree.tokens]).astype(np.int64)
        assert ort_target.prefix_len(seqs[0]) == torch_target.prefix_len(seqs[1])
        (lo, to), (lt, tt) = [b.verify([s], [pack], [tree]) for b, s in zip(backends, seqs)]
        assert lo.shape == (tree.num_packed, VOCAB) and to.shape == (tree.num_packed, 2 * 64)
        np.testing.assert_allclose(lo.numpy(), lt.numpy(), atol=ATOL, rtol=0)
        np.testing.assert_allclose(to.numpy(), tt.numpy(), atol=ATOL, rtol=0)
        keep = kept_rows(tree, seed=round_)
        for b, s in zip(backends, seqs):
            b.commit(s, keep)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])  # q/k/v biases; q/k RMSNorm
def test_verify_rows_match_the_torch_target_for_other_families(model_type, cache_dir):
    model = tiny_target(model_type, seed=2)[1]
    prompt, tree = torch.arange(3, 12), random_tree(15, seed=4)
    pack = np.concatenate([[5], tree.tokens]).astype(np.int64)
    rows = []
    for backend in (OrtTarget(model, (1,), threads=1, cache_dir=cache_dir), TorchTarget(model, (1,))):
        seq = backend.new_sequence(32)
        backend.prefill(seq, prompt)
        rows.append(backend.verify([seq], [pack], [tree]))
    for ours, reference in zip(*rows):  # logits up to ~65 here: fp32 rounding reaches 1e-4
        np.testing.assert_allclose(ours.numpy(), reference.numpy(), atol=ATOL, rtol=1e-5)


def test_ragged_batch_verify_returns_each_requests_rows_in_pack_order(backends):
    ort_target, torch_target = backends
    prompts = [torch.arange(5), torch.arange(20, 37)]  # different prefixes P
    trees = [random_tree(15, seed=7), random_tree(4, seed=8)]
    packs = [np.concatenate([[3], t.tokens]).astype(np.int64) for t in trees]
    rows = []
    for backend in backends:
        seqs = [backend.new_sequence(64) for _ in prompts]
        for s, p in zip(seqs, prompts):
            backend.prefill(s, p)
        rows.append(backend.verify(seqs, packs, trees))
    (lo, to), (lt, tt) = rows
    assert lo.shape[0] == sum(t.num_packed for t in trees)
    np.testing.assert_allclose(lo.numpy(), lt.numpy(), atol=ATOL, rtol=0)
    np.testing.assert_allclose(to.numpy(), tt.numpy(), atol=ATOL, rtol=0)


def test_kv_after_commits_equals_a_fresh_prefill_of_the_committed_tokens(backends):
    ort_target, torch_target = backends
    tokens = list(range(30, 39))
    seq = ort_target.new_sequence(128)
    ort_target.prefill(seq, torch.tensor(tokens))
    for round_, budget in enumerate((15, 0, 31, 7)):
        tree = random_tree(budget, seed=10 + round_)
        pack = np.concatenate([[round_], tree.tokens]).astype(np.int64)
        ort_target.verify([seq], [pack], [tree])
        keep = kept_rows(tree, seed=round_)
        ort_target.commit(seq, keep)
        tokens += pack[keep].tolist()
    n = ort_target.prefix_len(seq)
    assert n == len(tokens)
    fresh = ort_target.new_sequence(n)
    ort_target.prefill(fresh, torch.tensor(tokens))
    reference = torch_target.new_sequence(n)
    torch_target.prefill(reference, torch.tensor(tokens))
    pool = ort_target.pool
    for ours, again, torch_rows in zip(pool.committed(seq), pool.committed(fresh), torch_target.pool.committed(reference)):
        np.testing.assert_allclose(ours, again, atol=ATOL, rtol=0)  # [P, layers, Hkv, d]
        np.testing.assert_allclose(ours, torch_rows, atol=ATOL, rtol=0)


def test_batched_pass_over_a_pool_with_holes_and_growth_equals_each_request_alone(backends):
    """Slots freed in the middle of the range, the pool growing (more slots, a larger C)
    while requests live: every request's rows in one batched pass equal its pass alone."""
    ort_target, torch_target = backends
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (int(n),), generator=gen) for n in (4, 9, 2, 13, 6, 3, 7)]
    seqs = [ort_target.new_sequence(40) for _ in prompts]
    for s, p in zip(seqs, prompts):
        ort_target.prefill(s, p)
    for gone in (seqs[1], seqs[4]):
        ort_target.release(gone)
    live = [seqs[i] for i in (6, 0, 3, 5, 2)]  # not in slot order
    long_prompt = torch.arange(140) % VOCAB
    live.append(ort_target.new_sequence(300))  # takes a hole; C grows past 128 as its prompt is written
    ort_target.prefill(live[-1], long_prompt)
    trees = [random_tree(b, seed=20 + i) for i, b in enumerate((3, 0, 15, 7, 1, 31))]
    packs = [np.concatenate([[i + 1], t.tokens]).astype(np.int64) for i, t in enumerate(trees)]
    together, taps = ort_target.verify(live, packs, trees)
    row = 0
    for s, pack, tree in zip(live, packs, trees):
        reference = torch_target.new_sequence(300)
        torch_target.prefill(reference, prompts[seqs.index(s)] if s in seqs else long_prompt)
        alone, _ = torch_target.verify([reference], [pack], [tree])
        np.testing.assert_allclose(together[row:row + tree.num_packed].numpy(), alone.numpy(), atol=ATOL, rtol=0)
        row += tree.num_packed
    assert ort_target.pool.capacity >= 256 and ort_target.pool.num_slots >= 6


def test_key_columns_follow_the_live_requests_rows_not_a_pack_nor_a_request_that_left(model, cache_dir):
    """Every pass attends over all C columns of the pool: a wide pack must not widen C, and C
    shrinks (rows kept) once the request that needed it has left."""
    target = OrtTarget(model, TAPS, threads=1, cache_dir=cache_dir)
    short = target.new_sequence(400)
    target.prefill(short, torch.arange(120) % VOCAB)
    assert target.pool.capacity == 128
    tree = random_tree(31, seed=3)
    target.verify([short], [np.concatenate([[5], tree.tokens]).astype(np.int64)], [tree])  # 120 + 32 rows seen
    target.commit(short, np.array([0, 1]))
    assert target.pool.capacity == 128  # only the 2 kept rows were written
    long = target.new_sequence(400)
    target.prefill(long, torch.arange(300) % VOCAB)
    assert target.pool.capacity == 384
    rows = [a.copy() for a in target.pool.committed(short)]
    target.release(long)
    target.verify([short], [np.array([7])], [Tree.empty()])
    target.commit(short, np.array([0]))
    assert target.pool.capacity == 256  # the live request's 123 rows plus one step
    for before, after in zip(rows, target.pool.committed(short)):
        np.testing.assert_array_equal(after[:len(before)], before)


def _generate(target, drafter, prompts, method, budget=None, max_new=40) -> list[list[int]]:
    engine = LLMEngine(target, drafter, spec=SpecConfig(method=method))
    return [r.token_ids for r in engine.generate([Request(p, max_new, method=method, budget=budget) for p in prompts])]


@pytest.mark.parametrize("method, budget", [("chain", None), ("cast", 1), ("cast", 15)])
def test_greedy_engine_on_onnxruntime_reproduces_ar_and_torch_ar(model, cache_dir, method, budget):
    drafter = DrafterExecutor(random_drafter(model.config, block_size=8, seed=3, init_std=0.3), model)
    target = OrtTarget(model, drafter.tap_layer_ids, threads=1, cache_dir=cache_dir)
    torch_ar = _generate(model, None, PROMPTS, "ar")
    assert _generate(OrtTarget(model, (), threads=1, cache_dir=cache_dir), None, PROMPTS, "ar") == torch_ar
    for prompt, want in zip(PROMPTS, torch_ar):  # B = 1, one request at a time
        assert _generate(target, drafter, [prompt], method, budget) == [want]
    assert _generate(target, drafter, PROMPTS, method, budget) == torch_ar  # B = 4, ragged


def test_long_accepted_paths_on_onnxruntime_reproduce_ar(model, cache_dir):
    target = OrtTarget(model, (0,), threads=1, cache_dir=cache_dir)
    for prompt in PROMPTS:
        ref = _generate(model, None, [prompt], "ar", max_new=48)[0]
        engine = LLMEngine(target, ScriptedDrafter(len(prompt), ref, vocab=VOCAB), spec=SpecConfig(method="cast"))
        out = engine.generate([Request(prompt, 48, method="cast", budget=15)])[0]
        assert out.token_ids == ref
        assert max(out.accept_lengths) >= 3  # multi-token rounds really happened


def test_graph_is_exported_once_per_model_identity(model, cache_dir, backends, capfd):
    OrtTarget(model, TAPS, threads=1, cache_dir=cache_dir)
    assert "exporting" not in capfd.readouterr().err  # the same model and taps: reused
    other = random_target(seed=6, vocab_size=VOCAB)
    OrtTarget(other, TAPS, threads=1, cache_dir=cache_dir)
    assert "exporting" in capfd.readouterr().err  # other weights: another graph
    assert len([p for p in cache_dir.iterdir() if not p.name.startswith(".")]) >= 2


def test_refuses_a_non_fp32_target_and_a_full_cache(model, backends):
    with pytest.raises(ValueError, match="fp32"):
        OrtTarget(copy.deepcopy(model).to(torch.bfloat16), TAPS)
    ort_target = backends[0]
    seq = ort_target.new_sequence(4)  # the pool's C is larger: the request's own capacity is the limit
    with pytest.raises(CacheFullError, match="capacity"):
        ort_target.prefill(seq, torch.arange(5))
