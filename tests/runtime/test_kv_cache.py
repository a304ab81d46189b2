import numpy as np
import pytest
import torch

from runtime.kv_cache import CacheFullError, KVCache


def _cache(capacity=16):
    return KVCache(num_layers=2, num_kv_heads=1, head_dim=2, capacity=capacity, dtype=torch.float32, device="cpu")


def _rows(start, n):  # [1, n, 2] rows tagged by their value
    return torch.arange(start, start + n, dtype=torch.float32)[None, :, None].expand(1, n, 2).clone()


def test_write_returns_prefix_plus_pending_rows_without_committing():
    c = _cache()
    k, v = c.write(0, _rows(0, 3), _rows(0, 3))
    assert k.shape == (1, 3, 2) and c.length == 0
    c.advance(3)
    k, _ = c.write(0, _rows(10, 2), _rows(10, 2))
    assert k[0, :, 0].tolist() == [0, 1, 2, 10, 11] and c.length == 3


def test_compact_gathers_root_and_accepted_path_in_place():
    c = _cache()
    for layer in range(2):
        c.write(layer, _rows(0, 4), _rows(0, 4))
    c.advance(4)
    storage = c.k.data_ptr()
    for layer in range(2):
        c.write(layer, _rows(100, 6), _rows(100, 6))  # pack rows 0..5
    c.compact(np.array([0, 2, 5]))
    assert c.length == 7 and c.k.data_ptr() == storage
    for layer in range(2):
        assert c.k[layer, 0, :7, 0].tolist() == [0, 1, 2, 3, 100, 102, 105]
        assert c.v[layer, 0, :7, 1].tolist() == [0, 1, 2, 3, 100, 102, 105]


def test_compact_of_contiguous_head_keeps_rows():
    c = _cache()
    c.write(0, _rows(0, 5), _rows(0, 5))
    c.compact(np.array([0, 1, 2]))
    assert c.length == 3 and c.k[0, 0, :3, 0].tolist() == [0, 1, 2]


@pytest.mark.parametrize("keep", [[0, 0], [2, 1], [-1, 0]])
def test_compact_rejects_unordered_indices(keep):
    with pytest.raises(ValueError, match="increasing"):
        _cache().compact(np.array(keep))


def test_overflow_names_the_context_window():
    c = _cache(capacity=4)
    c.advance(3)
    with pytest.raises(CacheFullError, match="context window"):
        c.write(0, _rows(0, 2), _rows(0, 2))
