"""Triton kernel == torch reference (CPU: through TRITON_INTERPRET=1, set in conftest)."""
import pytest
import torch

from plugins.tree_attention import tree_attention_reference, tree_attention_triton, triton_available
from tests.plugins.trees import bushy_parents, chain_parents, make_batch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _runnable() -> str | None:
    if not triton_available():
        return "triton is not installed"
    import triton

    from plugins.tree_attention.triton_kernel import tree_attention_fwd_kernel

    if DEVICE == "cpu" and isinstance(tree_attention_fwd_kernel, triton.runtime.jit.JITFunction):
        return "triton was imported before TRITON_INTERPRET=1 was set (see tests/plugins/conftest.py)"
    return None


pytestmark = pytest.mark.skipif(_runnable() is not None, reason=str(_runnable()))
SHAPES = {"chain": chain_parents, "bushy": lambda n: bushy_parents(n, seed=n)}


def run_both(batch: dict, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    on_device = {k: v.to(DEVICE) for k, v in batch.items()}
    return tree_attention_triton(**on_device, **kwargs).cpu(), tree_attention_reference(**batch, **kwargs)


@pytest.mark.parametrize("shape", ["chain", "bushy"])
@pytest.mark.parametrize("n,ratio", [(1, 1), (16, 3), (65, 4), (130, 8)])
def test_single_pack_matches_reference(n, ratio, shape):
    batch = make_batch([SHAPES[shape](n)], [min(40, 3 * n)], num_q_heads=ratio, num_kv_heads=1, seed=n)
    out, ref = run_both(batch)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("ratio", [1, 3, 4, 8])
def test_ragged_batch_of_three_requests_matches_reference(ratio):
    packs = [bushy_parents(23, 1), chain_parents(9), bushy_parents(40, 2)]
    batch = make_batch(packs, [17, 0, 33], num_q_heads=2 * ratio, num_kv_heads=2, seed=ratio)
    out, ref = run_both(batch)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


def test_empty_request_padding_words_odd_head_dim_and_custom_scale():
    packs = [bushy_parents(18), [], chain_parents(3)]
    batch = make_batch(packs, [5, 7, 0], num_q_heads=3, num_kv_heads=1, head_dim=24, extra_words=1)
    batch["bitmask"][:, 1] = -1  # padding word: must be ignored
    out, ref = run_both(batch, scale=0.2)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


def test_query_that_sees_nothing_outputs_zeros():
    batch = make_batch([bushy_parents(5)], [0], num_q_heads=1, num_kv_heads=1)
    batch["bitmask"][3] = 0
    out, ref = run_both(batch)
    assert torch.all(out[3] == 0)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_matches_reference(dtype):
    if dtype == torch.bfloat16 and DEVICE == "cpu":
        pytest.skip("triton 3.9's interpreter runs tl.dot on the raw bf16 bits; bf16 is checked on CUDA")
    batch = make_batch([bushy_parents(20), chain_parents(7)], [9, 4], num_q_heads=4, num_kv_heads=1, dtype=dtype)
    out, ref = run_both(batch)
    assert out.dtype == dtype
    tol = 1e-2 if dtype == torch.float16 else 4e-2  # bf16 keeps 8 mantissa bits
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


def test_contract_violation_raises_value_error_before_launch():
    batch = make_batch([chain_parents(3)], [2], num_q_heads=2, num_kv_heads=1)
    batch["bitmask"] = batch["bitmask"].long()
    with pytest.raises(ValueError, match="bitmask"):
        tree_attention_triton(**{k: v.to(DEVICE) for k, v in batch.items()})
