"""Pool-layout Triton kernels == torch reference (CPU: through TRITON_INTERPRET=1, set in conftest)."""
import pytest
import torch

from plugins.tree_attention import (pool_tree_attention, pool_tree_attention_reference, pool_tree_attention_triton,
                                    triton_available)
from plugins.tree_attention.pool_kernel import plan_pool_launch
from tests.plugins.pool_batches import make_pool_batch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(atol=1e-4, rtol=1e-4)


def _runnable() -> str | None:
    if not triton_available():
        return "triton is not installed"
    import triton

    from plugins.tree_attention.pool_kernel import pool_split_kernel

    if DEVICE == "cpu" and isinstance(pool_split_kernel, triton.runtime.jit.JITFunction):
        return "triton was imported before TRITON_INTERPRET=1 was set (see tests/plugins/conftest.py)"
    return None


needs_triton = pytest.mark.skipif(_runnable() is not None, reason=str(_runnable()))


def run_both(batch: dict, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    on_device = {k: v.to(DEVICE) for k, v in batch.items()}
    return pool_tree_attention_triton(**on_device, **kwargs).cpu(), pool_tree_attention_reference(**batch, **kwargs)


def ragged_tree_batch(ratio: int, **kwargs) -> dict:
    """Engine-shaped: packs of 6 (tree), 4 (chain) and 1 token padded to n = 8, prefixes 0 / 37 / 64,
    slots 4, 1, 5 of a 6-slot pool (0, 2, 3 outside the batch)."""
    return make_pool_batch([6, 4, 1], [0, 37, 64], [4, 1, 5], num_slots=6, capacity=64, n=8,
                           num_q_heads=2 * ratio, num_kv_heads=2, shapes=["tree", "chain", "tree"], **kwargs)


@needs_triton
@pytest.mark.parametrize("ratio", [1, 4])
def test_ragged_tree_batch_matches_reference_with_one_and_two_splits(ratio):
    batch = ragged_tree_batch(ratio, seed=ratio)
    one, ref = run_both(batch, num_splits=1)
    two, _ = run_both(batch, num_splits=2)
    torch.testing.assert_close(one, ref, **TOL)
    torch.testing.assert_close(two, ref, **TOL)
    torch.testing.assert_close(one, two, atol=1e-5, rtol=1e-5)
    assert not one.isnan().any()


@needs_triton
def test_every_split_count_of_a_long_prefix_gives_the_same_output():
    batch = make_pool_batch([5, 3, 8], [96, 33, 5], [2, 0, 3], num_slots=4, capacity=96, n=8, num_q_heads=4,
                            num_kv_heads=1, head_dim=24)  # d padded to BLOCK_D = 32
    ref = pool_tree_attention_reference(**batch)
    outs = [run_both(batch, num_splits=s)[0] for s in (1, 2, 3, 8)]  # 8 is cut to ceil(96 / 32) = 3
    for out in outs:
        torch.testing.assert_close(out, ref, **TOL)
        torch.testing.assert_close(out, outs[0], atol=1e-5, rtol=1e-5)


@needs_triton
def test_strided_layer_view_int64_indices_and_strided_queries():
    batch = ragged_tree_batch(4, index_dtype=torch.int64)
    ref = pool_tree_attention_reference(**batch)
    for name in ("k_pool", "v_pool"):  # layer 1 of a [layers, S, Hkv, C, d] pool, as SlotPool.keys[1]
        layers = torch.zeros((3, *batch[name].shape), dtype=batch[name].dtype)
        layers[1] = batch[name]
        batch[name] = layers[1]
    batch["q"] = batch["q"].transpose(1, 2).contiguous().transpose(1, 2)  # [B, n, Hq, d] view of [B, Hq, n, d]
    assert not batch["q"].is_contiguous()
    out, _ = run_both(batch, num_splits=2, scale=0.3)
    torch.testing.assert_close(out, pool_tree_attention_reference(**batch, scale=0.3), **TOL)
    assert not torch.allclose(out, ref)  # the scale was applied


@needs_triton
def test_pack_wider_than_one_mask_word_ignores_padding_words():
    batch = make_pool_batch([40], [20], [1], num_slots=2, capacity=32, n=40, num_q_heads=1, num_kv_heads=1,
                            shapes=["chain"])
    assert batch["bitmask"].shape == (1, 40, 2)
    out, ref = run_both(batch)
    torch.testing.assert_close(out, ref, **TOL)
    batch["bitmask"] = torch.cat([batch["bitmask"], torch.full((1, 40, 1), -1, dtype=torch.int32)], dim=2)
    torch.testing.assert_close(run_both(batch)[0], out)  # a third word of garbage: never read


@needs_triton
@pytest.mark.parametrize("num_splits", [1, 2])
def test_row_that_sees_nothing_outputs_zeros(num_splits):
    batch = make_pool_batch([3, 2], [0, 40], [0, 1], num_slots=2, capacity=64, n=4, num_q_heads=2, num_kv_heads=1)
    out, ref = run_both(batch, num_splits=num_splits)
    assert torch.all(out[0, 3] == 0) and not out.isnan().any()
    torch.testing.assert_close(out, ref, **TOL)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_matches_reference(dtype):
    if dtype == torch.bfloat16 and DEVICE == "cpu":
        pytest.skip("triton 3.9's interpreter runs tl.dot on the raw bf16 bits; bf16 is checked on CUDA")
    batch = ragged_tree_batch(4, dtype=dtype)
    out, ref = run_both(batch, num_splits=2)
    assert out.dtype == dtype
    tol = 1e-2 if dtype == torch.float16 else 4e-2
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


@needs_triton
def test_dispatch_runs_the_kernel_here():
    batch = {k: v.to(DEVICE) for k, v in ragged_tree_batch(1).items()}
    torch.testing.assert_close(pool_tree_attention(**batch).cpu(), pool_tree_attention_reference(**batch).cpu(), **TOL)


@needs_triton
def test_bad_input_raises_value_error_before_launch():
    batch = {k: v.to(DEVICE) for k, v in ragged_tree_batch(1).items()}
    batch["k_pool"] = batch["k_pool"].transpose(2, 3).contiguous().transpose(2, 3)  # head dim not contiguous
    with pytest.raises(ValueError, match="k_pool needs a contiguous last"):
        pool_tree_attention_triton(**batch)
    batch["bitmask"] = batch["bitmask"].long()
    with pytest.raises(ValueError, match="bitmask must be int32"):
        pool_tree_attention_triton(**batch)


def test_launch_plan_depends_on_shapes_only():
    decode = dict(batch=1, n=1, num_q_heads=32, num_kv_heads=8, head_dim=128, capacity=8192, dtype=torch.bfloat16)
    plan = plan_pool_launch(**decode, sm_count=132)  # H100/H200: 8 programs -> 32 splits of 256 columns
    assert (plan.num_tiles, plan.num_splits, plan.chunk, plan.block_m, plan.block_n) == (1, 32, 256, 16, 64)
    assert plan_pool_launch(**decode).num_splits == 1  # no SM count (CPU): one split
    big = plan_pool_launch(**{**decode, "batch": 32, "n": 128}, sm_count=132)  # 32 x 8 x 4 programs
    assert (big.num_tiles, big.num_splits, big.block_m) == (4, 1, 128)
    fp32 = plan_pool_launch(**{**decode, "dtype": torch.float32, "n": 64}, num_splits=5)
    assert (fp32.block_m, fp32.block_n, fp32.num_splits, fp32.chunk) == (64, 32, 5, 1664)
    assert plan_pool_launch(**{**decode, "capacity": 0}, sm_count=132).num_splits == 1


@needs_triton
def test_engine_like_shapes_split_four_ways():
    """Qwen3's GQA ratio 4 and several query tiles per kv head (G * n = 128 rows > BLOCK_M = 64)."""
    sizes, prefix = [16, 9, 1, 12], [128, 70, 0, 1]
    batch = make_pool_batch(sizes, prefix, [6, 2, 0, 5], num_slots=8, capacity=128, n=32, num_q_heads=8,
                            num_kv_heads=2, head_dim=32, shapes=["tree", "chain", "tree", "tree"])
    one, ref = run_both(batch, num_splits=1)
    four, _ = run_both(batch, num_splits=4)
    torch.testing.assert_close(one, ref, **TOL)
    torch.testing.assert_close(four, one, atol=1e-5, rtol=1e-5)
