"""Sampler: the chain's order and options, against direct NumPy computations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
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


# ============================================================================ distributions
# The draw distribution of each setting, computed directly from the chain's definition (the
# llama.cpp order: top-k, then top-p and min-p on the temperature-1 softmax of what top-k
# kept, then softmax(z / T) over the survivors), against the observed frequencies of a
# seeded sampler: tokens outside the kept set are never drawn, and a chi-square test (p-value
# 1e-6) on the kept ones.  A sampler that returns the argmax, ignores top-k / top-p / min-p
# or applies the temperature before the cuts fails.

PROBS = np.array([0.30, 0.22, 0.16, 0.12, 0.09, 0.06, 0.03, 0.02])
PERM = np.array([5, 2, 7, 0, 3, 6, 1, 4])  # token PERM[i] has probability PROBS[i]
Z = np.empty(8)
Z[PERM] = np.log(PROBS)


def expected_distribution(z, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """(vocab,) float64 probability of drawing each token."""
    z = np.asarray(z, np.float64)
    ranked = sorted(range(len(z)), key=lambda i: (-z[i], i))
    if top_k:
        ranked = ranked[:top_k]
    p1 = np.exp(z[ranked] - np.logaddexp.reduce(z[ranked]))  # temperature 1, over the kept
    keep = len(ranked)
    if top_p < 1.0:  # the shortest prefix whose mass reaches top_p
        keep = min(keep, next(j + 1 for j in range(len(p1)) if p1[: j + 1].sum() >= top_p))
    if min_p > 0.0:
        keep = min(keep, max(1, sum(1 for q in p1 if q >= min_p * p1[0])))
    kept = ranked[:keep]
    out = np.zeros(len(z))
    out[kept] = np.exp(z[kept] / temperature - np.logaddexp.reduce(z[kept] / temperature))
    return out


def chi2_critical(df, z=4.753):
    """Upper critical value of chi-square(df) at p = 1e-6 (Wilson-Hilferty; z = Phi^-1(1 - 1e-6))."""
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


CASES = [  # (temperature, top_k, top_p, min_p): kept tokens of PROBS in the comment
    (1.0, 0, 1.0, 0.0),  # all 8
    (0.5, 0, 1.0, 0.0),
    (2.0, 0, 1.0, 0.0),
    (1.5, 3, 1.0, 0.0),  # 3
    (3.0, 0, 0.6, 0.0),  # 3 (0.30 + 0.22 + 0.16 >= 0.6); at T=3 first it would keep 5
    (0.8, 0, 1.0, 0.35),  # 4 (p >= 0.105)
    (1.2, 6, 0.82, 0.2),  # 4: top-k 6 renormalises (p / 0.95), so top-p stops at 4, not 5
]


@pytest.mark.parametrize("temperature, top_k, top_p, min_p", CASES)
def test_sampling_distribution(temperature, top_k, top_p, min_p):
    want = expected_distribution(Z, temperature, top_k, top_p, min_p)
    s = Sampler(
        SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=11), 8
    )
    n = 4000
    counts = np.bincount([s.sample(Z) for _ in range(n)], minlength=8)
    kept = want > 0
    assert (counts[~kept] == 0).all(), (counts, want)
    stat = float(((counts[kept] - n * want[kept]) ** 2 / (n * want[kept])).sum())
    assert stat < chi2_critical(max(1, kept.sum() - 1)), (stat, counts / n, want)


def test_expected_distribution_cases():
    """The reference itself, on the cases above: which tokens survive each cut."""
    kept = [int((expected_distribution(Z, *c) > 0).sum()) for c in CASES]
    assert kept == [8, 8, 8, 3, 3, 4, 4]
    assert np.allclose(expected_distribution(Z, 1.0)[PERM], PROBS)
    assert expected_distribution(Z, 1.0, top_k=1)[PERM[0]] == 1.0


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
    for bad in (
        dict(temperature=-0.1),
        dict(top_p=1.5),
        dict(min_p=-1),
        dict(top_k=-2),
        dict(presence_penalty=3),
        dict(logit_bias={"x": 1}),
    ):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


# ============================================================================ large vocabularies
# candidates() sorts only what a cut needs (a partition for top-k, a growing best-first head
# for top-p); the kept set and the weights must be those of the chain's definition above, on
# vocabularies large enough for the partial paths (the head starts at 64 tokens and grows x8),
# with many ties (logits on a 0.25 grid) and masks.


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(70, 6000),
    seed=st.integers(0, 10_000),
    scale=st.sampled_from([0.5, 2.0, 6.0]),
    temperature=st.sampled_from([0.5, 1.0, 1.7]),
    top_k=st.sampled_from([0, 1, 40, 500]),
    top_p=st.sampled_from([1.0, 0.37, 0.83, 0.93, 0.995]),
    min_p=st.sampled_from([0.0, 0.013, 0.21]),
    masked=st.booleans(),
)
# each path of the top-p head: the 64 best, the 512 best, the sorted values (a flat logit grid)
@example(n=6000, seed=1, scale=6.0, temperature=1.0, top_k=0, top_p=0.83, min_p=0.0, masked=False)
@example(n=6000, seed=1, scale=2.0, temperature=1.0, top_k=0, top_p=0.83, min_p=0.0, masked=False)
@example(n=6000, seed=1, scale=0.5, temperature=1.0, top_k=0, top_p=0.83, min_p=0.0, masked=False)
@example(n=6000, seed=2, scale=0.5, temperature=0.5, top_k=0, top_p=0.93, min_p=0.013, masked=True)
def test_candidates_match_the_definition_on_large_vocabularies(
    n, seed, scale, temperature, top_k, top_p, min_p, masked
):
    rng = np.random.default_rng(seed)
    z = np.round(rng.standard_normal(n) * scale * 4) / 4  # ties on a 0.25 grid
    mask = None
    allowed = np.arange(n)
    if masked:
        mask = rng.random(n) < 0.3
        mask[rng.integers(n)] = True
        allowed = np.flatnonzero(mask)
    want = np.zeros(n)
    want[allowed] = expected_distribution(z[allowed], temperature, top_k, top_p, min_p)
    s = Sampler(SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p), n)
    ids, w = s.candidates(z.astype(np.float32), mask)
    got = np.zeros(n)
    got[ids] = w
    assert np.array_equal(np.flatnonzero(got), np.flatnonzero(want)), (
        len(ids),
        int((want > 0).sum()),
    )
    assert np.allclose(got, want, rtol=1e-9, atol=1e-15)
