"""Sampler: the chain's order and options, against direct NumPy computations."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goinfer.sampling import Sampler, SamplingParams


def test_greedy_ties_go_to_lower_id():
    z = np.array([0.0, 3.0, 3.0, 1.0], np.float32)
    assert Sampler(SamplingParams(), 4).sample(z) == 1


def test_top_k_1_is_greedy():
    z = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    s = Sampler(SamplingParams(temperature=1.5, top_k=1, seed=3), 100)
    assert all(s.sample(z) == int(z.argmax()) for _ in range(20))


@settings(max_examples=30, deadline=None)
@given(p=st.floats(0.05, 1.0), seed=st.integers(0, 10_000))
def test_top_p_keeps_only_the_nucleus(p, seed):
    z = np.random.default_rng(seed).standard_normal(50) * 2
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    c = np.cumsum(probs[order])
    nucleus = set(order[: int(np.searchsorted(c, p)) + 1].tolist())
    s = Sampler(SamplingParams(temperature=1.0, top_p=p, seed=seed), 50)
    assert all(s.sample(z) in nucleus for _ in range(30))


def test_min_p_filters_relative_to_best():
    z = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    s = Sampler(SamplingParams(temperature=1.0, min_p=0.5, seed=1), 4)
    assert {s.sample(z) for _ in range(200)} == {0, 1}


def test_sampling_frequencies_follow_temperature():
    z = np.log(np.array([0.6, 0.3, 0.1]))
    s = Sampler(SamplingParams(temperature=1.0, seed=7), 3)
    n = 20000
    freq = np.bincount([s.sample(z) for _ in range(n)], minlength=3) / n
    assert np.allclose(freq, [0.6, 0.3, 0.1], atol=0.02)


def test_penalties():
    z = np.array([2.0, 1.0, -1.0, 0.5])
    s = Sampler(SamplingParams(repeat_penalty=2.0), 4, history=[0, 2])
    adj = s.adjust(z)
    assert np.allclose(adj, [1.0, 1.0, -2.0, 0.5])
    s = Sampler(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), 4)
    s.accept(1)
    s.accept(1)
    assert np.allclose(s.adjust(z), [2.0, 1.0 - 0.5 - 0.5, -1.0, 0.5])


def test_logit_bias_and_validation():
    z = np.zeros(5)
    assert Sampler(SamplingParams(logit_bias={3: 5.0}), 5).sample(z) == 3
    with pytest.raises(ValueError):
        Sampler(SamplingParams(logit_bias={9: 1.0}), 5)
    for bad in (dict(temperature=-0.1), dict(top_p=1.5), dict(min_p=-1), dict(top_k=-2),
                dict(presence_penalty=3), dict(logit_bias={"x": 1})):
        with pytest.raises(ValueError):
            SamplingParams(**bad)
