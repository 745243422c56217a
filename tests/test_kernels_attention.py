"""Compiled kv_write / exact attention vs goinfer._reference, on every ISA variant.

Tolerance against the float64 reference: |out - ref| <= ulp(ref) + 2^-26 max|v|.
The kernel accumulates in float64 exactly like the reference, except that each softmax
weight is its own exp (relative error 4.3e-12) with the significand cut to 29 bits (relative
error < 2^-28 + 4.3e-12) so that e*v is exact.  The weights appear in the numerator and in l, so the
normalized output (a convex combination of the v's) moves by < 2 * 2^-28 max|v| before the
final rounding to float32, which can then differ by one ulp.  (The reference's own float64
rounding, ~1e-16, is negligible.)

Bit-identity (np.array_equal): a query's output does not depend on the batch it is in (prefill
of T queries == T single-query calls with growing context; any subset / order of the queries),
on the thread count, on the ISA variant, or on garbage in unwritten cache slots.

Cache storage types (f32, f16, q8_0): kv_write stores exactly the reference's rounding (bytes
compared), and both kernels over a cache of any type give the bits they give over a float32
cache holding the stored values (goinfer._reference.dequantize_kv): the stored values convert
exactly, and the kernels compute on them with the float32 cache's operation sequence.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from goinfer import _reference as R
from goinfer._kernels import _config, attention, attention_fast, kv_write
from goinfer.kv_cache import KV_DTYPES, kv_shapes

_att = importlib.import_module("goinfer._kernels.attention")  # the module (test hooks)
VARIANTS = _config.supported_variants()


@pytest.fixture(autouse=True, scope="module")
def _force_threads():
    """Tiny test shapes still run with the requested thread count."""
    old = _att._set_grain(0)
    yield
    _att._set_grain(old)


@pytest.fixture(params=VARIANTS)
def variant(request):
    old = _config.variant()
    _config.set_variant(request.param)
    yield request.param
    _config.set_variant(old)


def test_dispatch_follows_config(variant):
    assert _att._variant_used() == variant == _config.variant()


def _each_variant(fn):
    old = _config.variant()
    try:
        res = []
        for v in VARIANTS:
            _config.set_variant(v)
            res.append(fn())
        return res
    finally:
        _config.set_variant(old)


def empty_caches(dtype, nb, n_kv, hd, bs, fill=0.0):
    """One layer's k, v caches of a storage type; fill: NaN fills every byte with 0xff (a NaN
    in every float type and in q8_0's scales)"""
    ks, vs, npdt = kv_shapes(dtype, nb, n_kv, hd, bs)
    k, v = np.zeros(ks, npdt), np.zeros(vs, npdt)
    if fill != 0.0:
        if np.isnan(fill):
            k.view(np.uint8)[...] = 0xFF
            v.view(np.uint8)[...] = 0xFF
        else:
            k[...] = fill
            v[...] = fill
    return k, v


class Seq:
    """One layer's cache holding one sequence of n tokens in randomly placed blocks."""

    def __init__(
        self,
        rng,
        n,
        n_kv,
        hd,
        bs,
        fill=0.0,
        spare=3,
        kscale=1.0,
        dtype="f32",
        vscale=1.0,
        voffset=0.0,
    ):
        nb_seq = (n + bs - 1) // bs
        nb = nb_seq + spare
        self.k_cache, self.v_cache = empty_caches(dtype, nb, n_kv, hd, bs, fill)
        self.block_table = rng.permutation(nb)[:nb_seq].astype(np.int32)  # non-contiguous
        self.k = (rng.standard_normal((n, n_kv, hd)) * kscale).astype(np.float32)
        self.v = rng.standard_normal((n, n_kv, hd)).astype(np.float32)
        if vscale != 1.0 or voffset != 0.0:
            self.v = (self.v * np.float32(vscale) + np.float32(voffset)).astype(np.float32)
        pos = np.arange(n)
        self.slots = self.block_table[pos // bs].astype(np.int64) * bs + pos % bs
        kv_write(self.k_cache, self.v_cache, self.k, self.v, self.slots)
        self.bs = bs

    def args(self):
        return self.k_cache, self.v_cache, self.block_table

    def stored(self):
        """the same sequence in a float32 cache holding the stored values"""
        k, v = R.dequantize_kv(self.k_cache, self.v_cache)
        return k, v, self.block_table


def _check(got, ref, v):
    bound = np.spacing(np.abs(ref)) + 2.0**-26 * float(np.abs(v).max())
    err = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    assert (err <= bound).all(), float((err / bound).max())


# ============================================================================ kv_write


@pytest.mark.parametrize("dtype", KV_DTYPES)
@pytest.mark.parametrize("bs", [1, 5, 16, 32])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_kv_write_matches_reference(variant, dtype, bs, nthreads):
    """Every byte the kernel stores (values, q8_0 scales) is the reference's; garbage around
    the written slots stays as it was."""
    rng = np.random.default_rng(bs)
    n_kv, hd, nb = 3, 64, 12
    kc, vc = empty_caches(dtype, nb, n_kv, hd, bs)
    kc.view(np.uint8)[...] = rng.integers(0, 256, kc.nbytes, dtype=np.uint8).reshape(
        kc.view(np.uint8).shape
    )
    vc.view(np.uint8)[...] = rng.integers(0, 256, vc.nbytes, dtype=np.uint8).reshape(
        vc.view(np.uint8).shape
    )
    kc2, vc2 = kc.copy(), vc.copy()
    T = min(nb * bs, 150)
    k = rng.standard_normal((T, n_kv, hd)).astype(np.float32)
    v = (rng.standard_normal((T, n_kv, hd)) * 100).astype(np.float32)
    slots = rng.integers(0, nb * bs, T).astype(np.int64)  # repeats: the last token wins
    kv_write(kc, vc, k, v, slots, nthreads=nthreads)
    R.kv_write(kc2, vc2, k, v, slots)
    assert np.array_equal(kc.view(np.uint8), kc2.view(np.uint8))
    assert np.array_equal(vc.view(np.uint8), vc2.view(np.uint8))


_SPECIAL = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    65504.0,
    65519.99,
    65520.0,
    1e5,
    -1e9,
    6e-8,
    2.9e-8,
    3e-8,
    6.1e-5,
    6.09e-5,
    1e-30,
    -1e-45,
    np.inf,
    -np.inf,
]


@settings(max_examples=40, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.sampled_from(KV_DTYPES),
    st.sampled_from([-30, -12, 0, 4, 12]),
    st.booleans(),
)
def test_kv_write_rounding_hypothesis(seed, dtype, log_scale, special):
    """Values from tiny to past float16's range (subnormals, overflow to inf, signed zeros,
    infinities): the stored bytes are the reference's on every variant; f16 is NumPy's
    float16 rounding; q8_0 stays within half a quantization step (s/2) of each value (a block
    with inf / NaN, or whose scale overflows float16, reads as NaN), and a token's stored bytes
    depend only on its own values (written alone == written in a batch)."""
    rng = np.random.default_rng(seed)
    n_kv, hd, bs, T = 2, 64, 8, 24
    k = (rng.standard_normal((T, n_kv, hd)) * 2.0**log_scale).astype(np.float32)
    v = (rng.standard_normal((T, n_kv, hd)) * 2.0**log_scale).astype(np.float32)
    if special:
        k.reshape(-1)[rng.integers(0, k.size, 12)] = rng.choice(np.array(_SPECIAL, np.float32), 12)
        v.reshape(-1)[rng.integers(0, v.size, 12)] = rng.choice(np.array(_SPECIAL, np.float32), 12)
    slots = rng.permutation(4 * bs)[:T].astype(np.int64)
    kr, vr = empty_caches(dtype, 4, n_kv, hd, bs)
    R.kv_write(kr, vr, k, v, slots)

    alone = rng.permutation(T)[:3]

    def write():
        kc, vc = empty_caches(dtype, 4, n_kv, hd, bs)
        kv_write(kc, vc, k, v, slots, nthreads=2)
        assert np.array_equal(kc.view(np.uint8), kr.view(np.uint8))
        assert np.array_equal(vc.view(np.uint8), vr.view(np.uint8))
        for t in alone:  # a token written alone, into a cache of batch-written tokens
            k1, v1 = kc.copy(), vc.copy()
            kv_write(k1, v1, k[t : t + 1], v[t : t + 1], slots[t : t + 1])
            assert np.array_equal(k1.view(np.uint8), kc.view(np.uint8))
            assert np.array_equal(v1.view(np.uint8), vc.view(np.uint8))
        return kc, vc

    for kc, vc in _each_variant(write):
        ks, vs = R.dequantize_kv(kc, vc)
        for t in range(T):
            b, o = divmod(int(slots[t]), bs)
            for x, y in ((k[t], ks[b, :, :, o]), (v[t], vs[b, :, o, :])):  # (n_kv, hd)
                if dtype == "f16":
                    assert np.array_equal(
                        y, x.astype(np.float16).astype(np.float32), equal_nan=True
                    )
                elif dtype == "q8_0":
                    xg, yg = x.reshape(n_kv, -1, 32), y.reshape(n_kv, -1, 32)
                    fin = np.isfinite(xg).all(-1)
                    amax = np.abs(np.where(fin[..., None], xg, 0)).max(-1)
                    s = (amax / np.float32(127)).astype(np.float16).astype(np.float64)
                    ok = fin & np.isfinite(s)  # else the block is NaN (a non-finite input or
                    err = np.abs(yg.astype(np.float64) - xg)  # a scale past float16's range)
                    # half a step, plus what the clamp to 127 costs when s was rounded down
                    # (float16 subnormal scales, s = 0 for the tiniest blocks)
                    bound = s * 0.5001 + np.maximum(0.0, amax - 127.0 * s)
                    assert (err[ok] <= bound[ok][:, None]).all()
                    assert np.isnan(yg[~ok]).all()
                else:
                    assert np.array_equal(y, x, equal_nan=True)


def test_q8_0_layout_errors():
    with pytest.raises(ValueError):
        kv_shapes("q8_0", 1, 1, 80, 16) and attention(
            np.ones((1, 1, 80), np.float32),
            *empty_caches("q8_0", 1, 1, 80, 16),
            np.zeros(1, np.int32),
            np.zeros(1, np.int32),
            0.1,
        )
    kc = np.zeros((2, 1, 70, 16), np.int8)  # 70 rows: not hd + hd/16 for any hd % 32 == 0
    with pytest.raises(ValueError):
        attention(
            np.ones((1, 1, 64), np.float32),
            kc,
            np.zeros((2, 1, 16, 70), np.int8),
            np.zeros(1, np.int32),
            np.zeros(1, np.int32),
            0.1,
        )
    k16, v16 = empty_caches("f16", 2, 1, 64, 16)
    with pytest.raises(TypeError):  # mixed types
        attention(
            np.ones((1, 1, 64), np.float32),
            k16,
            v16.astype(np.float32),
            np.zeros(1, np.int32),
            np.zeros(1, np.int32),
            0.1,
        )
    with pytest.raises(TypeError):
        attention(
            np.ones((1, 1, 64), np.float32),
            k16.astype(np.float64),
            v16.astype(np.float64),
            np.zeros(1, np.int32),
            np.zeros(1, np.int32),
            0.1,
        )


# ============================================================================ vs reference

CASES = [
    # T, H, n_kv, hd, bs, window, softcap, start
    (1, 9, 3, 64, 16, 0, 0.0, 0),
    (1, 9, 3, 64, 16, 0, 0.0, 200),
    (7, 9, 3, 64, 16, 0, 0.0, 0),
    (40, 9, 3, 64, 16, 0, 0.0, 30),
    (100, 9, 3, 64, 16, 0, 0.0, 0),
    (3, 4, 4, 64, 16, 0, 0.0, 50),  # GQA ratio 1 (MHA)
    (17, 8, 4, 128, 16, 0, 0.0, 9),  # 2
    (9, 32, 8, 128, 32, 0, 0.0, 70),  # 4
    (5, 16, 2, 128, 16, 0, 0.0, 33),  # 8
    (13, 8, 1, 64, 32, 0, 0.0, 0),  # MQA, 8
    (6, 16, 1, 64, 16, 0, 0.0, 20),  # G = 16 > 12: heads of a group split in items
    (11, 8, 4, 256, 16, 0, 0.0, 5),  # Gemma-like head_dim
    (21, 8, 4, 256, 32, 24, 50.0, 40),  # sliding window + softcap (Gemma 2)
    (6, 8, 2, 512, 16, 0, 0.0, 30),  # head_dim 512 (Gemma 4's global layers)
    (30, 6, 2, 64, 16, 16, 0.0, 64),  # window == block size
    (12, 6, 3, 64, 32, 1, 0.0, 10),  # window 1: only itself
    (25, 6, 3, 128, 16, 0, 30.0, 0),  # softcap only
    (8, 14, 2, 64, 16, 0, 0.0, 90),  # GQA 7 (Qwen2.5-0.5B-like)
    (5, 6, 2, 72, 16, 0, 0.0, 3),  # head_dim 72: multiple of 8 only
    (1, 12, 4, 80, 16, 0, 0.0, 37),  # head_dim 80 (Phi-2 / StableLM), decode
    (2, 8, 2, 96, 16, 0, 0.0, 61),  # head_dim 96 (Phi-3)
    (9, 4, 2, 96, 5, 7, 0.0, 17),  # odd block size
    (4, 3, 3, 8, 64, 0, 0.0, 150),  # tiny head_dim, block 64
    (20, 3, 1, 64, 12, 0, 0.0, 0),  # block 12 (not a multiple of the vector width)
    (12, 8, 2, 64, 16, 0, 0.0, 200),  # 14 blocks: AV over several spans of blocks (avx2: 8)
    (10, 16, 2, 128, 8, 40, 0.0, 170),  # a window across span boundaries, 8 rows in 2 passes
]


CASES_DT = [(*c, dt) for c in CASES for dt in KV_DTYPES if dt != "q8_0" or c[3] % 32 == 0]


@pytest.mark.parametrize("T, H, n_kv, hd, bs, window, softcap, start, dtype", CASES_DT)
@pytest.mark.parametrize("nthreads", [1, 2])
def test_attention_matches_reference(
    variant, T, H, n_kv, hd, bs, window, softcap, start, dtype, nthreads
):
    """Against the float64 reference over the stored values (each storage type)."""
    rng = np.random.default_rng(T * 1000 + H * 10 + hd + bs + start)
    seq = Seq(rng, start + T, n_kv, hd, bs, kscale=2.0, dtype=dtype)
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    q_pos = np.arange(start, start + T, dtype=np.int32)
    scale = 1.0 / np.sqrt(hd)
    got = attention(q, *seq.args(), q_pos, scale, window, softcap, nthreads=nthreads)
    ref = R.attention(q, *seq.args(), q_pos, scale, window, softcap)
    _check(got, ref, seq.v)


def test_attention_random_positions(variant):
    """Queries at arbitrary (unsorted, repeated) positions of one sequence."""
    rng = np.random.default_rng(77)
    seq = Seq(rng, 300, 2, 64, 16)
    q_pos = rng.integers(0, 300, 37).astype(np.int32)
    q = rng.standard_normal((37, 6, 64)).astype(np.float32)
    for window, softcap in [(0, 0.0), (40, 0.0), (100, 20.0)]:
        got = attention(q, *seq.args(), q_pos, 0.125, window, softcap, nthreads=2)
        _check(got, R.attention(q, *seq.args(), q_pos, 0.125, window, softcap), seq.v)


def test_attention_peaked_scores(variant):
    """Large scores (weights spanning hundreds of e-folds, flushed below exp(-600))."""
    rng = np.random.default_rng(5)
    seq = Seq(rng, 90, 2, 64, 16, kscale=30.0)
    q = (rng.standard_normal((10, 4, 64)) * 30).astype(np.float32)
    q_pos = np.arange(80, 90, dtype=np.int32)
    got = attention(q, *seq.args(), q_pos, 0.125)
    _check(got, R.attention(q, *seq.args(), q_pos, 0.125), seq.v)


# ============================================================================ bit identity


@pytest.mark.parametrize(
    "H, n_kv, hd, bs, window, softcap",
    [
        (9, 3, 64, 16, 0, 0.0),
        (8, 2, 128, 32, 0, 0.0),
        (8, 8, 64, 16, 20, 0.0),
        (8, 1, 64, 16, 0, 30.0),
        (16, 1, 64, 12, 9, 0.0),
        (4, 2, 256, 16, 0, 0.0),
        (8, 1, 512, 16, 0, 0.0),
    ],
)
def test_prefill_equals_decode_steps(H, n_kv, hd, bs, window, softcap):
    """Prefill of T queries == T single-query calls with growing context, bit for bit, with
    1 and 2 threads, on every variant (and the variants agree)."""
    rng = np.random.default_rng(H + hd + bs + window)
    T, start = 45, 7
    seq = Seq(rng, start + T, n_kv, hd, bs)
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    q_pos = np.arange(start, start + T, dtype=np.int32)

    def run():
        full = attention(q, *seq.args(), q_pos, 0.1, window, softcap, nthreads=1)
        full2 = attention(q, *seq.args(), q_pos, 0.1, window, softcap, nthreads=2)
        assert np.array_equal(full, full2)
        for t in range(T):
            nb = (start + t) // bs + 1  # the block table as a decode step would see it
            one = attention(
                q[t : t + 1],
                seq.k_cache,
                seq.v_cache,
                seq.block_table[:nb],
                q_pos[t : t + 1],
                0.1,
                window,
                softcap,
                nthreads=1 + t % 2,
            )
            assert np.array_equal(one[0], full[t]), t
        return full

    res = _each_variant(run)
    for r in res[1:]:
        assert np.array_equal(r, res[0])


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(1, 40),
    st.sampled_from([0, 5, 16, 33]),
    st.sampled_from([(6, 3), (8, 2), (12, 1), (4, 4)]),
    st.sampled_from([1, 2, 3]),
    st.booleans(),
)
def test_batch_membership_hypothesis(seed, n_sub, window, heads, nthreads, with_sinks):
    """Any subset of a batch's queries, in any order, with any thread count: same rows
    (with attention sinks too)."""
    H, n_kv = heads
    rng = np.random.default_rng(seed)
    T = 40
    seq = Seq(rng, 120, n_kv, 64, 16)
    q = rng.standard_normal((T, H, 64)).astype(np.float32)
    q_pos = np.sort(rng.integers(0, 120, T)).astype(np.int32)
    sinks = (rng.standard_normal(H) * 3).astype(np.float32) if with_sinks else None
    full = attention(q, *seq.args(), q_pos, 0.125, window, sinks=sinks)
    idx = rng.permutation(T)[:n_sub]
    sub = attention(q[idx], *seq.args(), q_pos[idx], 0.125, window, nthreads=nthreads, sinks=sinks)
    assert np.array_equal(sub, full[idx])


def test_unwritten_slots_do_not_matter(variant):
    """Garbage (NaN) in slots past the last written key and in unused blocks is never read
    into a result."""
    rng = np.random.default_rng(8)
    clean = Seq(rng, 70, 2, 64, 16, fill=0.0)
    rng = np.random.default_rng(8)
    dirty = Seq(rng, 70, 2, 64, 16, fill=np.nan)
    q = rng.standard_normal((5, 4, 64)).astype(np.float32)
    q_pos = np.array([3, 17, 40, 65, 69], np.int32)
    a = attention(q, *clean.args(), q_pos, 0.125, 0, 0.0, nthreads=2)
    b = attention(q, *dirty.args(), q_pos, 0.125, 0, 0.0, nthreads=2)
    assert np.isfinite(b).all() and np.array_equal(a, b)
    c = attention(q, *dirty.args(), q_pos, 0.125, 10, 25.0)
    assert np.array_equal(c, attention(q, *clean.args(), q_pos, 0.125, 10, 25.0))


def test_out_argument(variant):
    rng = np.random.default_rng(4)
    seq = Seq(rng, 50, 2, 64, 16)
    q = rng.standard_normal((6, 4, 64)).astype(np.float32)
    q_pos = np.arange(44, 50, dtype=np.int32)
    ref = attention(q, *seq.args(), q_pos, 0.125)
    out = np.empty_like(q)
    assert attention(q, *seq.args(), q_pos, 0.125, out=out) is out
    assert np.array_equal(out, ref)


# ============================================================================ exp / tanh


def test_exp_tanh_weight_accuracy(variant):
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [rng.uniform(-600, 0, 200_000), rng.uniform(-1, 1, 100_000), rng.uniform(0, 709, 20_000)]
    )
    ref = np.exp(x.astype(np.longdouble))
    y = _att._exp_f64(x)
    ulps = np.abs(y.astype(np.longdouble) - ref) / np.spacing(ref.astype(np.float64))
    assert float(ulps.max()) <= 2.5
    xn = x[x <= 0]
    w = _att._weight_f64(xn)
    rel = np.abs(w.astype(np.longdouble) - np.exp(xn.astype(np.longdouble))) / np.exp(
        xn.astype(np.longdouble)
    )
    assert float(rel.max()) < 2.0**-28 + 1e-11  # the cut + the short polynomial (4.3e-12)
    bits = w.view(np.uint64) & np.uint64((1 << 24) - 1)
    assert not bits.any()  # significand of 29 bits: e * float32 is exact in double
    assert _att._weight_f64(np.array([-601.0, -1e300, 0.0]))[:2].tolist() == [0.0, 0.0]
    u = np.concatenate(
        [
            rng.uniform(-30, 30, 100_000),
            rng.uniform(-1e-3, 1e-3, 10_000),
            [0.0, -0.0, 400.0, -400.0],
        ]
    )
    th = _att._tanh_f64(u)
    assert float(np.abs(th.astype(np.longdouble) - np.tanh(u.astype(np.longdouble))).max()) < 5e-16
    assert np.array_equal(np.signbit(th), np.signbit(u))


# ============================================================================ argument errors


def test_errors():
    rng = np.random.default_rng(0)
    seq = Seq(rng, 20, 2, 64, 16)
    q = np.ones((2, 4, 64), np.float32)
    pos = np.array([18, 19], np.int32)
    kc, vc, bt = seq.args()
    with pytest.raises(TypeError):
        attention(q.astype(np.float64), kc, vc, bt, pos, 0.1)
    with pytest.raises(TypeError):
        attention(q, kc, vc, bt, pos.astype(np.int64), 0.1)
    with pytest.raises(ValueError):
        attention(np.ones((2, 3, 64), np.float32), kc, vc, bt, pos, 0.1)  # 3 % 2
    with pytest.raises(ValueError):
        attention(q, kc, vc, bt[:1], pos, 0.1)  # position 19 needs 2 blocks
    with pytest.raises(ValueError):
        attention(q, kc, vc, np.array([0, 99], np.int32), pos, 0.1)  # block id out of range
    with pytest.raises(ValueError):
        attention(q, kc, vc, bt, np.array([-1, 3], np.int32), 0.1)
    with pytest.raises(ValueError):
        attention(q, kc, vc, bt, pos, 0.1, window=-1)
    with pytest.raises(ValueError):
        attention(q, kc, vc, bt, pos, 0.1, softcap=-2.0)
    with pytest.raises(ValueError):
        attention(q, kc, vc, bt, pos, 0.1, nthreads=0)
    with pytest.raises(ValueError):
        attention(q, kc, np.ones((kc.shape[0], 2, 16, 32), np.float32), bt, pos, 0.1)
    bad_k = np.ones((3, 2, 12, 16), np.float32)  # head_dim 12: not a multiple of 8
    bad_v = np.ones((3, 2, 16, 12), np.float32)
    with pytest.raises(ValueError):
        attention(np.ones((1, 2, 12), np.float32), bad_k, bad_v, bt, pos[:1], 0.1)
    with pytest.raises(ValueError):
        kv_write(
            kc,
            vc,
            np.ones((1, 2, 64), np.float32),
            np.ones((1, 2, 64), np.float32),
            np.array([10**6], np.int64),
        )
    with pytest.raises(TypeError):
        kv_write(
            kc,
            vc,
            np.ones((1, 2, 64), np.float32),
            np.ones((1, 2, 64), np.float32),
            np.array([3], np.int32),
        )


def test_empty_batch():
    rng = np.random.default_rng(0)
    seq = Seq(rng, 20, 2, 64, 16)
    q = np.ones((0, 4, 64), np.float32)
    out = attention(q, *seq.args(), np.zeros(0, np.int32), 0.1)
    assert out.shape == (0, 4, 64)
    kv_write(
        seq.k_cache,
        seq.v_cache,
        np.ones((0, 2, 64), np.float32),
        np.ones((0, 2, 64), np.float32),
        np.zeros(0, np.int64),
    )


# ============================================================================ fast kernel
#
# attention_fast computes the same function in float32 (key tiles of 64, online softmax,
# 2^x by a degree-5 polynomial), so it is compared with the exact kernel by cosine similarity
# of each output row (one query, one head).  Why 0.999 per row is safe, for the ranges drawn
# below (n <= 4096 keys, hd <= 128): the weights' relative error is at most about
# hd * u * max_j sum_d |q_d k_d| * scale (float32 scores, u = 2^-24) plus 2e-7 (the
# polynomial), i.e. < 1e-3 even for the peaked scores of the largest q/k scale; the output's
# float32 accumulation sum_j p_j v_j adds at most about n * u * kappa relative error, where
# kappa = sum_j |p_j v_j| / |sum_j p_j v_j| <= ~sqrt(n) = 64 for random values, so < 1.6e-2.
# A relative error e gives cosine >= 1 - e^2 / 2 > 0.9998.  Observed: 1 - cos < 1e-10.
# The mean of (1 - cos) over rows, where errors average like random walks, is held to 1e-6.

FAST_COS_MIN = 0.9998  # the bound derived above
FAST_MEAN_DIST_MAX = 1e-6


def _cos_rows(a, b):
    """cosine similarity of each (query, head) row of two (T, H, hd) arrays, in float64"""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def _check_fast(fast, exact):
    assert np.isfinite(fast).all()
    c = _cos_rows(fast, exact)
    assert float(c.min()) >= FAST_COS_MIN, float(c.min())
    assert float((1.0 - c).mean()) <= FAST_MEAN_DIST_MAX, float((1.0 - c).mean())


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(512, 4096),
    n_new=st.integers(1, 160),
    hd=st.sampled_from([64, 128]),
    group=st.sampled_from([1, 2, 3, 4, 6, 8]),
    n_kv=st.sampled_from([1, 2]),
    bs=st.sampled_from([1, 5, 16, 32, 64]),
    qk_scale=st.floats(-4.0, 0.9),
    v_scale=st.floats(-6.0, 4.0),
    v_offset=st.sampled_from([0.0, 3.0]),
    nthreads=st.sampled_from([1, 2]),
    dtype=st.sampled_from(KV_DTYPES),
)
def test_fast_close_to_exact_hypothesis(
    seed, n, n_new, hd, group, n_kv, bs, qk_scale, v_scale, v_offset, nthreads, dtype
):
    """The last n_new queries of a sequence of n keys (a prefill suffix, or a decode step:
    then the keys are split over threads by chunk), random values from tiny to large (q, k ~
    10^qk_scale, v ~ 10^v_scale, optionally far from zero mean), random block tables, NaN in
    every slot that was never written, each storage type: fast vs exact per row."""
    rng = np.random.default_rng(seed)
    H = group * n_kv
    vs = 10.0**v_scale
    if dtype == "f16":  # values f16 can hold (max 65504): 10^4 * (3 + 5 sigma) would overflow
        vs = min(vs, 10.0**3.5)
    seq = Seq(
        rng,
        n,
        n_kv,
        hd,
        bs,
        fill=np.nan,
        kscale=10.0**qk_scale,
        dtype=dtype,
        vscale=vs,
        voffset=v_offset * vs,
    )
    q = (rng.standard_normal((n_new, H, hd)) * 10.0**qk_scale).astype(np.float32)
    q_pos = np.arange(n - n_new, n, dtype=np.int32)
    scale = 1.0 / np.sqrt(hd)
    exact = attention(q, *seq.args(), q_pos, scale, nthreads=nthreads)
    fast = attention_fast(q, *seq.args(), q_pos, scale, nthreads=nthreads)
    _check_fast(fast, exact)


@pytest.mark.parametrize("T, H, n_kv, hd, bs, window, softcap, start", CASES)
def test_fast_close_to_reference(variant, T, H, n_kv, hd, bs, window, softcap, start):
    """Every shape of the exact kernel's table (windows, softcaps, head dims 8..512, odd
    block sizes), on every variant, against the float64 NumPy reference."""
    rng = np.random.default_rng(T * 1000 + H * 10 + hd + bs + start)
    seq = Seq(rng, start + T, n_kv, hd, bs, kscale=2.0, fill=np.nan)
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    q_pos = np.arange(start, start + T, dtype=np.int32)
    scale = 1.0 / np.sqrt(hd)
    got = attention_fast(q, *seq.args(), q_pos, scale, window, softcap, nthreads=2)
    _check_fast(got, R.attention(q, *seq.args(), q_pos, scale, window, softcap))


@pytest.mark.parametrize("window, softcap", [(0, 0.0), (100, 0.0), (0, 30.0), (700, 50.0)])
def test_fast_long_window_softcap(window, softcap):
    """Sliding window and softcap over a long prefill (tiles wholly outside a window are
    skipped; a window edge falls inside a tile)."""
    rng = np.random.default_rng(window + int(softcap))
    seq = Seq(rng, 1500, 2, 128, 16, fill=np.nan, kscale=2.0)
    q = rng.standard_normal((900, 8, 128)).astype(np.float32)
    q_pos = np.arange(600, 1500, dtype=np.int32)
    exact = attention(q, *seq.args(), q_pos, 0.09, window, softcap, nthreads=2)
    _check_fast(attention_fast(q, *seq.args(), q_pos, 0.09, window, softcap, nthreads=2), exact)


@settings(max_examples=15, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(1, 100),
    st.sampled_from([0, 5, 70]),
    st.sampled_from([(9, 3), (8, 2), (16, 1), (4, 4), (7, 1), (18, 2)]),
    st.sampled_from([1, 2, 3]),
    st.booleans(),
)
def test_fast_batch_membership_hypothesis(seed, n_sub, window, heads, nthreads, with_sinks):
    """The fast kernel is not exact, but it is deterministic per row: any subset of a call's
    queries, in any order, with any thread count gives the same bits (tiles are aligned to
    absolute key positions; a row's no-op tiles are exact no-ops; a sink is folded once,
    after every chunk)."""
    H, n_kv = heads
    rng = np.random.default_rng(seed)
    T = 100
    seq = Seq(rng, 700, n_kv, 64, 16, fill=np.nan)
    q = rng.standard_normal((T, H, 64)).astype(np.float32)
    q_pos = np.sort(rng.integers(0, 700, T)).astype(np.int32)
    sinks = (rng.standard_normal(H) * 3).astype(np.float32) if with_sinks else None
    full = attention_fast(q, *seq.args(), q_pos, 0.125, window, sinks=sinks)
    idx = rng.permutation(T)[:n_sub]
    sub = attention_fast(
        q[idx], *seq.args(), q_pos[idx], 0.125, window, nthreads=nthreads, sinks=sinks
    )
    assert np.array_equal(sub, full[idx])


def test_fast_prefill_chunks_equal_one_call(variant):
    """A prefill suffix in one fast call == the same suffix in pieces (as Model.forward runs
    it in chunks), bit for bit, on every variant."""
    rng = np.random.default_rng(3)
    seq = Seq(rng, 1100, 3, 64, 16)
    q = rng.standard_normal((1000, 9, 64)).astype(np.float32)
    q_pos = np.arange(100, 1100, dtype=np.int32)
    one = attention_fast(q, *seq.args(), q_pos, 0.125, nthreads=2)
    parts = [
        attention_fast(q[a:b], *seq.args(), q_pos[a:b], 0.125, nthreads=1)
        for a, b in ((0, 512), (512, 1000))
    ]
    assert np.array_equal(one, np.concatenate(parts))


@pytest.mark.parametrize(
    "H, n_kv, hd, bs, window, softcap",
    [
        (9, 3, 64, 16, 0, 0.0),
        (8, 2, 128, 32, 0, 0.0),
        (8, 8, 64, 16, 20, 0.0),
        (8, 1, 64, 16, 0, 30.0),
        (16, 1, 64, 12, 90, 0.0),
        (4, 2, 256, 16, 0, 0.0),
        (8, 1, 512, 16, 0, 0.0),
        (12, 4, 80, 16, 0, 0.0),  # decode's AV d-chunks of 3 and 2 vectors (avx2)
        # decode in two or three direct row blocks of 3 + 4, 4 + 5 (avx2: 3 key vectors per
        # QK pass in one, 2 in the other) and 6 + 6 rows (portable: 3 + 4, 3 x 3, 3 x 4)
        (7, 1, 64, 16, 0, 0.0),
        (18, 2, 96, 16, 40, 0.0),
        (12, 1, 128, 32, 0, 20.0),
    ],
)
def test_fast_prefill_equals_decode_steps(variant, H, n_kv, hd, bs, window, softcap):
    """The default mode's contract rests on this: a fast prefill of T queries == T
    single-query calls with growing context and the block table a decode step sees, bit for
    bit, with 1 and 2 threads (queries crossing several 64-key tiles)."""
    rng = np.random.default_rng(H + hd + bs + window + 1)
    T, start = 150, 530
    seq = Seq(rng, start + T, n_kv, hd, bs, fill=np.nan)
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    q_pos = np.arange(start, start + T, dtype=np.int32)
    full = attention_fast(q, *seq.args(), q_pos, 0.1, window, softcap, nthreads=1)
    assert np.array_equal(
        full, attention_fast(q, *seq.args(), q_pos, 0.1, window, softcap, nthreads=2)
    )
    for t in range(0, T, 7):
        nb = (start + t) // bs + 1
        one = attention_fast(
            q[t : t + 1],
            seq.k_cache,
            seq.v_cache,
            seq.block_table[:nb],
            q_pos[t : t + 1],
            0.1,
            window,
            softcap,
            nthreads=1 + t % 2,
        )
        assert np.array_equal(one[0], full[t]), t


def test_fast_zero_sign_is_the_rows_own(variant):
    """A row whose accumulator ends at -0 (its rescale c underflowed to 0, then its own
    values are -0) must not turn +0 because another row of the item read keys past it
    (0 * v = +0 for v > 0, and -0 + +0 = +0): the output's bits are the row's own."""
    n_kv, hd, bs = 1, 64, 16
    k_cache = np.zeros((8, n_kv, hd, bs), np.float32)
    v_cache = np.zeros((8, n_kv, bs, hd), np.float32)
    bt = np.arange(8, dtype=np.int32)
    n = 128
    k = np.zeros((n, n_kv, hd), np.float32)
    v = np.zeros((n, n_kv, hd), np.float32)
    k[:64, 0, 0] = 1.0  # tile 0: low scores, v[:, 0] = -1
    k[64:, 0, 0] = 200.0  # tile 1: scores so much higher that c = 2^(m - m') is 0
    v[:64, 0, :] = -1.0
    v[64:101, 0, :] = -0.0  # the row at 100 sees only -0 in tile 1
    v[101:, 0, :] = 1.0  # keys past it: +1
    slots = np.arange(n, dtype=np.int64)
    kv_write(k_cache, v_cache, k, v, slots)
    q = np.zeros((2, 1, hd), np.float32)
    q[:, 0, 0] = 1.0
    q_pos = np.array([100, 127], np.int32)
    both = attention_fast(q, k_cache, v_cache, bt, q_pos, 1.0)
    alone = attention_fast(q[:1], k_cache, v_cache, bt, q_pos[:1], 1.0)
    assert np.array_equal(both[0], alone[0])
    assert np.array_equal(np.signbit(both[0]), np.signbit(alone[0]))  # array_equal: -0 == +0
    assert not np.signbit(alone[0]).any()


def test_fast_out_argument_and_errors():
    rng = np.random.default_rng(4)
    seq = Seq(rng, 50, 2, 64, 16)
    q = rng.standard_normal((6, 4, 64)).astype(np.float32)
    q_pos = np.arange(44, 50, dtype=np.int32)
    ref = attention_fast(q, *seq.args(), q_pos, 0.125)
    out = np.empty_like(q)
    assert attention_fast(q, *seq.args(), q_pos, 0.125, out=out) is out
    assert np.array_equal(out, ref)
    kc, vc, bt = seq.args()
    with pytest.raises(TypeError):
        attention_fast(q.astype(np.float64), kc, vc, bt, q_pos, 0.1)
    with pytest.raises(ValueError):
        attention_fast(q, kc, vc, bt[:1], q_pos, 0.1)
    with pytest.raises(ValueError):
        attention_fast(q, kc, vc, bt, q_pos, 0.1, window=-1)
    with pytest.raises(ValueError):
        attention_fast(q, kc, vc, bt, q_pos, 0.1, nthreads=0)
    assert attention_fast(q[:0], kc, vc, bt, q_pos[:0], 0.1).shape == (0, 4, 64)


# ============================================================================ storage types


@pytest.mark.parametrize("dtype", ["f16", "q8_0"])
@pytest.mark.parametrize("kernel", [attention, attention_fast])
@pytest.mark.parametrize(
    "n, T, H, n_kv, hd, bs, window, softcap",
    [
        (300, 40, 9, 3, 64, 16, 0, 0.0),
        (1300, 1, 9, 3, 64, 16, 0, 0.0),
        (1300, 70, 8, 2, 128, 32, 0, 0.0),
        (1100, 1, 4, 1, 256, 16, 512, 0.0),
        (700, 5, 8, 4, 64, 5, 100, 30.0),
    ],
)
def test_kernels_compute_on_the_stored_values(
    variant, dtype, kernel, n, T, H, n_kv, hd, bs, window, softcap
):
    """Over a cache of any storage type, both kernels give the bits they give over a float32
    cache holding the stored values (1 and 2 threads; decode steps with split keys too)."""
    rng = np.random.default_rng(n + T + hd)
    seq = Seq(rng, n, n_kv, hd, bs, fill=np.nan, kscale=2.0, dtype=dtype)
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    q_pos = np.arange(n - T, n, dtype=np.int32)
    want = kernel(q, *seq.stored(), q_pos, 0.1, window, softcap, nthreads=1)
    for nt in (1, 2):
        assert np.array_equal(
            kernel(q, *seq.args(), q_pos, 0.1, window, softcap, nthreads=nt), want
        )


@pytest.mark.parametrize("dtype", KV_DTYPES)
def test_fast_decode_split_equals_prefill_rows(variant, dtype):
    """A decode step far past the first chunk runs its keys split over the threads by chunk
    (non-vacuity: the plan's kchunks); its bits are the prefill row's for every thread count
    and at positions around the 512-key chunk boundaries, windowed too."""
    rng = np.random.default_rng(11)
    n, H, n_kv, hd = 1600, 6, 2, 64
    seq = Seq(rng, n, n_kv, hd, 16, fill=np.nan, dtype=dtype)
    q = rng.standard_normal((n, H, hd)).astype(np.float32)
    pos = np.arange(n, dtype=np.int32)
    assert _att._fast_plan(q[:1], *seq.args(), pos[-1:], nthreads=2)["kchunks"] == 4
    assert _att._fast_plan(q[:1], *seq.args(), pos[-1:], nthreads=1)["kchunks"] == 1
    for window in (0, 600):
        full = attention_fast(q, *seq.args(), pos, 0.125, window, nthreads=2)
        for p in (510, 511, 512, 1023, 1024, 1025, 1599):
            for nt in (1, 2, 3):
                one = attention_fast(
                    q[p : p + 1], *seq.args(), pos[p : p + 1], 0.125, window, nthreads=nt
                )
                assert np.array_equal(one[0], full[p]), (window, p, nt)


# (n_kv, window, threads) -> (kvspan, kchunks) of a decode step at position 1099 (3 chunks of
# keys), hd 64: the span starts at every kv head, halves while a tile of its K and V is over
# 128 KB, then while the items (spans x chunks when split) cannot occupy the threads twice
# over; a window of 700 keys covers 2 chunks.  A tile of 8 kv heads is 128 KB in f16, 70 KB
# in q8_0 and 256 KB in f32 (SPAN_PLANS_F32).
SPAN_PLANS = {
    (8, 0, 1): (8, 1),
    (8, 0, 2): (4, 3),
    (8, 0, 3): (4, 3),
    (8, 700, 2): (4, 3),
    (3, 0, 1): (3, 1),
    (3, 0, 2): (2, 3),  # spans of 2 and 1 kv heads
    (3, 0, 3): (2, 3),
}
SPAN_PLANS_F32 = {**SPAN_PLANS, (8, 0, 1): (4, 1)}


@pytest.mark.parametrize("dtype", KV_DTYPES)
@pytest.mark.parametrize("n_kv, window", [(8, 0), (3, 0), (8, 700)])
def test_fast_decode_kv_head_span(variant, dtype, n_kv, window):
    """A decode step over more than one chunk of keys (over 512) runs several kv heads per
    item, tile by tile (the plan's kvspan, non-vacuity); its bits are the prefill row's (one
    kv head per item) for 1-3 threads and at positions around the chunk boundaries.  Within
    one chunk (and for a prefill) an item keeps one kv head."""
    rng = np.random.default_rng(n_kv + window)
    n, H, hd = 1100, 2 * n_kv, 64
    seq = Seq(rng, n, n_kv, hd, 16, fill=np.nan, dtype=dtype)
    q = rng.standard_normal((n, H, hd)).astype(np.float32)
    pos = np.arange(n, dtype=np.int32)
    for (nk, w, nt), want in (SPAN_PLANS_F32 if dtype == "f32" else SPAN_PLANS).items():
        if (nk, w) == (n_kv, window):
            plan = _att._fast_plan(q[:1], *seq.args(), pos[-1:], w, nthreads=nt)
            assert (plan["kvspan"], plan["kchunks"]) == want, nt
    assert _att._fast_plan(q[:1], *seq.args(), pos[500:501], nthreads=1)["kvspan"] == 1
    assert _att._fast_plan(q[:40], *seq.args(), pos[-40:], nthreads=1)["kvspan"] == 1
    full = attention_fast(q, *seq.args(), pos, 0.125, window, nthreads=2)
    for p in (511, 512, 1023, 1024, 1099):
        for nt in (1, 2, 3):
            one = attention_fast(
                q[p : p + 1], *seq.args(), pos[p : p + 1], 0.125, window, nthreads=nt
            )
            assert np.array_equal(one[0], full[p]), (p, nt)


@pytest.mark.parametrize("dtype", KV_DTYPES)
@pytest.mark.parametrize("window, nt", [(0, 2), (600, 2), (0, 3)])
def test_bound_fast_decode_split(variant, dtype, window, nt):
    """The graph-replayed fast attention (bind_attention_fast) of a decode step: its keys are
    split by chunk over the shares (kchunks sized for max_pos; only the items of chunks with
    keys count, and the folding one resets the shared counters for the next run), and each
    run's row equals attention_fast's, as the position moves over the chunks (and back),
    windowed too (the first chunks then hold no keys)."""
    from goinfer._kernels.graph import Graph

    rng = np.random.default_rng(21)
    n, H, n_kv, hd = 1600, 6, 2, 64
    seq = Seq(rng, n, n_kv, hd, 16, fill=np.nan, dtype=dtype)
    q = rng.standard_normal((n, H, hd)).astype(np.float32)
    qb, pos, out = q[700:701].copy(), np.array([700], np.int32), np.empty((1, H, hd), np.float32)
    per = _att.attention_scratch(
        qb, *seq.args(), pos, 0.125, window, out=out, nthreads=nt, max_pos=n - 1, fast=True
    )
    scratch = np.zeros((nt, per), np.float64)
    op = _att.bind_attention_fast(
        qb, *seq.args(), pos, 0.125, window, out=out, nthreads=nt, scratch=scratch, max_pos=n - 1
    )
    assert (
        op.nshares == nt
        and _att._fast_plan(qb, *seq.args(), np.array([n - 1], np.int32), nthreads=nt)["kchunks"]
        == 4
    )
    g = Graph([op], nt)
    for p in (700, 1599, 1024, 3, 1200, 1599, 511, 512, 1100):
        qb[:] = q[p]
        pos[0] = p
        g.run()
        want = attention_fast(q[p : p + 1], *seq.args(), pos, 0.125, window, nthreads=1)
        assert np.array_equal(out, want), p


# (n_kv, hd, window, threads, position, max_pos): decode steps of 2-8 kv heads (one group of
# items, or several when the kv-head span is smaller), windowed, over 2-3 shares
SHARE_CASES = [
    (2, 64, 0, 2, 1599, 1599),
    (2, 64, 0, 3, 1599, 1599),
    (2, 64, 0, 2, 1100, 4095),  # kchunks sized for max_pos: the chunks past 1100 hold no keys
    (2, 64, 700, 2, 2000, 4095),  # the first chunks hold no keys
    (8, 128, 0, 2, 2500, 4095),  # kv-head spans of 4: two groups
    (8, 128, 900, 3, 3000, 4095),
    (3, 64, 0, 3, 1030, 2047),  # a last chunk of 7 keys
]


@pytest.mark.parametrize("n_kv, hd, window, nt, p, max_pos", SHARE_CASES)
def test_bound_fast_shares_are_runs_of_chunks(n_kv, hd, window, nt, p, max_pos):
    """A bound split decode step gives each share a run of consecutive items (chunks of keys
    in (group, chunk) order) with nearly equal key counts: every item with keys exactly once,
    no item without keys, and each share's keys within one chunk (512) of an equal cut."""
    rng = np.random.default_rng(n_kv + window + nt)
    seq = Seq(rng, max_pos + 1, n_kv, hd, 16, dtype="f16")
    q = rng.standard_normal((1, 2 * n_kv, hd)).astype(np.float32)
    kchunks, n_items, shares = _att._fast_shares(
        q, *seq.args(), np.array([p], np.int32), window, nthreads=nt, max_pos=max_pos
    )
    assert kchunks == max_pos // 512 + 1 and len(shares) == nt  # split, sized for max_pos
    lo = max(0, p - window + 1) if window else 0
    chunks = range(lo // 512, p // 512 + 1)
    active = [g * kchunks + c for g in range(n_items // kchunks) for c in chunks]
    assert [it for sh in shares for it in sh] == active  # in order: runs, each item once

    def keys(it):
        c = it % kchunks
        return min(p, 512 * c + 511) - max(lo, 512 * c) + 1

    total = sum(keys(it) for it in active)
    for sh in shares:
        assert abs(sum(keys(it) for it in sh) - total / nt) <= 512, shares


def test_counters_count_each_kernel():
    from goinfer._kernels import attention_counters, reset_attention_counters

    rng = np.random.default_rng(5)
    seq = Seq(rng, 40, 2, 64, 16)
    q = rng.standard_normal((7, 4, 64)).astype(np.float32)
    q_pos = np.arange(33, 40, dtype=np.int32)
    reset_attention_counters()
    attention(q, *seq.args(), q_pos, 0.1)
    attention_fast(q[:3], *seq.args(), q_pos[:3], 0.1)
    attention_fast(q, *seq.args(), q_pos, 0.1)
    attention(q[:0], *seq.args(), q_pos[:0], 0.1)  # no query: not counted
    assert attention_counters() == {
        "exact_calls": 1,
        "exact_queries": 7,
        "fast_calls": 2,
        "fast_queries": 10,
    }
    reset_attention_counters()
    assert set(attention_counters().values()) == {0}


# ============================================================================ phase timers


@pytest.mark.parametrize("kernel", [attention, attention_fast])
def test_phase_timers_measure_without_changing_results(variant, kernel):
    """goinfer profile's split of attention into QK / softmax / AV: with the timers on, every
    phase of both kernels accumulates time and the outputs keep their bits; off, nothing is
    added."""
    from goinfer._kernels import attention_phase_seconds, attention_phase_timing

    rng = np.random.default_rng(5)
    T, H, n_kv, hd, bs = 200, 4, 2, 64, 16
    seq = Seq(rng, T, n_kv, hd, bs, kscale=2.0)
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    q_pos = np.arange(T, dtype=np.int32)
    plain = kernel(q, *seq.args(), q_pos, 0.125, nthreads=2)
    was = attention_phase_timing(True)
    try:
        attention_phase_seconds(reset=True)
        timed = kernel(q, *seq.args(), q_pos, 0.125, nthreads=2)
        phases = attention_phase_seconds(reset=True)
    finally:
        attention_phase_timing(was)
    assert np.array_equal(plain, timed)
    assert set(phases) == {"qk", "softmax", "av"} and all(v > 0 for v in phases.values()), phases
    kernel(q, *seq.args(), q_pos, 0.125, nthreads=2)
    assert sum(attention_phase_seconds().values()) == 0.0


# ============================================================================ attention sinks
#
# sinks (H,): a logit per query head that joins the softmax's denominator only (gpt-oss).
# Exact kernel: mx = max(max_j s_j, sink), l = sum_j e_j + trunc29(exp(sink - mx)); fast
# kernel: the sink folded last as one more chunk (m = sink log2 e, l = 1, o = 0).  -inf: none.


def _sinks(rng, H, kind):
    if kind == "none":
        return np.full(H, -np.inf, np.float32)
    s = (rng.standard_normal(H) * 3.0).astype(np.float32)
    if kind == "big":  # sinks that take most of the weight
        s += 40.0
    if kind == "mixed":
        s[::3] = -np.inf
    return s


@pytest.mark.parametrize("kind", ["random", "big", "mixed"])
@pytest.mark.parametrize(
    "T, H, n_kv, hd, bs, window, softcap, start, dtype",
    [c for c in CASES_DT if c[0] in (1, 7, 21, 40) or c[1] == 32],
)
@pytest.mark.parametrize("nthreads", [1, 2])
def test_attention_sinks_match_reference(
    variant, kind, T, H, n_kv, hd, bs, window, softcap, start, dtype, nthreads
):
    rng = np.random.default_rng(T * 1000 + H * 10 + hd + bs + start + len(kind))
    seq = Seq(rng, start + T, n_kv, hd, bs, kscale=2.0, dtype=dtype)
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    q_pos = np.arange(start, start + T, dtype=np.int32)
    sinks = _sinks(rng, H, kind)
    scale = 1.0 / np.sqrt(hd)
    got = attention(q, *seq.args(), q_pos, scale, window, softcap, nthreads=nthreads, sinks=sinks)
    ref = R.attention(q, *seq.args(), q_pos, scale, window, softcap, sinks=sinks)
    _check(got, ref, seq.v)
    fast = attention_fast(
        q, *seq.args(), q_pos, scale, window, softcap, nthreads=nthreads, sinks=sinks
    )
    if kind == "big":  # outputs near 0: cosine says nothing; absolute distance does
        assert np.abs(fast - ref).max() <= 1e-5 * np.abs(seq.v).max()
    else:
        _check_fast(fast, ref)
    plain = R.attention(q, *seq.args(), q_pos, scale, window, softcap)
    if kind != "mixed":  # the sinks really changed every row
        assert (np.abs(ref - plain).max(axis=-1) > 0).all()


def test_sinks_minus_inf_are_no_sinks(variant):
    """All -inf: bit for bit the kernel without sinks (exact and fast, split decode too)."""
    rng = np.random.default_rng(31)
    seq = Seq(rng, 1300, 2, 64, 16, fill=np.nan)
    q = rng.standard_normal((50, 6, 64)).astype(np.float32)
    pos = np.arange(1250, 1300, dtype=np.int32)
    none = np.full(6, -np.inf, np.float32)
    for kernel in (attention, attention_fast):
        for nt in (1, 2):
            assert np.array_equal(
                kernel(q, *seq.args(), pos, 0.125, 40, nthreads=nt, sinks=none),
                kernel(q, *seq.args(), pos, 0.125, 40, nthreads=nt),
            )
            assert np.array_equal(
                kernel(q[-1:], *seq.args(), pos[-1:], 0.125, nthreads=nt, sinks=none),
                kernel(q[-1:], *seq.args(), pos[-1:], 0.125, nthreads=nt),
            )


@pytest.mark.parametrize("dtype", KV_DTYPES)
def test_sinks_prefill_equals_decode(variant, dtype):
    """With sinks: prefill == single-query steps (exact, bit for bit); the fast kernel's split
    decode step == its prefill rows (around the 512-key chunk boundaries); 1/2/3 threads."""
    rng = np.random.default_rng(41)
    n, H, n_kv, hd = 1100, 6, 2, 64
    seq = Seq(rng, n, n_kv, hd, 16, fill=np.nan, dtype=dtype)
    q = rng.standard_normal((n, H, hd)).astype(np.float32)
    pos = np.arange(n, dtype=np.int32)
    assert _att._fast_plan(q[:1], *seq.args(), pos[-1:], nthreads=2)["kchunks"] > 1
    sinks = _sinks(rng, H, "random")
    full = attention(q[:60], *seq.args(), pos[:60], 0.125, 8, nthreads=2, sinks=sinks)
    for t in range(60):
        one = attention(
            q[t : t + 1],
            seq.k_cache,
            seq.v_cache,
            seq.block_table[: t // 16 + 1],
            pos[t : t + 1],
            0.125,
            8,
            nthreads=1 + t % 2,
            sinks=sinks,
        )
        assert np.array_equal(one[0], full[t]), t
    ffull = attention_fast(q, *seq.args(), pos, 0.125, nthreads=2, sinks=sinks)
    for p in (511, 512, 1023, 1024, 1099):
        for nt in (1, 2, 3):
            one = attention_fast(
                q[p : p + 1], *seq.args(), pos[p : p + 1], 0.125, nthreads=nt, sinks=sinks
            )
            assert np.array_equal(one[0], ffull[p]), (p, nt)


@pytest.mark.parametrize("offset", range(8))
def test_bound_scratch_at_any_alignment(variant, offset):
    """A bound op's scratch is the caller's buffer at any 8-byte offset from a cache line (a
    NumPy array is aligned to 16 bytes only): each run aligns it to 64 bytes inside the size
    attention_scratch gave, writes nothing past it (a NaN sentinel stays) and computes the
    call's bits, for both kernels, a decode step with its keys split and kv heads spanned."""
    from goinfer._kernels.graph import Graph

    rng = np.random.default_rng(61)
    n, H, n_kv = 1300, 8, 4
    seq = Seq(rng, n, n_kv, 64, 16, fill=np.nan, dtype="f16")
    q = rng.standard_normal((1, H, 64)).astype(np.float32)
    pos = np.array([n - 1], np.int32)
    for fast, bind, kernel in (
        (False, _att.bind_attention, attention),
        (True, _att.bind_attention_fast, attention_fast),
    ):
        out = np.empty((1, H, 64), np.float32)
        kw = dict(out=out, nthreads=1, max_pos=n - 1)
        per = _att.attention_scratch(q, *seq.args(), pos, 0.125, fast=fast, **kw)
        raw = np.full(per + 64, np.nan)  # 8-byte aligned at least
        start = (-(raw.ctypes.data // 8) % 8 + offset) % 8  # the row starts `offset` past a line
        scratch = raw[start : start + per].reshape(1, per)
        Graph([bind(q, *seq.args(), pos, 0.125, scratch=scratch, **kw)], 1).run()
        assert np.isnan(raw[start + per :]).all()
        assert np.array_equal(out, kernel(q, *seq.args(), pos, 0.125)), fast


@pytest.mark.parametrize("dtype", KV_DTYPES)
def test_bound_attention_with_sinks(dtype):
    """bind_attention / bind_attention_fast carry the sinks: each graph run (the fast one's
    decode keys split by chunk over the shares) equals the call, as the position moves."""
    from goinfer._kernels.graph import Graph

    rng = np.random.default_rng(51)
    n, H = 1300, 6
    seq = Seq(rng, n, 2, 64, 16, fill=np.nan, dtype=dtype)
    q = rng.standard_normal((n, H, 64)).astype(np.float32)
    sinks = _sinks(rng, H, "random")
    for fast, bind, kernel in (
        (False, _att.bind_attention, attention),
        (True, _att.bind_attention_fast, attention_fast),
    ):
        qb, pos, out = (
            q[850:851].copy(),
            np.array([850], np.int32),
            np.empty((1, H, 64), np.float32),
        )
        per = _att.attention_scratch(
            qb, *seq.args(), pos, 0.125, out=out, nthreads=2, max_pos=n - 1, fast=fast, sinks=sinks
        )
        op = bind(
            qb,
            *seq.args(),
            pos,
            0.125,
            out=out,
            nthreads=2,
            scratch=np.zeros((2, per), np.float64),
            max_pos=n - 1,
            sinks=sinks,
        )
        g = Graph([op], 2)
        for p in (850, 1299, 3, 1024, 600):
            qb[:] = q[p]
            pos[0] = p
            g.run()
            assert np.array_equal(
                out, kernel(q[p : p + 1], *seq.args(), pos, 0.125, sinks=sinks)
            ), p
            assert not np.array_equal(out, kernel(q[p : p + 1], *seq.args(), pos, 0.125)), p


def test_sinks_errors():
    rng = np.random.default_rng(61)
    seq = Seq(rng, 40, 2, 64, 16)
    q = rng.standard_normal((3, 4, 64)).astype(np.float32)
    pos = np.arange(37, 40, dtype=np.int32)
    for kernel in (attention, attention_fast):
        for bad, exc in (
            (np.zeros(3, np.float32), ValueError),
            (np.zeros(4, np.float64), TypeError),
            (np.array([0, np.nan, 0, 0], np.float32), ValueError),
            (np.array([0, np.inf, 0, 0], np.float32), ValueError),
            (np.zeros((4, 1), np.float32), ValueError),
        ):
            with pytest.raises(exc):
                kernel(q, *seq.args(), pos, 0.125, sinks=bad)
