"""Sampling parameters and the fixed logit processors (temperature, top-k, top-p)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cast_trtllm.sampling import SamplingParams, processed_logits, sample_from, sample_tokens, target_probs


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"seed": "7"}, "seed"),
    ],
)
def test_invalid_sampling_params_raise_value_error_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_sampling_params_are_frozen_and_seed_makes_generator_reproducible():
    params = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=3)
    with pytest.raises(AttributeError):
        params.temperature = 1.0  # type: ignore[misc]
    a = torch.rand(4, generator=params.generator())
    b = torch.rand(4, generator=params.generator())
    assert torch.equal(a, b)


def test_temperature_scales_logits_before_softmax_in_float64():
    logits = torch.tensor([[1.0, 2.0, 0.5, -1.0]], dtype=torch.float32)
    probs = target_probs(logits, SamplingParams(temperature=0.5))
    assert probs.dtype == torch.float64
    torch.testing.assert_close(probs, torch.softmax(logits.double() / 0.5, dim=1))


def test_temperature_zero_is_a_point_mass_on_the_argmax():
    logits = torch.tensor([[0.1, 3.0, 3.0, -2.0]])
    probs = target_probs(logits, SamplingParams(temperature=0.0))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]
    assert sample_tokens(logits, SamplingParams(temperature=0.0), torch.Generator()).tolist() == [1]


def test_top_k_keeps_the_k_largest_and_ties_at_the_boundary():
    logits = torch.tensor([[4.0, 1.0, 3.0, 3.0, 0.0]])
    kept = torch.isfinite(processed_logits(logits, SamplingParams(top_k=2)))
    assert kept.tolist() == [[True, False, True, True, False]]


def test_top_p_keeps_the_smallest_head_reaching_the_mass():
    probs = torch.tensor([[0.05, 0.5, 0.3, 0.15]], dtype=torch.float64)
    logits = torch.log(probs)
    kept = target_probs(logits, SamplingParams(top_p=0.79)) > 0
    assert kept.tolist() == [[False, True, True, False]]  # 0.5 + 0.3 reaches 0.79
    kept = target_probs(logits, SamplingParams(top_p=0.81)) > 0
    assert kept.tolist() == [[False, True, True, True]]
    kept = target_probs(logits, SamplingParams(top_p=0.01)) > 0
    assert kept.tolist() == [[False, True, False, False]]  # the top token always stays


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    vocab=st.integers(2, 12),
    temperature=st.floats(0.2, 3.0),
    top_k=st.integers(0, 12),
    top_p=st.floats(0.05, 1.0),
)
def test_processed_law_is_a_law_within_top_k_and_a_minimal_top_p_head(seed, vocab, temperature, top_k, top_p):
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3
    probs = target_probs(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    torch.testing.assert_close(probs.sum(1), torch.ones(3, dtype=torch.float64))
    support = (probs > 0).sum(1)
    if top_k:
        assert torch.all(support <= top_k)
    # the kept set is a head of the temperature/top-k law whose mass reaches top_p, minimally
    base = target_probs(logits, SamplingParams(temperature=temperature, top_k=top_k))
    for row in range(3):
        kept = base[row][probs[row] > 0].numpy()
        assert kept.min() >= base[row][probs[row] == 0].numpy().max(initial=0.0)
        assert kept.sum() >= top_p - 1e-12 or top_p == 1.0
        assert kept.sum() - kept.min() < top_p + 1e-12 or len(kept) == 1


def test_inverse_cdf_never_draws_a_zero_mass_token():
    probs = torch.tensor([[0.3, 0.7, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    u = torch.tensor([1.0 - 2**-53, 1.0 - 2**-53], dtype=torch.float64)
    assert sample_from(probs, u).tolist() == [1, 2]
    assert sample_from(probs, torch.zeros(2, dtype=torch.float64)).tolist() == [0, 2]


def test_autoregressive_sampler_draws_the_processed_law():
    logits = torch.randn(1, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    params = SamplingParams(temperature=0.8, top_k=4, top_p=0.9)
    n = 100_000
    tokens = sample_tokens(logits.expand(n, -1), params, torch.Generator().manual_seed(1))
    empirical = np.bincount(tokens.numpy(), minlength=6) / n
    law = target_probs(logits, params)[0].numpy()
    assert np.all(empirical[law == 0] == 0)
    assert 0.5 * np.abs(empirical - law).sum() < 0.006  # about 2.5x the Monte-Carlo floor at n = 1e5
