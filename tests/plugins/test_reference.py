"""The torch reference is the spec: check it against dense SDPA with an additive ancestor mask."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from plugins.tree_attention import tree_attention_reference
from tests.plugins.trees import ancestor_bitmask, bushy_parents, chain_parents, make_batch


def dense_sdpa(batch: dict, packs: list[list[int]], scale: float | None = None) -> torch.Tensor:
    """Per request: SDPA over [prefix, pack] with a float additive mask built from the parents."""
    q, cu, cp = batch["q"].float(), batch["cu_seqlens"].tolist(), batch["cu_prefix"].tolist()
    group = q.shape[1] // batch["k_pack"].shape[1]
    out = torch.zeros_like(q)
    for r, parents in enumerate(packs):
        t0, t1, p0, p1 = cu[r], cu[r + 1], cp[r], cp[r + 1]
        if t1 == t0:
            continue
        anc = np.unpackbits(ancestor_bitmask(parents, 1 + len(parents) // 32).view(np.uint8), axis=1,
                            bitorder="little")[:, : len(parents)].astype(bool)
        visible = torch.cat([torch.ones(t1 - t0, p1 - p0, dtype=torch.bool), torch.from_numpy(anc)], dim=1)
        mask = torch.zeros(visible.shape).masked_fill(~visible, float("-inf"))
        k = torch.cat([batch["k_prefix"][p0:p1], batch["k_pack"][t0:t1]]).float().repeat_interleave(group, 1)
        v = torch.cat([batch["v_prefix"][p0:p1], batch["v_pack"][t0:t1]]).float().repeat_interleave(group, 1)
        o = F.scaled_dot_product_attention(q[t0:t1].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                           attn_mask=mask, scale=scale)
        out[t0:t1] = o.transpose(0, 1)
    return out


def test_reference_matches_dense_sdpa_on_ragged_gqa_batch():
    packs = [bushy_parents(9, 1), chain_parents(4), bushy_parents(20, 2)]
    batch = make_batch(packs, [5, 0, 12], num_q_heads=6, num_kv_heads=2)
    torch.testing.assert_close(tree_attention_reference(**batch), dense_sdpa(batch, packs), atol=1e-5, rtol=1e-5)


def test_custom_scale_is_applied():
    packs = [bushy_parents(7)]
    batch = make_batch(packs, [3], num_q_heads=2, num_kv_heads=1)
    torch.testing.assert_close(tree_attention_reference(**batch, scale=0.3), dense_sdpa(batch, packs, scale=0.3),
                               atol=1e-5, rtol=1e-5)


def test_pack_of_300_tokens_uses_ten_mask_words():
    packs = [bushy_parents(300, 3)]
    batch = make_batch(packs, [8], num_q_heads=2, num_kv_heads=2, head_dim=8)
    assert batch["bitmask"].shape == (300, 10)
    torch.testing.assert_close(tree_attention_reference(**batch), dense_sdpa(batch, packs), atol=1e-5, rtol=1e-5)


def test_chain_pack_equals_causal_attention_over_prefix_and_pack():
    batch = make_batch([chain_parents(6)], [4], num_q_heads=1, num_kv_heads=1)
    k = torch.cat([batch["k_prefix"], batch["k_pack"]]).transpose(0, 1)
    v = torch.cat([batch["v_prefix"], batch["v_pack"]]).transpose(0, 1)
    causal = torch.ones(6, 10, dtype=torch.bool).tril(diagonal=4)
    expected = F.scaled_dot_product_attention(batch["q"].transpose(0, 1), k, v, attn_mask=causal).transpose(0, 1)
    torch.testing.assert_close(tree_attention_reference(**batch), expected, atol=1e-5, rtol=1e-5)


def test_padding_mask_words_are_ignored():
    packs = [bushy_parents(10)]
    batch = make_batch(packs, [3], num_q_heads=2, num_kv_heads=1, extra_words=2)
    expected = tree_attention_reference(**batch)
    batch["bitmask"][:, 1:] = -1  # garbage beyond ceil(n/32) words
    torch.testing.assert_close(tree_attention_reference(**batch), expected)


def test_requests_never_see_each_other():
    batch = make_batch([bushy_parents(5), bushy_parents(6, 1)], [3, 4], num_q_heads=2, num_kv_heads=1)
    before = tree_attention_reference(**batch)
    for name in ("k_pack", "v_pack"):
        batch[name][5:] += 10.0
    for name in ("k_prefix", "v_prefix"):
        batch[name][3:] += 10.0
    torch.testing.assert_close(tree_attention_reference(**batch)[:5], before[:5])


def test_query_that_sees_nothing_outputs_zeros():
    batch = make_batch([bushy_parents(4)], [0], num_q_heads=1, num_kv_heads=1)
    batch["bitmask"][2] = 0
    out = tree_attention_reference(**batch)
    assert torch.all(out[2] == 0) and torch.all(torch.isfinite(out))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_output_keeps_query_dtype_and_tracks_fp32(dtype):
    batch = make_batch([bushy_parents(12)], [6], num_q_heads=4, num_kv_heads=2, dtype=dtype)
    out = tree_attention_reference(**batch)
    assert out.dtype == dtype
    fp32 = tree_attention_reference(**{k: v.float() if v.is_floating_point() else v for k, v in batch.items()})
    torch.testing.assert_close(out.float(), fp32, atol=2e-2, rtol=2e-2)


def _break(batch: dict, what: str) -> dict:
    if what == "bitmask_int64":
        batch["bitmask"] = batch["bitmask"].long()
    elif what == "too_few_words":
        batch["bitmask"] = batch["bitmask"][:, :1]
    elif what == "cu_seqlens_wrong_total":
        batch["cu_seqlens"][-1] += 1
    elif what == "heads_not_multiple":
        batch["q"] = torch.cat([batch["q"], batch["q"][:, :1]], dim=1)
    elif what == "dtype_mismatch":
        batch["k_pack"] = batch["k_pack"].half()
    elif what == "cu_prefix_length":
        batch["cu_prefix"] = batch["cu_prefix"][:-1]
    return batch


@pytest.mark.parametrize("what", ["bitmask_int64", "too_few_words", "cu_seqlens_wrong_total",
                                  "heads_not_multiple", "dtype_mismatch", "cu_prefix_length"])
def test_contract_violations_raise_value_error(what):
    batch = _break(make_batch([bushy_parents(40)], [2], num_q_heads=2, num_kv_heads=2), what)
    with pytest.raises(ValueError):
        tree_attention_reference(**batch)


def test_non_positive_scale_raises_value_error():
    with pytest.raises(ValueError, match="scale"):
        tree_attention_reference(**make_batch([chain_parents(2)], [1], 1, 1), scale=-1.0)

