"""The pool-layout reference is the packed-layout reference over each slot's committed columns."""
import pytest
import torch
import torch.nn.functional as F

from plugins.tree_attention import pool_tree_attention_reference, tree_attention_reference
from plugins.tree_attention.pool_reference import check_pool_values
from tests.plugins.pool_batches import make_pool_batch

SIZES, PREFIX, SLOTS = [6, 4, 1], [0, 37, 64], [4, 1, 5]


def packed_layout(batch: dict, sizes: list[int]) -> dict:
    """The same requests in the packed layout: real pack rows only, prefixes gathered from the pool."""
    slots, lens = batch["slot_ids"].tolist(), batch["prefix_lens"].tolist()
    cat = lambda parts: torch.cat(parts)  # noqa: E731
    return dict(
        q=cat([batch["q"][b, :size] for b, size in enumerate(sizes)]),
        k_prefix=cat([batch["k_pool"][s, :, :p].transpose(0, 1) for s, p in zip(slots, lens)]),
        v_prefix=cat([batch["v_pool"][s, :, :p].transpose(0, 1) for s, p in zip(slots, lens)]),
        k_pack=cat([batch["k_new"][b, :size] for b, size in enumerate(sizes)]),
        v_pack=cat([batch["v_new"][b, :size] for b, size in enumerate(sizes)]),
        bitmask=cat([batch["bitmask"][b, :size] for b, size in enumerate(sizes)]),
        cu_seqlens=torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()], dtype=torch.int32),
        cu_prefix=torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32),
    )


@pytest.mark.parametrize("ratio", [1, 4])
def test_pool_reference_equals_packed_reference_on_real_rows(ratio):
    batch = make_pool_batch(SIZES, PREFIX, SLOTS, num_slots=6, capacity=64, n=8, num_q_heads=2 * ratio,
                            num_kv_heads=2, shapes=["tree", "chain", "tree"])
    out = pool_tree_attention_reference(**batch)
    packed = tree_attention_reference(**packed_layout(batch, SIZES))
    rows = torch.cat([out[b, :size] for b, size in enumerate(SIZES)])
    torch.testing.assert_close(rows, packed, atol=1e-5, rtol=1e-5)
    assert not out.isnan().any()


def test_padded_row_attends_the_prefix_only_or_outputs_zeros():
    batch = make_pool_batch([2, 2], [0, 9], [0, 2], num_slots=3, capacity=16, n=4, num_q_heads=2, num_kv_heads=1)
    out = pool_tree_attention_reference(**batch)
    assert torch.all(out[0, 2:] == 0)  # no prefix, zero mask row: sees nothing
    k, v = (batch[name][2, :, :9] for name in ("k_pool", "v_pool"))  # [1, 9, d]
    expected = F.scaled_dot_product_attention(batch["q"][1, 2:].transpose(0, 1), k, v).transpose(0, 1)
    torch.testing.assert_close(out[1, 2:], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name,bad,match", [
    ("bitmask", lambda t: t.long(), "bitmask must be int32"),
    ("bitmask", lambda t: t[:, :3], "bitmask must be"),
    ("k_pool", lambda t: t[:, :, :, :8], "k_pool must be"),
    ("v_pool", lambda t: t[:, :, :8], "v_pool has shape"),
    ("slot_ids", lambda t: t.float(), "slot_ids must be int32 or int64"),
    ("prefix_lens", lambda t: t[:1], "prefix_lens must be"),
    ("v_new", lambda t: t.half(), "v_new has dtype"),
    ("q", lambda t: t[:, :, :3], "multiple"),
])
def test_bad_input_raises_value_error_naming_the_tensor(name, bad, match):
    batch = make_pool_batch([2, 3], [4, 0], [1, 0], num_slots=2, capacity=16, n=4, num_q_heads=4, num_kv_heads=2)
    batch[name] = bad(batch[name])
    with pytest.raises(ValueError, match=match):
        pool_tree_attention_reference(**batch)


def test_host_value_check_rejects_a_slot_outside_the_pool_and_a_prefix_over_capacity():
    with pytest.raises(ValueError, match="slot_ids"):
        check_pool_values(torch.tensor([0, 3]), torch.tensor([1, 2]), num_slots=3, capacity=8)
    with pytest.raises(ValueError, match="prefix_lens"):
        check_pool_values(torch.tensor([0, 2]), torch.tensor([1, 9]), num_slots=3, capacity=8)
