"""Compiled elementwise / normalization kernels vs goinfer._reference, on every ISA variant.

Tolerances:
  rmsnorm, rope, add: bit-exact (np.array_equal): the kernels follow the reference's float
    operation sequence (kernels.md).
  swiglu, gelu_tanh_mul: float32 arithmetic with the kernel's own exp (<= 1.5 ulp).  Against a
    float64 evaluation: |out - ref| <= 4 ulp(ref) + 2^-24 |gate * up|.  The first term covers
    exp + the 3-4 float32 roundings of the formula (measured max 2.7 ulp); the second covers
    the float32 rounding of the exp argument (for GeGLU z = g (K1 + K2 g^2) is rounded 3 times;
    its error moves the output by |g u| s(z)(1 - s(z)) |dz| <= ~3 * 2^-24 * 0.22 |g u|;
    measured max 0.12 * 2^-24 |g u|).
  Element independence (bit-exact): an element's value does not depend on M, its column, the
    row stride, the thread count or the variant.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from goinfer import _reference as R
from goinfer._kernels import _config, ops

VARIANTS = _config.supported_variants()


@pytest.fixture(autouse=True, scope="module")
def _force_threads():
    """Tiny test shapes still run with the requested thread count."""
    old = ops._set_grain(0)
    yield
    ops._set_grain(old)


@pytest.fixture(params=VARIANTS)
def variant(request):
    old = _config.variant()
    _config.set_variant(request.param)
    yield request.param
    _config.set_variant(old)


def test_dispatch_follows_config(variant):
    assert ops._variant_used() == variant == _config.variant()


def _each_variant(fn):
    """fn() under every supported variant -> list of results (restores the variant)."""
    old = _config.variant()
    try:
        res = []
        for v in VARIANTS:
            _config.set_variant(v)
            res.append(fn())
        return res
    finally:
        _config.set_variant(old)


def _rand(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ============================================================================ RMSNorm


# M: row groups of 12 (avx2: 3 x 4 rows) and 24 (avx-512: 3 x 8) and what is left of them;
# D: columns by 4 / 8 (a transpose) and the last D % 4 / 8 (gathers)
@pytest.mark.parametrize("M", [1, 3, 4, 7, 8, 9, 12, 17, 24, 25, 48, 130])
@pytest.mark.parametrize("D", [1, 5, 19, 64, 576, 1000, 1003])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_rmsnorm_bit_exact(variant, M, D, nthreads):
    rng = np.random.default_rng(M * 1000 + D)
    x = _rand(rng, (M, D), 3.0)
    w = _rand(rng, (D,))
    for eps in (1e-5, 1e-6):
        got = ops.rmsnorm(x, w, eps, nthreads=nthreads)
        assert np.array_equal(got, R.rmsnorm(x, w, eps))


def test_rmsnorm_layouts(variant):
    rng = np.random.default_rng(1)
    buf = _rand(rng, (67, 300))
    x = buf[:, 10:138]  # strided rows, contiguous last axis
    w = _rand(rng, (128,))
    ref = R.rmsnorm(x, w, 1e-6)
    assert np.array_equal(ops.rmsnorm(x, w, 1e-6, nthreads=2), ref)
    out = np.empty((67, 400), np.float32)[:, :128]  # strided out
    ops.rmsnorm(x, w, 1e-6, out=out)
    assert np.array_equal(out, ref)
    q = _rand(rng, (5, 9, 64))  # per-head norm (..., hd)
    wq = _rand(rng, (64,))
    assert np.array_equal(ops.rmsnorm(q, wq, 1e-6), R.rmsnorm(q, wq, 1e-6))
    y = x.copy()
    ops.rmsnorm(y, w, 1e-6, out=y)  # in place
    assert np.array_equal(y, ref)


@settings(max_examples=40, deadline=None)
@given(
    hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=2, max_dims=2, max_side=40),
        elements=st.floats(-1e4, 1e4, width=32),
    )
)
def test_rmsnorm_hypothesis(x):
    w = np.linspace(-2, 2, x.shape[1]).astype(np.float32)
    got = _each_variant(lambda: ops.rmsnorm(x, w, 1e-5))
    ref = R.rmsnorm(x, w, 1e-5)
    for g in got:
        assert np.array_equal(g, ref, equal_nan=True)


# ============================================================================ gated activations


def _gelu64(g, u):
    g = g.astype(np.float64)
    c = np.sqrt(2.0 / np.pi)
    return g / (1.0 + np.exp(-2.0 * c * (g + 0.044715 * g**3))) * u.astype(np.float64)


def _swiglu64(g, u):
    g = g.astype(np.float64)
    return g / (1.0 + np.exp(-g)) * u.astype(np.float64)


def _check_act(got, g, u, ref64):
    ulp = np.spacing(np.abs(ref64).astype(np.float32)).astype(np.float64)
    err = np.abs(got.astype(np.float64) - ref64)
    bound = 4 * ulp + 2.0**-24 * np.abs(g.astype(np.float64) * u.astype(np.float64))
    bad = err > bound
    assert not bad.any(), (g[bad][:5], u[bad][:5], got[bad][:5], ref64[bad][:5])


@pytest.mark.parametrize("fn, ref", [(ops.swiglu, _swiglu64), (ops.gelu_tanh_mul, _gelu64)])
@pytest.mark.parametrize("M, F", [(1, 1), (1, 15), (3, 17), (4, 1536), (33, 100), (2, 40000)])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_gated_accuracy(variant, fn, ref, M, F, nthreads):
    rng = np.random.default_rng(M * 7 + F)
    g = _rand(rng, (M, F), 4.0)
    u = _rand(rng, (M, F))
    with np.errstate(over="ignore"):
        _check_act(fn(g, u, nthreads=nthreads), g, u, ref(g, u))


@pytest.mark.parametrize("fn, ref", [(ops.swiglu, _swiglu64), (ops.gelu_tanh_mul, _gelu64)])
def test_gated_accuracy_wide_range(variant, fn, ref):
    rng = np.random.default_rng(5)
    g = np.concatenate(
        [
            rng.uniform(-120, 120, 20000),
            rng.standard_normal(20000) * 1e-4,
            [0.0, -0.0, 1e-30, -1e-30, 88.0, -88.0, 89.0, -89.0, 1e4, -1e4, 1e30, -1e30],
        ]
    ).astype(np.float32)
    u = _rand(rng, g.shape)
    with np.errstate(over="ignore", invalid="ignore"):
        _check_act(fn(g[None], u[None])[0], g, u, ref(g, u))
    assert np.isfinite(fn(g[None], u[None])).all()


# gpt-oss's clamped SwiGLU (alpha, limit as gpt-oss has them)
OAI_ALPHA, OAI_LIMIT = 1.702, 7.0


def _oai(g, u, out=None, *, nthreads=1):
    return ops.swiglu_oai(g, u, OAI_ALPHA, OAI_LIMIT, out, nthreads=nthreads)


def _oai64(g, u):
    a, lim = float(np.float32(OAI_ALPHA)), float(np.float32(OAI_LIMIT))
    x = np.minimum(g.astype(np.float64), lim)
    y = np.clip(u.astype(np.float64), -lim, lim)
    return x / (1.0 + np.exp(-a * x)) * (y + 1.0)


def _check_oai(got, g, u):
    """<= 4 ulp of the formula's float32 roundings + the rounding of the exp argument
    alpha*x (moves the output by |x (y+1)| s(1-s) alpha |x| 2^-24 <= alpha x^2 |y+1| 2^-26)."""
    ref = _oai64(g, u)
    x = np.minimum(g.astype(np.float64), np.float32(OAI_LIMIT))
    y = np.clip(u.astype(np.float64), -OAI_LIMIT, OAI_LIMIT)
    ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    bound = 4 * ulp + OAI_ALPHA * x * x * np.abs(y + 1) * 2.0**-26
    err = np.abs(got.astype(np.float64) - ref)
    bad = err > bound
    assert not bad.any(), (g[bad][:5], u[bad][:5], got[bad][:5], ref[bad][:5])


@pytest.mark.parametrize("M, F", [(1, 1), (3, 17), (4, 1536), (2, 40000)])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_swiglu_oai_accuracy(variant, M, F, nthreads):
    rng = np.random.default_rng(M * 5 + F)
    g = _rand(rng, (M, F), 6.0)  # both sides of the clamp
    u = _rand(rng, (M, F), 6.0)
    with np.errstate(over="ignore"):
        _check_oai(_oai(g, u, nthreads=nthreads), g, u)
        np.testing.assert_allclose(
            _oai(g, u), R.swiglu_oai(g, u, OAI_ALPHA, OAI_LIMIT), rtol=2e-6, atol=1e-6
        )


def test_swiglu_oai_edges(variant):
    """Clamp bounds, huge and tiny gates, NaN passes through (as torch.clamp), limit 0."""
    g = np.array([7.0, 7.5, -7.5, 1e30, -1e30, -100.0, 0.0, -0.0, np.nan, 1.0, 3.0], np.float32)
    u = np.array([7.0, -9.0, 9.0, 1.0, 1.0, 2.0, 5.0, 5.0, 1.0, np.nan, -1.0], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        got = _oai(g[None], u[None])[0]
        ref = R.swiglu_oai(g, u, OAI_ALPHA, OAI_LIMIT)
        fin = np.isfinite(ref)
        _check_oai(got[fin], g[fin], u[fin])
    assert np.isnan(got[8]) and np.isnan(got[9]) and np.isnan(ref[8]) and np.isnan(ref[9])
    assert got[10] == 0.0 and got[4] == 0.0  # (y + 1) = 0; sigmoid underflow
    z = ops.swiglu_oai(g[None, :8], u[None, :8], 1.0, 0.0)[0]  # limit 0: x <= 0, y = 0
    np.testing.assert_allclose(z, R.swiglu_oai(g[:8], u[:8], 1.0, 0.0), rtol=2e-6, atol=1e-37)
    with pytest.raises(ValueError):
        ops.swiglu_oai(g[None], u[None], 1.0, -1.0)
    with pytest.raises(ValueError):
        ops.swiglu_oai(g[None], u[None], float("nan"), 7.0)


def test_gated_matches_reference(variant):
    rng = np.random.default_rng(11)
    g = _rand(rng, (7, 300), 3.0)
    u = _rand(rng, (7, 300))
    np.testing.assert_allclose(ops.swiglu(g, u), R.swiglu(g, u), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ops.gelu_tanh_mul(g, u), R.gelu_tanh_mul(g, u), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fn", [ops.swiglu, ops.gelu_tanh_mul, ops.add, _oai])
def test_elementwise_independent_of_position(fn):
    """The same element gives the same bits alone, at any column, in any M, with a strided
    layout, with 1 or 2 threads, on every variant."""
    rng = np.random.default_rng(3)
    n = 4099
    g = _rand(rng, (n,), 5.0)
    u = _rand(rng, (n,))

    def run():
        base = fn(g[None], u[None])[0]
        outs = [base]
        for k in (0, 1, 7, 15, 16, 17, 1000):  # each element alone, at a shifted column
            outs.append(
                np.concatenate(
                    [fn(g[i : i + 1][None], u[i : i + 1][None])[0] for i in range(k, k + 40)]
                )
            )
        for M in (3, 37, 4099 // 1):  # same elements, other row lengths
            F = n // M
            gg = g[: M * F].reshape(M, F)
            uu = u[: M * F].reshape(M, F)
            assert np.array_equal(fn(gg, uu, nthreads=2).ravel(), base[: M * F])
            assert np.array_equal(fn(gg, uu).ravel(), base[: M * F])
        # shifted start (unaligned) and strided column halves of one buffer
        assert np.array_equal(fn(g[5:][None], u[5:][None])[0], base[5:])
        h = np.empty((8, 2 * 512), np.float32)
        h[:, :512] = g[:4096].reshape(8, 512)
        h[:, 512:] = u[:4096].reshape(8, 512)
        assert np.array_equal(fn(h[:, :512], h[:, 512:]).ravel(), base[:4096])
        return base, outs

    res = _each_variant(run)
    for base, outs in res:
        for k, o in zip((0, 1, 7, 15, 16, 17, 1000), outs[1:]):
            assert np.array_equal(o, base[k : k + 40])
    for base, _ in res[1:]:  # variants agree bit for bit
        assert np.array_equal(base, res[0][0])


@settings(max_examples=30, deadline=None)
@given(
    hnp.arrays(np.float32, st.integers(1, 70), elements=st.floats(-100, 100, width=32)),
    st.integers(0, 69),
)
def test_swiglu_gelu_hypothesis(g, k):
    u = np.ones_like(g)
    for fn in (ops.swiglu, ops.gelu_tanh_mul):
        full = fn(g[None], u[None])[0]
        k = k % g.size
        assert np.array_equal(fn(g[k : k + 1][None], u[k : k + 1][None])[0], full[k : k + 1])
        assert np.array_equal(fn(g[k:][None], u[k:][None])[0], full[k:])


def test_exp_f32_accuracy(variant):
    x = np.linspace(-86.8, 88.7, 400_001).astype(np.float32)
    x = np.concatenate([x, np.linspace(-1, 1, 100_001).astype(np.float32)])
    y = ops._exp_f32(x).astype(np.longdouble)
    ref = np.exp(x.astype(np.longdouble))
    ulps = np.abs(y - ref) / np.spacing(ref.astype(np.float32)).astype(np.longdouble)
    assert float(ulps.max()) <= 1.6
    special = np.array([np.inf, -np.inf, np.nan, 89.0, -88.0, 0.0], np.float32)
    ys = ops._exp_f32(special)
    assert ys[0] == np.inf and ys[1] == 0 and np.isnan(ys[2]) and ys[3] == np.inf
    assert ys[4] == 0 and ys[5] == 1


# ============================================================================ add


@pytest.mark.parametrize("shape", [(1,), (17,), (1, 576), (9, 100), (300, 577)])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_add_bit_exact(variant, shape, nthreads):
    rng = np.random.default_rng(len(shape) * 100 + shape[-1])
    x = _rand(rng, shape)
    y = _rand(rng, shape)
    assert np.array_equal(ops.add(x, y, nthreads=nthreads), x + y)
    z = x.copy()
    ops.add(z, y, out=z, nthreads=nthreads)  # residual in place
    assert np.array_equal(z, x + y)


def test_add_strided(variant):
    rng = np.random.default_rng(2)
    buf = _rand(rng, (40, 200))
    x, y = buf[:, :100], buf[:, 100:]
    assert np.array_equal(ops.add(x, y, nthreads=2), x + y)


# ============================================================================ RoPE


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize(
    "T, H, hd, n_rot",
    [
        (1, 9, 64, 64),
        (5, 3, 64, 64),
        (33, 4, 128, 128),
        (7, 2, 256, 256),
        (6, 3, 64, 32),
        (4, 2, 80, 80),
        (300, 12, 64, 64),
        (3, 1, 24, 10),
    ],
)
@pytest.mark.parametrize("nthreads", [1, 2])
def test_rope_bit_exact(variant, neox, T, H, hd, n_rot, nthreads):
    rng = np.random.default_rng(T * 13 + hd)
    cos, sin = R.rope_tables(n_rot, 10000.0, 4096)
    x = _rand(rng, (T, H, hd), 2.0)
    pos = rng.integers(0, 4096, T).astype(np.int32)
    ref = R.rope(x, pos, cos, sin, neox)
    assert np.array_equal(ops.rope(x, pos, cos, sin, neox, nthreads=nthreads), ref)
    y = x.copy()
    ops.rope(y, pos, cos, sin, neox, out=y, nthreads=nthreads)  # in place
    assert np.array_equal(y, ref)


def test_rope_freq_factors(variant):
    rng = np.random.default_rng(9)
    cos, sin = R.rope_tables(64, 500000.0, 2048, freq_factors=np.linspace(1, 8, 32))
    x = _rand(rng, (11, 4, 64))
    pos = np.arange(100, 111, dtype=np.int32)
    for neox in (False, True):
        assert np.array_equal(ops.rope(x, pos, cos, sin, neox), R.rope(x, pos, cos, sin, neox))


# ============================================================================ argument errors


def test_errors():
    x = np.ones((2, 8), np.float32)
    w = np.ones(8, np.float32)
    with pytest.raises(TypeError):
        ops.rmsnorm(x.astype(np.float64), w, 1e-5)
    with pytest.raises(ValueError):
        ops.rmsnorm(x, np.ones(7, np.float32), 1e-5)
    with pytest.raises(ValueError):
        ops.rmsnorm(np.ones((8, 2), np.float32).T, w, 1e-5)  # last axis not contiguous
    with pytest.raises(ValueError):
        ops.swiglu(x, np.ones((2, 7), np.float32))
    with pytest.raises(ValueError):
        ops.add(x, x, out=np.ones((2, 9), np.float32))
    with pytest.raises(ValueError):
        ops.add(x, x, nthreads=0)
    with pytest.raises(TypeError):
        ops.add(x.tolist(), x)
    cos, sin = R.rope_tables(8, 10000.0, 16)
    q = np.ones((2, 1, 8), np.float32)
    with pytest.raises(ValueError):
        ops.rope(q, np.array([0, 16], np.int32), cos, sin, False)
    with pytest.raises(TypeError):
        ops.rope(q, np.array([0, 1], np.int64), cos, sin, False)
    with pytest.raises(ValueError):
        ops.rope(np.ones((2, 1, 4), np.float32), np.array([0, 1], np.int32), cos, sin, False)


def test_empty_inputs():
    x = np.ones((0, 8), np.float32)
    assert ops.rmsnorm(x, np.ones(8, np.float32), 1e-5).shape == (0, 8)
    assert ops.swiglu(x, x).shape == (0, 8)
    assert ops.add(x, x).shape == (0, 8)
    cos, sin = R.rope_tables(8, 10000.0, 16)
    q = np.ones((0, 2, 8), np.float32)
    assert ops.rope(q, np.zeros(0, np.int32), cos, sin, True).shape == (0, 2, 8)
