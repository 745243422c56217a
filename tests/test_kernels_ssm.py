"""Linear-attention kernels (goinfer/_kernels/ssm.pyx) against their NumPy twins
(goinfer/_reference.py) over many shapes, 1 and 2 threads and every ISA variant.

gated_delta is bit-exact with the reference (same float32 operation sequence, same libm calls);
ssm_conv's sums and state are exact, its SiLU within float32 rounding; sigmoid_mul likewise.
The recurrence's defining property: T tokens in one call == the same tokens in any split of
calls (prefill == decode), and a snapshot taken after row r == the state after the first r+1
tokens."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from goinfer import _reference as R
from goinfer._kernels import _config, ssm

VARIANTS = _config.supported_variants()
# per variant: the variant fixture holds for all of a test's examples
SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(autouse=True, scope="module")
def _force_threads():
    old = ssm._set_grain(0)
    yield
    ssm._set_grain(old)


@pytest.fixture(params=VARIANTS)
def variant(request):
    old = _config.variant()
    _config.set_variant(request.param)
    assert ssm._variant_used() == request.param  # the switch reached the kernel tables
    yield request.param
    _config.set_variant(old)


def test_dispatch_follows_config(variant):
    assert ssm._variant_used() == variant == _config.variant()


def delta_inputs(rng, T, Hk, Hv, dk, dv, pad=3):
    C = 2 * Hk * dk + Hv * dv
    qkv = rng.standard_normal((T, C + pad)).astype(np.float32)[:, :C]  # strided rows
    ab = (2 * rng.standard_normal((T, 2 * Hv))).astype(np.float32)
    A = -rng.uniform(0.05, 8.0, Hv).astype(np.float32)
    dt = rng.standard_normal(Hv).astype(np.float32)
    state = rng.standard_normal((Hv, dk, dv)).astype(np.float32)
    return qkv, ab, A, dt, state


# dv: below, at and past the vector kernels' column passes (AVX2: 4 x 8 columns a pass)
shapes = st.tuples(
    st.integers(1, 40),
    st.sampled_from([(1, 1), (1, 2), (2, 2), (2, 4), (3, 6)]),
    st.sampled_from([4, 16, 33]),
    st.sampled_from([1, 8, 16, 21, 32, 40, 64, 130]),
)


@SETTINGS
@given(shape=shapes, seed=st.integers(0, 2**31), threads=st.sampled_from([1, 2]))
def test_gated_delta_bit_exact_with_reference(variant, shape, seed, threads):
    T, (Hk, Hv), dk, dv = shape
    qkv, ab, A, dt, s0 = delta_inputs(np.random.default_rng(seed), T, Hk, Hv, dk, dv)
    s1, s2 = s0.copy(), s0.copy()
    got = ssm.gated_delta(qkv, ab, A, dt, s1, Hk, nthreads=threads)
    want = R.gated_delta(qkv, ab, A, dt, s2, Hk)
    assert np.array_equal(got, want) and np.array_equal(s1, s2)


@pytest.mark.parametrize("dv", [24, 32, 64, 130])
def test_gated_delta_same_bits_in_every_variant(dv):
    qkv, ab, A, dt, s0 = delta_inputs(np.random.default_rng(1), 9, 2, 4, 32, dv)
    res = []
    old = _config.variant()
    try:
        for v in VARIANTS:
            _config.set_variant(v)
            assert ssm._variant_used() == v
            s = s0.copy()
            res.append((ssm.gated_delta(qkv, ab, A, dt, s, 2, nthreads=2), s))
    finally:
        _config.set_variant(old)
    for o, s in res[1:]:
        assert np.array_equal(o, res[0][0]) and np.array_equal(s, res[0][1])


@SETTINGS
@given(T=st.integers(2, 30), seed=st.integers(0, 2**31), data=st.data())
def test_gated_delta_split_calls_and_snapshots(variant, T, seed, data):
    """One call over T tokens == any split into calls (the prefill/decode identity), and a
    snapshot after row r == the state after the first r + 1 tokens."""
    qkv, ab, A, dt, s0 = delta_inputs(np.random.default_rng(seed), T, 2, 4, 16, 16)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, T - 1), max_size=5))))
    rows = sorted(set(data.draw(st.lists(st.integers(0, T - 1), min_size=1, max_size=4))))
    snaps = np.full((len(rows),) + s0.shape, np.nan, np.float32)
    s_one = s0.copy()
    one = ssm.gated_delta(qkv, ab, A, dt, s_one, 2, snap_rows=rows, snaps=snaps, nthreads=2)
    s_split, parts, prev = s0.copy(), [], 0
    for c in cuts + [T]:
        parts.append(ssm.gated_delta(qkv[prev:c], ab[prev:c], A, dt, s_split, 2))
        prev = c
    assert np.array_equal(np.concatenate(parts), one) and np.array_equal(s_split, s_one)
    for r, snap in zip(rows, snaps):
        s = s0.copy()
        ssm.gated_delta(qkv[: r + 1], ab[: r + 1], A, dt, s, 2)
        assert np.array_equal(snap, s)


@SETTINGS
@given(
    T=st.integers(1, 30),
    C=st.sampled_from([1, 5, 16, 40, 130]),
    K=st.sampled_from([1, 2, 4]),
    seed=st.integers(0, 2**31),
    threads=st.sampled_from([1, 2]),
)
def test_ssm_conv_against_reference(variant, T, C, K, seed, threads):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, C + 2)).astype(np.float32)[:, :C]
    wT = rng.standard_normal((K, C)).astype(np.float32)
    s0 = rng.standard_normal((K - 1, C)).astype(np.float32)
    rows = sorted(set(rng.integers(0, T, 3).tolist()))
    sn1 = np.zeros((len(rows), K - 1, C), np.float32)
    sn2 = sn1.copy()
    s1, s2 = s0.copy(), s0.copy()
    got = ssm.ssm_conv(x, wT, s1, snap_rows=rows, snaps=sn1, nthreads=threads)
    want = R.ssm_conv(x, wT, s2, snap_rows=rows, snaps=sn2)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    assert np.array_equal(s1, s2) and np.array_equal(sn1, sn2)


def test_ssm_conv_split_calls_bit_identical(variant):
    rng = np.random.default_rng(3)
    T, C, K = 23, 70, 4
    x = rng.standard_normal((T, C)).astype(np.float32)
    wT = rng.standard_normal((K, C)).astype(np.float32)
    s0 = rng.standard_normal((K - 1, C)).astype(np.float32)
    s_one = s0.copy()
    one = ssm.ssm_conv(x, wT, s_one, nthreads=2)
    s_split, parts = s0.copy(), []
    for a, b in ((0, 1), (1, 2), (2, 9), (9, 23)):
        parts.append(ssm.ssm_conv(x[a:b], wT, s_split))
    assert np.array_equal(np.concatenate(parts), one) and np.array_equal(s_split, s_one)


def test_sigmoid_mul_against_reference(variant):
    rng = np.random.default_rng(4)
    g = (4 * rng.standard_normal((37, 70))).astype(np.float32)
    x = rng.standard_normal((37, 70)).astype(np.float32)
    for nt in (1, 2):
        got = ssm.sigmoid_mul(g, x, nthreads=nt)
        np.testing.assert_allclose(got, R.sigmoid_mul(g, x), rtol=2e-6, atol=1e-7)
    y = x.copy()
    ssm.sigmoid_mul(g, y, out=y)  # in place
    assert np.array_equal(y, ssm.sigmoid_mul(g, x))


def test_bad_arguments_are_refused():
    qkv, ab, A, dt, s = delta_inputs(np.random.default_rng(5), 4, 2, 4, 8, 8)
    with pytest.raises(ValueError, match="multiple"):
        ssm.gated_delta(qkv, ab, A, dt, s, 3)
    with pytest.raises(ValueError, match="columns"):
        ssm.gated_delta(qkv[:, :10], ab, A, dt, s, 2)
    with pytest.raises(TypeError, match="float32"):
        ssm.gated_delta(qkv.astype(np.float64), ab, A, dt, s, 2)
    with pytest.raises(ValueError, match="snap_rows"):
        ssm.gated_delta(
            qkv, ab, A, dt, s, 2, snap_rows=[2, 1], snaps=np.zeros((2,) + s.shape, np.float32)
        )
    with pytest.raises(ValueError, match="state"):
        ssm.ssm_conv(
            np.zeros((3, 8), np.float32), np.zeros((4, 8), np.float32), np.zeros((2, 8), np.float32)
        )
