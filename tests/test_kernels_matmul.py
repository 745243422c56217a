"""Compiled matmul kernels (quantize_act, matmul, get_rows) against goinfer._reference.

Three levels of checks, on every ISA variant the CPU supports and with 1, 2, 3 and 7 threads:

1. Bit-exact: the kernels implement a fixed float32 operation sequence per output element
   (docs/design/kernels.md).  `emulate_matmul` below replays that sequence in NumPy with a
   correctly rounded fmaf (float64 + round-to-odd), so kernel output == emulation bit for bit.
   This implies the cross-checks the contract promises, which are also asserted directly:
   GEMM row m == GEMV of row m alone, 1 thread == 2, 3, 7 threads, variants equal each other.
2. Tolerance vs the float64 reference (_reference.matmul): see `tolerance`.
3. Errors: wrong dtypes / shapes / layouts raise TypeError / ValueError / IndexError.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import goinfer
import goinfer._kernels  # noqa: F401  (registers the submodule)
from goinfer import _reference as ref
from goinfer._kernels import _config
from goinfer.quant import (
    FLOAT_KINDS,
    GROUP,
    INT_KINDS,
    K_KINDS,
    KINDS,
    MXFP4_VALUES,
    QK_K,
    QAct,
    QWeight,
    codes,
    e8m0_half,
    pack_mxfp4,
    pack_q4,
    pack_q5,
    pack_q6k,
    pack_q8,
    pack_qk,
    pack_scale_min,
    q6k_codes,
    qk_codes,
    quantize_weight,
)

# the package re-exports the function `matmul`, which shadows the submodule attribute
K = sys.modules["goinfer._kernels.matmul"]
# every ISA variant of this machine; the avx2 variant with and without AVX-VNNI where the CPU
# has it ("avx2+avxvnni": the avx2 variant's second matmul table, the same bits)
VARIANTS = _config.supported_variants() + (("avx2+avxvnni",) if _config.avxvnni_supported() else ())
THREADS = (1, 2, 3, 7)  # 7: more threads than cores, row blocks or activation tiles
U = 2.0**-24  # float32 unit roundoff


@contextlib.contextmanager
def variant(name):
    base, vnni = name.removesuffix("+avxvnni"), name.endswith("+avxvnni")
    old = _config.variant()
    old_vnni = _config.set_avxvnni(vnni) if _config.avxvnni_supported() else None
    _config.set_variant(base)
    # the switch reached the kernel tables
    assert K._variant_used() == base and K._avxvnni_used() == vnni
    try:
        yield
    finally:
        _config.set_variant(old)
        if old_vnni is not None:
            _config.set_avxvnni(old_vnni)


@pytest.fixture(autouse=True)
def _force_threads():
    """Small test shapes would otherwise run on one thread (work threshold); split them anyway."""
    old = K._set_min_ns_per_thread(0)
    yield
    K._set_min_ns_per_thread(old)


@pytest.mark.parametrize("v", VARIANTS)
def test_dispatch_follows_config(v):
    """Forcing a variant switches the kernel table matmul calls (the variants give the same
    bits by contract, so the outputs alone could not tell)."""
    with variant(v):
        assert K._variant_used() == v.removesuffix("+avxvnni") == _config.variant()
        assert _config.avxvnni_in_use() == v.endswith("+avxvnni")
    assert K._variant_used() == _config.variant()


def test_avxvnni_setting():
    """AVX-VNNI (the avx2 variant's int matmuls): on by default where supported, off with
    GOINFER_AVXVNNI=0 at start; set_avxvnni switches the table matmul calls; turning it on
    where unsupported raises.  goinfer.config() and `goinfer config` report it."""
    code = (
        "import io, goinfer; from goinfer._kernels import _config; _config.set_variant('avx2')\n"
        "out = io.StringIO(); goinfer.show_config(out)\n"
        "print(_config.avxvnni_supported(), _config.avxvnni_in_use(), goinfer.config()['avxvnni'],"
        " 'AVX-VNNI       : on' in out.getvalue())"
    )
    if "avx2" not in _config.supported_variants():
        pytest.skip("no avx2 variant on this CPU")
    for env, on in ((None, True), ("0", False), ("1", True)):
        e = {k: v for k, v in os.environ.items() if k != "GOINFER_AVXVNNI"}
        if env is not None:
            e["GOINFER_AVXVNNI"] = env
        out = subprocess.run(
            [sys.executable, "-c", code], env=e, capture_output=True, text=True, check=True
        ).stdout.split()
        supported = out[0] == "True"
        assert out[1:] == [str(on and supported)] * 3, (env, out)
    if not _config.avxvnni_supported():
        with pytest.raises(RuntimeError, match="AVX-VNNI is not supported"):
            _config.set_avxvnni(True)
        return
    with variant("avx2"):
        assert not K._avxvnni_used()
        assert _config.set_avxvnni(True) is False
        assert K._avxvnni_used() and K._variant_used() == "avx2"
        assert _config.dispatch_key() == ("avx2", False, True)


@pytest.mark.parametrize("probe", ["_int8_peak", "_fma_peak", "_f16_fma_peak"])
@pytest.mark.parametrize("v", VARIANTS)
def test_peak_probes(v, probe):
    """The benchmarks' measured int8, float32 FMA and f16 attention mix peaks
    (kernels_matmul.int8_peak, fma_peak, f16_fma_peak): a finite rate above 1 G operations/s
    for the SIMD variants on one and two threads, none (0.0) for the portable build.  No speed
    is asserted beyond that: the best of 3 probes of 5 ms each, so that one stall of a shared
    host's thread inside a probe cannot fail it."""
    peak = getattr(K, probe)
    with variant(v):
        one = max(peak(1, min_time=0.005) for _ in range(3))
        if v == "portable":
            assert one == 0.0
            return
        assert np.isfinite(one) and one > 1e9  # above 1 G/s: any SIMD core since 2013
        two = max(peak(2, min_time=0.005) for _ in range(3))
        assert np.isfinite(two) and two > 1e9


# ============================================================================ exact emulation


def fmaf(a, b, c):
    """Correctly rounded float32 a*b + c (finite inputs, no overflow).

    a*b is exact in float64 (48-bit product); p + c is rounded to float64 with round-to-odd
    (TwoSum gives the exact error), and rounding a round-to-odd 53-bit value to 24 bits is
    the correct rounding of the exact value."""
    p = np.asarray(a, np.float64) * np.asarray(b, np.float64)
    c = np.asarray(c, np.float64)
    s = p + c
    bp = s - p
    e = (p - (s - bp)) + (c - bp)
    fix = (e != 0) & ((s.view(np.int64) & 1) == 0)
    s = np.where(fix, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def unpack_int(w: QWeight):
    """QWeight of an int kind -> q (n_out, K) int64 (nibbles, 5-bit codes, int8, or mxfp4's
    integer values MXFP4_VALUES[code]), d, m (n_out, G) float32 (mxfp4: d = 2^(e-128))."""
    n_rb, G = w.qs.shape[:2]
    if w.kind == "q8_0":
        q = w.qs.view(np.int8).reshape(n_rb, G, 8, 16, 4).transpose(0, 3, 1, 2, 4)
        q = q.reshape(n_rb * 16, G * 32)
    elif w.kind in ("q5_0", "q5_1"):  # (quant.codes: tested against gguf-py in test_quant_q5)
        q = np.zeros((n_rb * 16, G * 32), np.uint8)
        q[: w.n_out] = codes(w)
    else:
        b = w.qs.reshape(n_rb, G, 4, 16, 4).transpose(0, 3, 1, 2, 4).reshape(n_rb * 16, G, 16)
        q = np.concatenate([b & 15, b >> 4], axis=2).reshape(n_rb * 16, G * 32)
        if w.kind == "mxfp4":
            q = MXFP4_VALUES[q.astype(np.int64)]
    d = w.d.transpose(0, 2, 1).reshape(n_rb * 16, G)
    d = e8m0_half(d) if w.kind == "mxfp4" else d.astype(np.float32)
    m = None if w.m is None else w.m.transpose(0, 2, 1).reshape(n_rb * 16, G).astype(np.float32)
    n = w.n_out
    return q[:n].astype(np.int64), d[:n], (None if m is None else m[:n])


def emulate_matmul(x, w: QWeight) -> np.ndarray:
    """The contract's per-element float32 sequence, replayed exactly."""
    if w.kind == "q6_k":  # isum = sum_k sc[k/16]*(q-32)*qa; d of the group's super-block
        q, sc, d = q6k_codes(w)
        q = q.astype(np.int64) - 32
        sc = sc.astype(np.int64)
        qa = x.qa.astype(np.int64)
        acc = np.zeros((x.qa.shape[0], w.n_out), np.float32)
        for g in range(w.n_in // GROUP):
            lo, hi = slice(g * GROUP, g * GROUP + 16), slice(g * GROUP + 16, (g + 1) * GROUP)
            isum = (qa[:, lo] @ q[:, lo].T) * sc[None, :, 2 * g] + (qa[:, hi] @ q[:, hi].T) * sc[
                None, :, 2 * g + 1
            ]
            assert np.abs(isum).max(initial=0) < 2**24  # exact in float32
            acc = fmaf(
                isum.astype(np.float32),
                d[None, :, g // 8].astype(np.float32) * x.da[:, g, None],
                acc,
            )
        return acc
    if w.kind in ("q4_k", "q5_k"):  # isum of the codes; fmaf(isum, (d*sc)*da); fmaf(-(dmin*mn), sa)
        q, sc, mn, d, dmin = qk_codes(w)
        qa = x.qa.astype(np.int64)
        acc = np.zeros((x.qa.shape[0], w.n_out), np.float32)
        for g in range(w.n_in // GROUP):
            sl = slice(g * GROUP, (g + 1) * GROUP)
            isum = qa[:, sl] @ q[:, sl].T.astype(np.int64)
            ds = d[:, g // 8].astype(np.float32) * sc[:, g].astype(np.float32)  # exact
            dm = dmin[:, g // 8].astype(np.float32) * mn[:, g].astype(np.float32)  # exact
            acc = fmaf(isum.astype(np.float32), ds[None, :] * x.da[:, g, None], acc)
            acc = fmaf(-dm[None, :], x.sa[:, g, None], acc)
        return acc
    if w.kind in FLOAT_KINDS:
        wd = ref.dequantize(w)  # exact float32 weights (n_out, K)
        acc = np.zeros((x.shape[0], w.n_out), np.float32)
        for k in range(w.n_in):
            acc = fmaf(wd[None, :, k], x[:, k, None], acc)
        return acc
    q, d, mn = unpack_int(w)
    M, Kd = x.qa.shape
    qa = x.qa.astype(np.int64)
    acc = np.zeros((M, w.n_out), np.float32)
    for g in range(Kd // GROUP):
        sl = slice(g * GROUP, (g + 1) * GROUP)
        isum = qa[:, sl] @ q[:, sl].T  # exact (M, n_out)
        if w.kind in ("q4_0", "q5_0"):
            isum = isum - (8 if w.kind == "q4_0" else 16) * x.asum[:, g, None].astype(np.int64)
        dd = d[None, :, g] * x.da[:, g, None]  # float32 product
        acc = fmaf(isum.astype(np.float32), dd, acc)
        if w.kind in ("q4_1", "q5_1"):
            acc = fmaf(mn[None, :, g], x.sa[:, g, None], acc)
    return acc


def tolerance(x, w: QWeight, xd: np.ndarray) -> np.ndarray:
    """Bound on |kernel - float64 reference| per element.

    The kernel is a chain of n float32 fmas (n = K for float kinds, G = K/32 for int kinds,
    2G for q4_1); by the standard bound for recursive summation its rounding error is at most
    gamma_n * S with S = sum_k |w[n,k]| |x[m,k]|, gamma_n ~ n*u.  Int kinds add a few more
    roundings of the same size per term: d*da, sa = da*asum, and the reference's own float32
    dequantization of x (qa*da) and of q4_1 weights (q*d + m); plus the final rounding of the
    reference to float32.  So |err| <= (n + 8) * u * S, and a tiny absolute slack for
    underflowed (subnormal) terms: a subnormal d*da is off by up to 2^-150 absolute, which the
    exact integer sum (|isum| <= 32*128*127) multiplies."""
    wd = ref.dequantize(w).astype(np.float64)
    S = np.abs(xd) @ np.abs(wd).T
    n = (
        w.n_in
        if w.kind in FLOAT_KINDS
        else (w.n_in // GROUP) * (2 if w.kind in ("q4_1", "q4_k", "q5_k", "q5_1") else 1)
    )
    isum_max = (
        1 if w.kind in FLOAT_KINDS else 32 * 32 * 127 * 128 if w.kind == "q6_k" else 32 * 128 * 127
    )
    return (n + 8) * U * S + (n + 8) * isum_max * 2.0**-149


def kdim(kind, Kd):
    """Kd for a kind: the k-quants need whole super-blocks of 256 (rounded up)."""
    return -(-Kd // QK_K) * QK_K if kind in K_KINDS else Kd


def make_weight(rng, kind, n_out, n_in, scale=1.0, raw=False):
    """Random weight of a kind; raw=True fills every field with random bits in range."""
    if not raw or kind in FLOAT_KINDS:
        W = (rng.standard_normal((n_out, n_in)) * scale).astype(np.float32)
        if n_out and n_in >= GROUP:  # one all-zero group
            W[rng.integers(n_out), :GROUP] = 0
        return quantize_weight(W, kind)
    G = n_in // GROUP
    if kind == "q6_k":  # codes 0..63, int8 scales incl. -128, a few codes at the extremes
        q = rng.integers(0, 64, (n_out, n_in)).astype(np.uint8)
        q.flat[:4] = [0, 63, 0, 63][: q.size]
        sc = rng.integers(-128, 128, (n_out, n_in // 16)).astype(np.int8)
        sc.flat[:2] = [-128, 127][: sc.size]
        return pack_q6k(
            q, sc, (rng.uniform(-1, 1, (n_out, n_in // QK_K)) * scale).astype(np.float16)
        )
    if kind in ("q4_k", "q5_k"):  # every code, 6-bit scale and min (0 and 63 included), d, dmin
        nb = n_in // QK_K
        q = rng.integers(0, 16 if kind == "q4_k" else 32, (n_out, n_in)).astype(np.uint8)
        q.flat[:2] = [0, 15 if kind == "q4_k" else 31][: q.size]
        sc, mn = rng.integers(0, 64, (2, n_out, nb, 8)).astype(np.uint8)
        sc.flat[:2], mn.flat[:2] = [0, 63][: sc.size], [63, 0][: mn.size]
        dd = (rng.uniform(-1, 1, (2, n_out, nb)) * scale).astype(np.float16)
        return pack_qk(kind, q, pack_scale_min(sc, mn), dd[0], dd[1])
    if kind == "mxfp4":  # exponents around 2^(log2 scale), a few at the extremes
        e = np.clip(np.rint(np.log2(scale)) + 128 + rng.integers(-20, 20, (n_out, G)), 0, 255)
        e.flat[:3] = [0, 1, 2][: e.size]
        return pack_mxfp4(rng.integers(0, 16, (n_out, n_in)).astype(np.uint8), e.astype(np.uint8))
    d = (rng.uniform(-1, 1, (n_out, G)) * scale).astype(np.float16)
    if kind in ("q5_0", "q5_1"):  # every code 0..31 (both ends included), d [, m]
        q = rng.integers(0, 32, (n_out, n_in)).astype(np.uint8)
        q.flat[:2] = [0, 31][: q.size]
        mn = (rng.uniform(-1, 1, (n_out, G)) * scale).astype(np.float16) if kind == "q5_1" else None
        return pack_q5(kind, q, d, mn)
    if kind == "q8_0":
        return pack_q8(rng.integers(-128, 128, (n_out, n_in)).astype(np.int8), d)
    q = rng.integers(0, 16, (n_out, n_in)).astype(np.uint8)
    mn = (rng.uniform(-1, 1, (n_out, G)) * scale).astype(np.float16) if kind == "q4_1" else None
    return pack_q4(kind, q, d, mn)


def make_x(rng, M, n_in, scale=1.0):
    x = (rng.standard_normal((M, n_in)) * scale).astype(np.float32)
    if M and n_in >= 2 * GROUP:
        x[rng.integers(M), GROUP : 2 * GROUP] = 0  # an all-zero activation group
    return x


@contextlib.contextmanager
def swapped(setter, value):
    """setter(value) for the block, then setter(what it returned): a kernel setting swapped."""
    old = setter(value)
    try:
        yield
    finally:
        setter(old)


def shares_per_thread(n):
    return swapped(K._set_shares_per_thread, n)


def run_all(x, w):
    """matmul on every variant, thread count and GEMM tiles per thread (one share each, or
    several claimed as the threads go) -> {(variant, nthreads, tiles per thread): out}."""
    res = {}
    for v in VARIANTS:
        with variant(v):
            xin = K.quantize_act(x) if w.kind in INT_KINDS else x
            for nt in THREADS:
                for spt in (1, 4) if nt > 1 else (1,):
                    with shares_per_thread(spt):
                        res[(v, nt, spt)] = K.matmul(xin, w, nthreads=nt)
    return res


def check_matmul(x, w, check_rows=True):
    xq = ref.quantize_act(x)
    xin = xq if w.kind in INT_KINDS else x
    exact = emulate_matmul(xin, w)
    outs = run_all(x, w)
    first = next(iter(outs.values()))
    for key, o in outs.items():
        assert o.shape == (x.shape[0], w.n_out) and o.dtype == np.float32
        assert np.array_equal(o, first), f"{key} differs from {next(iter(outs))}"
        assert np.array_equal(o, exact), f"{key}: not the contract's bits"
    # against the float64 reference
    xd = ref.dequantize_act(xq) if w.kind in INT_KINDS else x
    r = ref.matmul(xin, w).astype(np.float64)
    err = np.abs(first.astype(np.float64) - r)
    tol = tolerance(xin, w, xd)
    assert np.all(err <= tol), f"max err/tol {np.max(err / np.maximum(tol, 1e-300))}"
    # GEMM row m == GEMV of that row alone
    if check_rows:
        for v in VARIANTS:
            with variant(v):
                for m in range(x.shape[0]):
                    xm = x[m : m + 1]
                    xin_m = K.quantize_act(xm) if w.kind in INT_KINDS else xm
                    assert np.array_equal(K.matmul(xin_m, w, nthreads=1)[0], first[m]), (v, m)
    return first


# ============================================================================ quantize_act


def assert_qact_equal(a: QAct, b: QAct):
    assert np.array_equal(a.qa, b.qa)
    assert np.array_equal(a.da.view(np.uint32), b.da.view(np.uint32))
    assert np.array_equal(a.asum, b.asum)
    assert np.array_equal(a.sa.view(np.uint32), b.sa.view(np.uint32))


@pytest.mark.parametrize("M,Kd", [(1, 32), (3, 64), (17, 576), (70, 2048), (5, 1536)])
def test_quantize_act_bit_exact(M, Kd):
    rng = np.random.default_rng(M * 1000 + Kd)
    x = make_x(rng, M, Kd)
    x[0, :8] = [0.5, -0.5, 1.5, 2.5, -2.5, 1e-30, -1e30, 3.0]  # ties and extreme magnitudes
    want = ref.quantize_act(x)
    for v in VARIANTS:
        with variant(v):
            for nt in THREADS:
                assert_qact_equal(K.quantize_act(x, nthreads=nt), want)


def test_quantize_act_out_is_filled_in_place():
    rng = np.random.default_rng(1)
    x = make_x(rng, 4, 96)
    buf = QAct.empty(10, 96)
    got = K.quantize_act(x, buf.rows(4), nthreads=2)
    assert got.qa.base is buf.qa
    assert_qact_equal(got, ref.quantize_act(x))
    assert not buf.qa[4:].any()


finite_f32 = st.floats(allow_nan=False, allow_infinity=False, width=32)


# groups of tiny values overflow 127/amax to inf in the reference too (then 0*inf -> q = 0)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 5), st.integers(1, 6), st.data())
def test_quantize_act_property(M, G, data):
    """Random values incl. zero groups, ties (k + 0.5 after scaling), subnormals, huge values."""
    kind = data.draw(st.sampled_from(["any", "small_ints", "scaled"]))
    if kind == "any":
        vals = data.draw(st.lists(finite_f32, min_size=M * G * 32, max_size=M * G * 32))
        x = np.array(vals, np.float32).reshape(M, G * 32)
    elif kind == "small_ints":  # amax = 127 * 2^e, so x * (127/amax) hits exact .5 ties
        e = data.draw(st.integers(-140, 100))
        ints = data.draw(st.lists(st.integers(-254, 254), min_size=M * G * 32, max_size=M * G * 32))
        x = (np.array(ints, np.float64).reshape(M, G * 32) / 2 * 2.0**e).astype(np.float32)
        x[:, ::32] = np.float32(127 * 2.0**e)
    else:
        scale = data.draw(st.sampled_from([1e-38, 1e-30, 1e-3, 1.0, 1e10, 1e35]))
        rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
        x = (rng.standard_normal((M, G * 32)) * scale).astype(np.float32)
    if data.draw(st.booleans()):
        x[:, :32] = 0.0
    want = ref.quantize_act(x)
    for v in VARIANTS:
        with variant(v):
            assert_qact_equal(K.quantize_act(x, nthreads=data.draw(st.sampled_from(THREADS))), want)


# ============================================================================ quantize_gated

OPS = importlib.import_module("goinfer._kernels.ops")


def gated_halves(rng, M, F):
    """gate, up: the column halves of one (M, 2F) buffer (as the FFN passes them), with a zero
    group, a group of tiny values and large ones."""
    gu = (rng.standard_normal((M, 2 * F)) * 4).astype(np.float32)
    gu[0, :32] = 0.0
    gu[-1, F - 32 : F] *= np.float32(1e-30)
    gu[0, F : F + 4] = [60.0, -60.0, 1e20, -1e20]
    return gu[:, :F], gu[:, F:]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_mul"])
@pytest.mark.parametrize("M,F", [(1, 32), (1, 65536), (3, 64), (17, 576), (70, 2048)])
def test_quantize_gated_is_quantize_act_of_the_product(act, M, F):
    """The bits of quantize_act(act(gate, up)) on every variant and thread count ((1, 65536):
    one row split by groups across threads), and within one quantization step of the NumPy
    reference's float64 product."""
    rng = np.random.default_rng(M * 7 + F)
    gate, up = gated_halves(rng, M, F)
    want = ref.quantize_gated(gate, up, act)
    for v in VARIANTS:
        with variant(v):
            for nt in THREADS:
                got = K.quantize_gated(gate, up, act, nthreads=nt)
                f = getattr(OPS, act)(gate, up, nthreads=nt)
                assert_qact_equal(got, K.quantize_act(f, nthreads=nt))
            deq, deq_ref = ref.dequantize_act(got), ref.dequantize_act(want)
            step = np.repeat(np.maximum(got.da, want.da), 32, axis=1)
            assert (np.abs(deq - deq_ref) <= 1.01 * step + 1e-37).all(), (v, act)


def test_quantize_gated_out_and_errors():
    rng = np.random.default_rng(2)
    gate, up = gated_halves(rng, 4, 96)
    buf = QAct.empty(10, 96)
    got = K.quantize_gated(gate, up, out=buf.rows(4), nthreads=2)
    assert got.qa.base is buf.qa and not buf.qa[4:].any()
    assert_qact_equal(got, K.quantize_act(OPS.swiglu(gate, up)))
    with pytest.raises(ValueError, match="act must be one of"):
        K.quantize_gated(gate, up, "relu")
    with pytest.raises(ValueError, match="same shape"):
        K.quantize_gated(gate, up[:3])
    with pytest.raises(ValueError, match="divisible by 32"):
        K.quantize_gated(gate[:, :40], up[:, :40])
    with pytest.raises(ValueError, match="rows"):
        K.quantize_gated(gate, up, out=QAct.empty(5, 96))
    with pytest.raises(ValueError, match="needs out"):
        K.bind_quantize_gated(gate, up, "swiglu", None)
    with pytest.raises(ValueError, match="act must be one of"):
        ref.quantize_gated(gate, up, "relu")


@pytest.mark.parametrize("act", ["swiglu", "gelu_tanh_mul"])
@pytest.mark.parametrize("M, F, nt", [(37, 192, 1), (37, 192, 2), (1, 65536, 2)])
def test_bind_quantize_gated(act, M, F, nt):
    """Bound into rows [3, 3 + M) of a larger QAct and run by a Graph: the bits of the Python
    call, nothing outside those rows written; replayed after new inputs: the new product."""
    rng = np.random.default_rng(M + F)
    gu = np.empty((M, 2 * F), np.float32)
    qbuf = qact_buffer(M + 6, F)
    q = qact_rows(qbuf, 3, 3 + M)
    op = K.bind_quantize_gated(gu[:, :F], gu[:, F:], act, q, nthreads=nt)
    g = GRAPH.Graph([op], nt)
    for _ in range(2):
        gate, up = gated_halves(rng, M, F)
        gu[:, :F], gu[:, F:] = gate, up
        g.run()
        assert_qact_equal(q, K.quantize_gated(gate, up, act))
        assert_qact_equal(qact_rows(qbuf, 0, 3), qact_buffer(3, F))
        assert_qact_equal(qact_rows(qbuf, 3 + M, M + 6), qact_buffer(3, F))


# ============================================================================ matmul

# (M, n_out, K): n_out not multiples of 16, M around the microkernel tile sizes
# (AVX-512 GEMM tiles 6 rows x 2 row blocks, AVX2 4 (tiles of 2..4 rows), float 12 / 6; GEMV 4
# row blocks at a time).
SHAPES = [
    (1, 1, 32),
    (1, 40, 64),
    (1, 65, 96),
    (1, 200, 576),
    (2, 17, 64),
    (3, 33, 128),
    (4, 16, 32),
    (5, 100, 96),
    (6, 48, 64),
    (11, 31, 160),
    (12, 64, 64),
    (13, 129, 96),
    (16, 15, 256),
    (24, 70, 64),
    (25, 50, 128),
    (37, 19, 96),
    (70, 45, 64),
]
BIG_SHAPES = [(9, 41, 2048), (1, 300, 1536), (64, 24, 576)]


@pytest.mark.parametrize("kind", INT_KINDS)
@pytest.mark.parametrize("M,n_out,Kd", SHAPES + BIG_SHAPES)
def test_matmul_int(kind, M, n_out, Kd):
    rng = np.random.default_rng(hash((kind, M, n_out, Kd)) % 2**32)
    Kd = kdim(kind, Kd)
    check_matmul(
        make_x(rng, M, Kd), make_weight(rng, kind, n_out, Kd, raw=M % 2 == 0), check_rows=M <= 40
    )


@pytest.mark.parametrize("kind", FLOAT_KINDS)
@pytest.mark.parametrize("M,n_out,Kd", SHAPES[::2] + [(13, 40, 1024), (2, 100, 512)])
def test_matmul_float(kind, M, n_out, Kd):
    rng = np.random.default_rng(hash((kind, M, n_out, Kd)) % 2**32)
    check_matmul(make_x(rng, M, Kd), make_weight(rng, kind, n_out, Kd), check_rows=M <= 16)


def test_matmul_int_cache_blocking():
    """Enough row blocks that the GEMM walks several L2 chunks of the weight."""
    rng = np.random.default_rng(7)
    check_matmul(make_x(rng, 14, 2048), make_weight(rng, "q4_1", 600, 2048), check_rows=False)


@pytest.mark.parametrize("kind", INT_KINDS)
def test_matmul_int_activation_blocks(kind):
    """Several activation blocks of the AVX-512 GEMM (768 KB of int8 rows each: 96 rows at
    K = 8192, so M = 101 is blocks of 96 and 5 rows), with what it computes once per block (the
    q6_k low-half sums) indexed from the block's first row.  Contract bits."""
    rng = np.random.default_rng(23)
    check_matmul(
        make_x(rng, 101, 8192), make_weight(rng, kind, 40, 8192, raw=True), check_rows=False
    )


@pytest.mark.parametrize("kind", INT_KINDS)
@pytest.mark.parametrize("M", [7, 33])
def test_matmul_int_k_blocks(kind, M):
    """The AVX2 GEMM's blocking: K blocks of 64 groups (130 groups: 64 + 64 + 2, the
    accumulators carried through `out`), chunks of row blocks (18 row blocks, the last one 5
    columns wide), activation tiles of 3 and 4 rows; M = 7: q4 nibbles unpacked in registers,
    M = 33 (9 tiles): unpacked once per chunk and K block.  Contract bits, GEMV rows."""
    rng = np.random.default_rng(11 + M)
    Kd = kdim(kind, 4160)  # q6_k: 4352 = 136 groups
    check_matmul(make_x(rng, M, Kd), make_weight(rng, kind, 277, Kd, raw=True), check_rows=True)


@pytest.mark.parametrize("kind", INT_KINDS + FLOAT_KINDS)
def test_gemv_tail_shares_keep_bits(kind):
    """A GEMV of enough row blocks is cut into one long share per thread and small tail shares
    claimed as the threads finish (matmul.pyx).  1813 rows (114 row blocks, the last 5 rows
    wide) on 1, 2, 3 and 7 threads: the contract's bits with the tail shares and without."""
    rng = np.random.default_rng(41)
    Kd = kdim(kind, 256)
    w = make_weight(rng, kind, 1813, Kd, raw=True)
    x = make_x(rng, 1, Kd)
    xin = K.quantize_act(x) if kind in INT_KINDS else x

    def shares(nt):
        return K.bind_matmul(xin, w, np.empty((1, 1813), np.float32), nthreads=nt).nshares

    assert (shares(2), shares(7)) == (2 + 2 * 2, 7 + 2 * 7)  # 114 >= 16 row blocks x 7
    first = check_matmul(x, w, check_rows=False)
    with swapped(K._set_gemv_tail_shares, 0):
        assert (shares(2), shares(7)) == (2, 7)
        assert np.array_equal(check_matmul(x, w, check_rows=False), first)


def gemv_prefetch(groups):
    return swapped(_config.set_gemv_prefetch, groups)


def gemv_prefetch_far(groups):
    return swapped(_config.set_gemv_prefetch_far, groups)


@pytest.mark.parametrize("kind", INT_KINDS)
@pytest.mark.parametrize("pf,far", [(0, 0), (1, 0), (8, 0), (64, 0), (0, 1), (8, 128), (64, 1024)])
def test_gemv_prefetch_distance_keeps_bits(kind, pf, far):
    """The GEMV's software prefetches, near and far (off by default on some CPUs, so the suite's
    other GEMV tests may never run them), read ahead in every weight stream of every kind; at
    any distances, far past the end of a weight included, the results are the contract's
    bits."""
    rng = np.random.default_rng(31 + pf + far)
    Kd = kdim(kind, 768)  # 24 groups (q6_k, q4_k, q5_k: 3 super-blocks)
    w = make_weight(rng, kind, 83, Kd, raw=True)
    with gemv_prefetch(pf), gemv_prefetch_far(far):
        check_matmul(make_x(rng, 1, Kd), w, check_rows=False)


def gemv_streams(n):
    return swapped(_config.set_gemv_streams, n)


@pytest.mark.parametrize("kind", INT_KINDS)
@pytest.mark.parametrize("streams", [1, 2, 3, 4])
def test_gemv_streams_keep_bits(kind, streams):
    """The decode GEMV reads 1..4 row blocks per call, each its own stream (the default depends
    on the CPU, so the suite's other GEMV tests may run one count only).  Every count, with the
    last call of a thread's share taking fewer row blocks (83 rows: 6 row blocks, the last 3
    rows wide; 1813 rows: 114 row blocks in tail shares), on every variant and thread count
    (q6_k at K = 768: the avx2 file's own q6_k GEMV; at 33,024 > 32 x 1,024: qtile's): the
    contract's bits."""
    rng = np.random.default_rng(53 + streams)
    shapes = [(83, kdim(kind, 768)), (1813, kdim(kind, 256))]
    if kind == "q6_k":
        shapes.append((35, 33024))
    with gemv_streams(streams):
        for n_out, Kd in shapes:
            w = make_weight(rng, kind, n_out, Kd, raw=True)
            check_matmul(make_x(rng, 1, Kd), w, check_rows=False)


def test_gemv_streams_setting():
    """set_gemv_streams: 1..4, None back to the default (returned as the old setting: None
    when the default was in use); anything else is a ValueError that changes nothing."""
    if _config.variant() == "portable":
        pytest.skip("the portable GEMV reads one row block per call")
    old = _config.gemv_streams()
    assert 1 <= old <= 4
    assert _config.set_gemv_streams(3) is None
    try:
        assert _config.gemv_streams() == 3
        assert goinfer.config()["gemv_streams"] == 3
        for bad in (0, 5, -1, 2.0, "2"):
            with pytest.raises(ValueError, match="1..4"):
                _config.set_gemv_streams(bad)
        assert _config.gemv_streams() == 3
        assert _config.set_gemv_streams(4) == 3
    finally:
        assert _config.set_gemv_streams(None) == 4
    assert _config.gemv_streams() == old


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/cpuinfo")
@pytest.mark.parametrize(
    "env,expect",
    [(None, None), ("1", 1), ("3", 3), ("4", 4), ("0", None), ("5", None), ("x", None)],
)
def test_gemv_streams_from_env(env, expect):
    """GOINFER_GEMV_STREAMS=<n> (1..4) sets the row blocks per GEMV call at start; anything else
    leaves the default: 1 on AMD, 4 elsewhere (1 on the portable variant, which reads one)."""
    default = 1 if _cpu_vendor_family()[0] == "AuthenticAMD" else 4
    got = _from_env("GOINFER_GEMV_STREAMS", "gemv_streams", env)
    assert got.pop("portable") == 1
    for v, n in got.items():
        assert n == (default if expect is None else expect), v


def test_gemv_warm_setting():
    """set_gemv_warm: 0..16384 KB, None back to the default (returned as the old setting:
    None when the default was in use); anything else is a ValueError that changes nothing."""
    old = _config.gemv_warm()
    assert _config.set_gemv_warm(64) is None
    try:
        assert _config.gemv_warm() == 64
        assert goinfer.config()["gemv_warm_kb"] == 64
        for bad in (-1, 16385, 2.0, "2"):
            with pytest.raises(ValueError, match="0..16384"):
                _config.set_gemv_warm(bad)
        assert _config.gemv_warm() == 64
        assert _config.set_gemv_warm(0) == 64
        assert _config.gemv_warm() == 0
    finally:
        assert _config.set_gemv_warm(None) == 0
    assert _config.gemv_warm() == old


@pytest.mark.parametrize(
    "env,expect",
    [
        (None, None),
        ("0", 0),
        ("64", 64),
        ("16384", 16384),
        ("16385", None),
        ("x", None),
        ("", None),
    ],
)
def test_gemv_warm_from_env(env, expect):
    """GOINFER_GEMV_WARM=<KB> (0..16384) sets the KB warmed per matmul at start, on every variant
    alike; anything else leaves the default, 512."""
    got = _from_env("GOINFER_GEMV_WARM", "gemv_warm", env)
    assert set(got.values()) == {512 if expect is None else expect}


@pytest.mark.parametrize(
    "get,set_,key,top",
    [
        ("gemv_prefetch", "set_gemv_prefetch", "gemv_prefetch", 64),
        ("gemv_prefetch_far", "set_gemv_prefetch_far", "gemv_prefetch_far", 1024),
    ],
)
def test_gemv_prefetch_setting(get, set_, key, top):
    """A distance set applies to every kind (the near one reads per kind: {kind: groups});
    None gives each kind its default back."""
    if _config.variant() == "portable":
        pytest.skip("the portable GEMV issues no prefetches")
    get, set_ = getattr(_config, get), getattr(_config, set_)
    every = (lambda d: dict.fromkeys(INT_KINDS, d)) if key == "gemv_prefetch" else (lambda d: d)
    old = get()
    assert set_(5) is None  # the default was in use
    try:
        assert get() == every(5)
        assert goinfer.config()[key] == every(5)
        for bad in (-1, top + 1):
            with pytest.raises(ValueError, match=f"0..{top}"):
                set_(bad)
        assert get() == every(5)
        assert set_(top) == 5
    finally:
        assert set_(None) == top
    assert get() == old


def test_gemv_prefetch_kinds():
    """The near distance reads per integer kind, in matmul.h's order of kinds; a float kind
    or an unknown name is a ValueError."""
    assert _config._INT_KINDS == INT_KINDS
    by_kind = _config.gemv_prefetch()
    assert list(by_kind) == list(INT_KINDS)
    assert all(_config.gemv_prefetch(k) == d for k, d in by_kind.items())
    for bad in ("f32", "q3_k"):
        with pytest.raises(ValueError, match="integer kinds"):
            _config.gemv_prefetch(bad)


def test_gemv_prefetch_per_kind():
    """A distance set for one kind (kind=, or a dict of kinds) moves that kind alone; the
    others keep theirs.  Each form returns the old setting in a form the setter takes back,
    and a later setting of every kind replaces the per-kind ones."""
    if _config.variant() == "portable":
        pytest.skip("the portable GEMV issues no prefetches")
    base = _config.gemv_prefetch()
    other = {k: d for k, d in base.items() if k != "q4_0"}
    try:
        assert _config.set_gemv_prefetch(3, kind="q4_0") is None
        assert _config.gemv_prefetch("q4_0") == 3
        assert {k: d for k, d in _config.gemv_prefetch().items() if k != "q4_0"} == other
        old = _config.set_gemv_prefetch({"q6_k": 7, "q4_0": None})
        assert old == {"q6_k": None, "q4_0": 3}
        assert _config.gemv_prefetch() == {**base, "q6_k": 7}
        # every kind: the old setting comes back as a dict when the kinds differ
        mixed = _config.set_gemv_prefetch(4)
        assert mixed == {**dict.fromkeys(INT_KINDS, None), "q6_k": 7}
        assert _config.gemv_prefetch() == dict.fromkeys(INT_KINDS, 4)
        assert _config.set_gemv_prefetch(mixed) == dict.fromkeys(INT_KINDS, 4)
        assert _config.gemv_prefetch() == {**base, "q6_k": 7}
        # a bad kind or distance changes nothing
        for bad in ({"q4_0": 65}, {"f32": 1}, {"q4_0": 2, "q3_k": 1}):
            with pytest.raises(ValueError):
                _config.set_gemv_prefetch(bad)
        with pytest.raises(ValueError, match="integer kinds"):
            _config.set_gemv_prefetch(2, kind="bf16")
        with pytest.raises(ValueError, match="no kind="):
            _config.set_gemv_prefetch({"q4_0": 2}, kind="q4_0")
        assert _config.gemv_prefetch() == {**base, "q6_k": 7}
    finally:
        _config.set_gemv_prefetch(None)
    assert _config.gemv_prefetch() == base


def _cpu_vendor_family() -> tuple[str, int]:
    with open("/proc/cpuinfo") as f:
        first_cpu = f.read().split("\n\n")[0]
    info = dict(
        map(str.strip, line.split(":", 1)) for line in first_cpu.splitlines() if ":" in line
    )
    return info["vendor_id"], int(info["cpu family"])


def _from_env(var, getter, env):
    """{variant: _config.<getter>()} in a fresh process with the environment variable var set to
    env (None: unset); the settings are read once, at first use."""
    e = {k: v for k, v in os.environ.items() if k != var}
    if env is not None:
        e[var] = env
    code = (
        "import json\n"
        "from goinfer._kernels import _config\n"
        "got = {}\n"
        "for v in _config.supported_variants():\n"
        "    _config.set_variant(v)\n"
        f"    got[v] = _config.{getter}()\n"
        "print(json.dumps(got))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=e, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def _prefetch_from_env(var, getter, env):
    """_from_env without the portable variant, which issues no prefetches (checked)"""
    got = _from_env(var, getter, env)
    portable = got.pop("portable")  # plain C, no prefetches to set
    assert portable == (dict.fromkeys(INT_KINDS, 0) if isinstance(portable, dict) else 0)
    return got


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/cpuinfo")
@pytest.mark.parametrize(
    "env,expect",
    [(None, None), ("0", 0), ("12", 12), ("64", 64), ("65", None), ("x", None), ("", None)],
)
def test_gemv_prefetch_from_env(env, expect):
    """GOINFER_PREFETCH=<groups> (0..64) sets the distance of every kind at start; anything else
    leaves each variant's and kind's default on the CPU: 16 groups on AMD family 19h (Zen 3,
    Zen 4) but none for q4_k, none for q8_0 and mxfp4 on avx512-vnni and 12 for q4_0 on avx2;
    16 (avx512-vnni) and 32 (avx2) groups on AMD family 1Ah (Zen 5); 8 otherwise; the portable
    variant issues none."""
    vendor, family = _cpu_vendor_family()
    amd = vendor == "AuthenticAMD"
    for v, got in _prefetch_from_env("GOINFER_PREFETCH", "gemv_prefetch", env).items():
        for kind in INT_KINDS:
            if amd and family == 0x19:
                avx512_none = v == "avx512-vnni" and kind in ("q8_0", "mxfp4")
                avx2_q4_0 = v == "avx2" and kind == "q4_0"
                default = 0 if kind == "q4_k" or avx512_none else 12 if avx2_q4_0 else 16
            elif amd and family == 0x1A:
                default = 16 if v == "avx512-vnni" else 32
            else:
                default = 8
            assert got[kind] == (default if expect is None else expect), (v, kind)


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/cpuinfo")
@pytest.mark.parametrize(
    "env,expect",
    [(None, None), ("0", 0), ("96", 96), ("1024", 1024), ("1025", None), ("-1", None), ("x", None)],
)
def test_gemv_prefetch_far_from_env(env, expect):
    """GOINFER_PREFETCH_FAR=<groups> (0..1024) sets the far distance at start; anything else
    leaves the default: 128 groups, none on AMD (and on the portable variant)."""
    default = 0 if _cpu_vendor_family()[0] == "AuthenticAMD" else 128
    for v, got in _prefetch_from_env("GOINFER_PREFETCH_FAR", "gemv_prefetch_far", env).items():
        assert got == (default if expect is None else expect), v


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(KINDS),
    M=st.integers(1, 30),
    n_out=st.integers(1, 80),
    G=st.integers(1, 8),
    wscale=st.sampled_from([1e-6, 1e-3, 1.0, 300.0]),
    xscale=st.sampled_from([1e-30, 1e-5, 1.0, 1e4, 1e30]),
    raw=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
# the k-quants at their boundaries: one super-block, one row, a ragged row block; the AMX tile
# (16 rows) and one row more; GEMM tiles of 4 (q6_k) / 6 rows +1; f16-subnormal d, dmin
@example(kind="q4_k", M=1, n_out=1, G=1, wscale=1e-6, xscale=1e30, raw=True, seed=1)
@example(kind="q5_k", M=17, n_out=17, G=2, wscale=300.0, xscale=1e-30, raw=True, seed=2)
@example(kind="q6_k", M=16, n_out=33, G=1, wscale=1.0, xscale=1e4, raw=True, seed=3)
@example(kind="q4_k", M=7, n_out=80, G=3, wscale=1e-3, xscale=1.0, raw=False, seed=4)
@example(kind="q6_k", M=5, n_out=15, G=2, wscale=1e-6, xscale=1e-5, raw=True, seed=5)
# the other kinds at the same boundaries: one group / row, a ragged row block, 16 and 17 rows
@example(kind="q4_0", M=1, n_out=1, G=1, wscale=1e-6, xscale=1e30, raw=True, seed=6)
@example(kind="q4_1", M=17, n_out=17, G=1, wscale=300.0, xscale=1e-30, raw=True, seed=7)
@example(kind="q8_0", M=16, n_out=33, G=8, wscale=1.0, xscale=1e30, raw=True, seed=8)
@example(kind="mxfp4", M=16, n_out=16, G=2, wscale=1e-3, xscale=1e4, raw=True, seed=9)
@example(kind="f32", M=1, n_out=1, G=1, wscale=1.0, xscale=1e-30, raw=False, seed=10)
@example(kind="f16", M=17, n_out=80, G=3, wscale=300.0, xscale=1e4, raw=False, seed=11)
@example(kind="bf16", M=30, n_out=15, G=8, wscale=1e-6, xscale=1.0, raw=False, seed=12)
# q5_0 / q5_1 likewise: one group and row (f16-subnormal d), a ragged row block, the AMX tile
# (16 rows) and one more, GEMM tiles of 4 (AVX2) / 6 (AVX-512) rows + 1, huge activations
@example(kind="q5_0", M=1, n_out=1, G=1, wscale=1e-6, xscale=1e30, raw=True, seed=13)
@example(kind="q5_1", M=1, n_out=1, G=1, wscale=1e-6, xscale=1e-30, raw=True, seed=14)
@example(kind="q5_0", M=17, n_out=17, G=2, wscale=300.0, xscale=1e-30, raw=True, seed=15)
@example(kind="q5_1", M=16, n_out=33, G=8, wscale=300.0, xscale=1e30, raw=True, seed=16)
@example(kind="q5_0", M=7, n_out=80, G=3, wscale=1e-3, xscale=1.0, raw=False, seed=17)
@example(kind="q5_1", M=5, n_out=15, G=2, wscale=1.0, xscale=1e4, raw=False, seed=18)
def test_matmul_property(kind, M, n_out, G, wscale, xscale, raw, seed):
    """Random shapes and scales (f16 subnormal weight scales, tiny/huge activations, raw
    random bits incl. q8 = -128, zero groups): contract bits, all variants, all splits."""
    if (kind in FLOAT_KINDS or kind == "mxfp4") and xscale > 1e20:
        xscale = (
            1e4  # float kinds, mxfp4 (2^(e-128) scales up to 2^127): keep w*x far from overflow
        )
    rng = np.random.default_rng(seed)
    Kd = G * (QK_K if kind in K_KINDS else GROUP)
    check_matmul(
        make_x(rng, M, Kd, xscale),
        make_weight(rng, kind, n_out, Kd, wscale, raw),
        check_rows=M <= 8,
    )


def test_matmul_out_and_qact_rows():
    rng = np.random.default_rng(3)
    w = make_weight(rng, "q4_0", 50, 128)
    x = make_x(rng, 20, 128)
    buf = QAct.empty(32, 128)
    xq = K.quantize_act(x, buf.rows(20))
    out = np.full((20, 50), np.nan, np.float32)
    got = K.matmul(xq, w, out, nthreads=2)
    assert got is out
    assert np.array_equal(out, emulate_matmul(ref.quantize_act(x), w))


def test_matmul_empty_batch():
    rng = np.random.default_rng(4)
    w = make_weight(rng, "q8_0", 20, 64)
    assert K.matmul(K.quantize_act(np.zeros((0, 64), np.float32)), w).shape == (0, 20)
    wf = make_weight(rng, "f16", 20, 64)
    assert K.matmul(np.zeros((0, 64), np.float32), wf).shape == (0, 20)


@pytest.mark.parametrize("kind", INT_KINDS)
def test_matmul_int_empty_k(kind):
    """K = 0 (no groups): every output is the empty sum 0, GEMM and GEMV, every variant."""
    w = quantize_weight(np.zeros((20, 0), np.float32), kind)
    for v in VARIANTS:
        with variant(v):
            for M in (1, 5):
                out = np.full((M, 20), np.nan, np.float32)
                K.matmul(K.quantize_act(np.zeros((M, 0), np.float32)), w, out, nthreads=2)
                assert np.array_equal(out, np.zeros((M, 20), np.float32)), (v, M)


@pytest.mark.parametrize("M", [1, 3, 33])
def test_matmul_q6k_extremes(M):
    """q6_k at the int16 bounds of the AVX2 kernel: codes 63 (or 0) against activations of
    +-127 (two lines of vpmaddubsw pairs sum to 2*2*63*127 = 32004 in int16), scales -128 and
    127, the -32 offset's sums at +-16*127: the contract's bits, every variant and split."""
    n_out, Kd = 40, 512
    x = np.full((M, Kd), 1.0, np.float32)
    x[:, Kd // 2 :] = -1.0
    x[:, 16:32] = -1.0  # a group whose halves have opposite sums
    for code, s in [(63, -128), (0, 127), (63, 127), (0, -128)]:
        q = np.full((n_out, Kd), code, np.uint8)
        q[1::2, ::3] = 63 - code
        sc = np.full((n_out, Kd // 16), s, np.int8)
        sc[::3] = -s - 1
        w = pack_q6k(q, sc, np.full((n_out, Kd // QK_K), 0.5, np.float16))
        check_matmul(x, w, check_rows=M < 5)


@pytest.mark.parametrize("kind", ["q4_k", "q5_k"])
@pytest.mark.parametrize("M", [1, 3, 33])
def test_matmul_qk_extremes(kind, M):
    """q4_k / q5_k at the int16 bounds of the AVX2 kernels: every code at its largest (15 / 31)
    against activations of +-127 (q5_k: 4 lines of vpmaddubsw pairs sum to 4*2*31*127 = 31496
    in int16), scales and mins 0 and 63 in every packed position: the contract's bits, every
    variant and split, AMX included (M = 33)."""
    n_out, Kd = 40, 512
    top = 15 if kind == "q4_k" else 31
    x = np.full((M, Kd), 1.0, np.float32)
    x[:, Kd // 2 :] = -1.0
    for code in (top, 0):
        q = np.full((n_out, Kd), code, np.uint8)
        q[1::2, ::5] = top - code
        sc = np.full((n_out, 2, 8), 63, np.uint8)
        mn = np.full((n_out, 2, 8), 63, np.uint8)
        sc[::3], mn[1::3] = 0, 0
        dd = np.full((2, n_out, 2), 0.5, np.float16)
        check_matmul(x, pack_qk(kind, q, pack_scale_min(sc, mn), dd[0], dd[1]), check_rows=M < 5)


@pytest.mark.parametrize("kind", ["q5_0", "q5_1"])
@pytest.mark.parametrize("M", [1, 3, 33])
def test_matmul_q5_extremes(kind, M):
    """q5_0 / q5_1 at the int16 bounds of the AVX2 kernels: every code at its largest (31) or
    smallest (0) against activations of +-127 (4 lines of vpmaddubsw pairs sum to 4*2*31*127 =
    31496 in int16), q5_0's -16*asum at its largest (16*32*127): the contract's bits, every
    variant and split, AMX included (M = 33)."""
    n_out, Kd = 40, 512
    x = np.full((M, Kd), 1.0, np.float32)
    x[:, Kd // 2 :] = -1.0
    G = Kd // GROUP
    for code in (31, 0):
        q = np.full((n_out, Kd), code, np.uint8)
        q[1::2, ::5] = 31 - code
        d = np.full((n_out, G), 0.5, np.float16)
        d[::3] = -65504.0  # the largest float16 magnitude
        mn = np.full((n_out, G), -0.25, np.float16) if kind == "q5_1" else None
        check_matmul(x, pack_q5(kind, q, d, mn), check_rows=M < 5)


@pytest.mark.parametrize("kind", ["q4_0", "q4_1", "q8_0"])
@pytest.mark.parametrize("M", [1, 3, 33])
def test_matmul_fold_extremes(kind, M):
    """The group sums at their largest magnitude, where the AVX-VNNI GEMM's fold reads the
    int32 sum as a float (started at 1.5*2^23, so the sum must stay within 2^22): q8_0 codes
    -128 and 127 against activations of +-127 (|isum| = 32*128*127), q4 codes 15 and 0 (q4_0
    with its -8*asum at 8*32*127): the contract's bits, every variant and split, AMX included
    (M = 33)."""
    n_out, Kd = 40, 512
    x = np.full((M, Kd), 1.0, np.float32)
    x[:, Kd // 2 :] = -1.0
    G = Kd // GROUP
    d = np.full((n_out, G), 0.5, np.float16)
    d[::3] = -65504.0  # the largest float16 magnitude
    for lo, hi in ((-128, 127), (127, -128)) if kind == "q8_0" else ((0, 15), (15, 0)):
        q = np.full((n_out, Kd), lo, np.int8 if kind == "q8_0" else np.uint8)
        q[1::2] = hi
        q[2::4, ::5] = lo // 2
        mn = np.full((n_out, G), -0.25, np.float16) if kind == "q4_1" else None
        w = pack_q8(q, d) if kind == "q8_0" else pack_q4(kind, q, d, mn)
        check_matmul(x, w, check_rows=M < 5)


@pytest.mark.parametrize("kind", ["q6_k", "q4_k", "q5_k", "q5_0", "q5_1"])
def test_matmul_k_quants_seven_threads(kind):
    """More threads than row blocks or activation tiles (7): every share's tile still gives
    the contract's bits, GEMV and GEMM, every variant and AMX on / off."""
    rng = np.random.default_rng(70 + len(kind))
    for M, n_out in [(1, 90), (1, 300), (13, 50), (40, 100)]:
        x = make_x(rng, M, 512)
        w = make_weight(rng, kind, n_out, 512, raw=M % 2 == 1)
        want = emulate_matmul(ref.quantize_act(x), w)
        for name, amx in MODES:
            with mode(name, amx):
                got = K.matmul(K.quantize_act(x), w, nthreads=7)
                assert np.array_equal(got, want), (kind, M, n_out, name, amx)


def test_qk_errors():
    """q4_k / q5_k need whole super-blocks (n_in % 256 == 0) and their packed uint8 scales."""
    rng = np.random.default_rng(10)
    for kind in ("q4_k", "q5_k"):
        with pytest.raises(ValueError, match="256"):
            quantize_weight(rng.standard_normal((16, 96)).astype(np.float32), kind)
        w = make_weight(rng, kind, 16, 256)
        xq = K.quantize_act(make_x(rng, 2, 256))
        with pytest.raises(TypeError, match="uint8"):
            K.matmul(xq, QWeight(kind, 16, 256, w.qs, w.d, w.m.view(np.int8)))
        with pytest.raises(ValueError, match="256"):
            K.matmul(
                K.quantize_act(make_x(rng, 2, 224)), QWeight(kind, 16, 224, w.qs[:, :7], w.d, w.m)
            )
        with pytest.raises(ValueError, match="shape"):  # q4_k's qs (4 lines) as q5_k's (5)
            other = "q5_k" if kind == "q4_k" else "q4_k"
            K.matmul(xq, QWeight(other, 16, 256, w.qs, w.d, w.m))


def test_q6k_errors():
    """q6_k needs whole super-blocks (n_in % 256 == 0) and its int8 scales; clear errors."""
    rng = np.random.default_rng(9)
    with pytest.raises(ValueError, match="256"):
        quantize_weight(rng.standard_normal((16, 96)).astype(np.float32), "q6_k")
    w = make_weight(rng, "q6_k", 16, 256)
    xq = K.quantize_act(make_x(rng, 2, 256))
    bad = QWeight("q6_k", 16, 256, w.qs, w.d, w.m.astype(np.int16))
    with pytest.raises(TypeError, match="int8"):
        K.matmul(xq, bad)
    short = QWeight("q6_k", 16, 224, w.qs[:, :7], w.d, w.m[:, :7])
    with pytest.raises(ValueError, match="256"):
        K.matmul(K.quantize_act(make_x(rng, 2, 224)), short)


# ============================================================================ get_rows


@pytest.mark.parametrize("kind", KINDS)
def test_get_rows(kind):
    rng = np.random.default_rng(len(kind))
    for n_out, Kd, raw in [(1, 32, False), (37, 96, True), (300, 576, False)]:
        Kd = kdim(kind, Kd)
        w = make_weight(rng, kind, n_out, Kd, raw=raw)
        ids = rng.integers(0, n_out, 50)
        ids[:2] = [0, n_out - 1]
        want = ref.get_rows(w, ids)
        for v in VARIANTS:
            with variant(v):
                for nt in THREADS:
                    got = K.get_rows(w, ids, nthreads=nt)
                    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
                    assert np.array_equal(K.get_rows(w, ids.astype(np.int32), nthreads=nt), want)
        out = np.empty((50, Kd), np.float32)
        assert K.get_rows(w, ids, out) is out and np.array_equal(out, want)
        assert K.get_rows(w, []).shape == (0, Kd)


# ============================================================================ bind (graph replay)
# bind_quantize_act / bind_matmul record their arguments for goinfer/graph.py, which binds
# row ranges of persistent buffers sized for the largest batch (QAct.rows, out[:M]) and
# replays the ops after writing new inputs into the same buffers.  Every ISA variant of this
# machine, and the AMX GEMM (avx512 variant) where the CPU has it.

GRAPH = importlib.import_module("goinfer._kernels.graph")
MODES = [(v, False) for v in VARIANTS]
if _config.amx_supported() and "avx512-vnni" in VARIANTS:
    MODES.append(("avx512-vnni", True))


@contextlib.contextmanager
def mode(name, amx):
    with variant(name):
        old = _config.set_amx(amx) if _config.amx_supported() else None
        try:
            assert _config.amx_in_use() == amx
            yield
        finally:
            if old is not None:
                _config.set_amx(old)


def qact_buffer(M, Kd):
    """A QAct of M rows filled with marker values (to see what a kernel wrote)."""
    b = QAct.empty(M, Kd)
    b.qa[...], b.da[...], b.asum[...], b.sa[...] = 77, -1.5, 12345, 2.5
    return b


def qact_rows(b: QAct, r0, r1) -> QAct:
    return QAct(b.qa[r0:r1], b.da[r0:r1], b.asum[r0:r1], b.sa[r0:r1])


@pytest.mark.parametrize("name, amx", MODES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("nt, spt", [(1, 4), (2, 1), (2, 3)])
def test_bind_quantize_act_and_matmul(name, amx, kind, nt, spt):
    """Bound into rows [3, 3 + M) of larger buffers, run by a Graph: the contract's bits,
    nothing outside those rows written; replayed after new inputs are written in place: the
    new product.  A GEMM has spt shares per thread (one thread: one share)."""
    rng = np.random.default_rng(len(kind) * 10 + nt)
    M, n_out, Kd = 37, 50, kdim(kind, 192)  # M >= 16: the AMX GEMM's size
    w = make_weight(rng, kind, n_out, Kd)
    xbuf = np.full((M + 6, Kd), np.nan, np.float32)
    out = np.full((M + 6, n_out), np.nan, np.float32)
    x, y = xbuf[3 : 3 + M], out[3 : 3 + M]
    with mode(name, amx), shares_per_thread(spt):
        if kind in INT_KINDS:
            qbuf = qact_buffer(M + 6, Kd)
            q = qact_rows(qbuf, 3, 3 + M)
            ops = [K.bind_quantize_act(x, q, nthreads=nt), K.bind_matmul(q, w, y, nthreads=nt)]
        else:
            ops = [K.bind_matmul(x, w, y, nthreads=nt)]
        assert ops[-1].nshares == (nt * spt if nt > 1 else 1)
        g = GRAPH.Graph(ops, nt)
        for step in range(2):
            x[...] = make_x(rng, M, Kd)
            g.run()
            if kind in INT_KINDS:
                xq = ref.quantize_act(x)
                assert_qact_equal(q, xq)
                assert_qact_equal(qact_rows(qbuf, 0, 3), qact_buffer(3, Kd))
                assert_qact_equal(qact_rows(qbuf, 3 + M, M + 6), qact_buffer(3, Kd))
                want = emulate_matmul(xq, w)
            else:
                want = emulate_matmul(x, w)
            assert np.array_equal(y, want), (name, amx, kind, nt, step)
            assert np.isnan(out[:3]).all() and np.isnan(out[3 + M :]).all()


def test_bind_checks_its_arguments():
    """out must be given (the op keeps a pointer to it); non-contiguous rows, wrong shapes
    and types are refused as by the kernels."""
    rng = np.random.default_rng(8)
    w = make_weight(rng, "q8_0", 20, 64)
    x = make_x(rng, 4, 64)
    q = QAct.empty(4, 64)
    with pytest.raises(ValueError, match="needs out"):
        K.bind_quantize_act(x, None)
    with pytest.raises(ValueError, match="needs out"):
        K.bind_matmul(q, w, None)
    with pytest.raises(ValueError, match="needs out"):
        K.bind_get_rows(w, np.zeros(3, np.int64), None)
    wide = np.empty((4, 40), np.float32)
    with pytest.raises(ValueError, match="C-contiguous"):
        K.bind_matmul(q, w, wide[:, :20])  # a column slice of a wider output
    with pytest.raises(ValueError, match="C-contiguous"):
        strided = QAct(np.zeros((8, 64), np.int8)[::2], q.da, q.asum, q.sa)  # every other row
        K.bind_matmul(strided, w, np.empty((4, 20), np.float32))
    with pytest.raises(ValueError, match="shape"):
        K.bind_matmul(q, w, np.empty((5, 20), np.float32))
    with pytest.raises(ValueError, match="rows"):
        K.bind_quantize_act(x, QAct.empty(5, 64))
    with pytest.raises(TypeError):
        K.bind_matmul(x, w, np.empty((4, 20), np.float32))  # int weights take a QAct


# ============================================================================ errors


def test_errors():
    rng = np.random.default_rng(5)
    wq = make_weight(rng, "q4_1", 20, 64)
    wf = make_weight(rng, "f32", 20, 64)
    x = make_x(rng, 3, 64)
    xq = K.quantize_act(x)
    # quantize_act
    with pytest.raises(TypeError):
        K.quantize_act(x.astype(np.float64))
    with pytest.raises(ValueError):
        K.quantize_act(np.zeros((2, 40), np.float32))  # K % 32
    with pytest.raises(ValueError):
        K.quantize_act(np.zeros(64, np.float32))  # 1-D
    with pytest.raises(ValueError):
        K.quantize_act(np.zeros((64, 4), np.float32).T)  # not C-contiguous
    with pytest.raises(ValueError):
        K.quantize_act(x, QAct.empty(4, 64))  # out rows
    with pytest.raises(ValueError):
        K.quantize_act(x, nthreads=0)
    # matmul
    with pytest.raises(TypeError):
        K.matmul(x, wq)  # int weights need a QAct
    with pytest.raises(TypeError):
        K.matmul(xq, wf)  # float weights need float x
    with pytest.raises(TypeError):
        K.matmul(x.astype(np.float16), wf)
    with pytest.raises(ValueError):
        K.matmul(make_x(rng, 3, 96), wf)  # K mismatch
    with pytest.raises(ValueError):
        K.matmul(K.quantize_act(make_x(rng, 3, 96)), wq)  # K mismatch
    with pytest.raises(ValueError):
        K.matmul(xq, wq, np.zeros((3, 21), np.float32))
    with pytest.raises(TypeError):
        K.matmul(xq, wq, np.zeros((3, 20), np.float64))
    with pytest.raises(ValueError):
        K.matmul(xq, wq, np.zeros((20, 3), np.float32).T)
    ro = np.zeros((3, 20), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError):
        K.matmul(xq, wq, ro)
    with pytest.raises(ValueError):  # out aliasing x
        sq = make_weight(rng, "f32", 64, 64)
        xs = make_x(rng, 3, 64)
        K.matmul(xs, sq, xs)
    with pytest.raises(TypeError):
        K.matmul(xq, np.zeros((20, 64), np.float32))  # not a QWeight
    bad = QWeight("q3_0", 20, 64, wq.qs, wq.d, wq.m)
    with pytest.raises(ValueError):
        K.matmul(xq, bad)
    with pytest.raises(ValueError, match="shape"):  # q4_1's qs (4 lines) as q5_1's (5)
        K.matmul(xq, QWeight("q5_1", 20, 64, wq.qs, wq.d, wq.m))
    w5 = make_weight(rng, "q5_1", 20, 64)
    with pytest.raises(ValueError, match="shape"):  # and q5_1's as q4_1's
        K.matmul(xq, QWeight("q4_1", 20, 64, w5.qs, w5.d, w5.m))
    with pytest.raises(TypeError):  # q5_1 without m
        K.matmul(xq, QWeight("q5_1", 20, 64, w5.qs, w5.d, None))
    with pytest.raises(ValueError):  # qs of the wrong layout
        K.matmul(xq, QWeight("q4_1", 20, 64, wq.qs[:, :1], wq.d, wq.m))
    with pytest.raises(TypeError):  # q4_1 without m
        K.matmul(xq, QWeight("q4_1", 20, 64, wq.qs, wq.d, None))
    with pytest.raises(TypeError):
        K.matmul(xq, QWeight("q8_0", 20, 64, np.zeros((2, 2, 8, 16, 4), np.uint8), wq.d))
    with pytest.raises(TypeError):
        K.matmul(QAct(xq.qa, xq.da, xq.asum.astype(np.int64), xq.sa), wq)
    # get_rows
    with pytest.raises(IndexError):
        K.get_rows(wq, [0, 20])
    with pytest.raises(IndexError):
        K.get_rows(wq, [-1])
    with pytest.raises(TypeError):
        K.get_rows(wq, [0.5])
    with pytest.raises(ValueError):
        K.get_rows(wq, [[0]])
    with pytest.raises(ValueError):
        K.get_rows(wq, [0], np.zeros((1, 63), np.float32))


# ============================================================================ matmul_experts
# Every expert of a layer in one call: rows [offsets[e], offsets[e+1]) of x times expert e.
# Each expert's rows must carry the contract's bits (emulate_matmul of those rows alone), +
# the bias in float32, whatever the split of the work across shares; the NumPy twin
# (_reference.matmul_experts) within the float64 reference's tolerance.


def check_experts(x, ws, offsets, bias=None):
    kind = ws[0].kind
    xq = ref.quantize_act(x)
    xin = xq if kind in INT_KINDS else x
    want = np.empty((x.shape[0], ws[0].n_out), np.float32)
    for e, w in enumerate(ws):
        m0, m1 = offsets[e], offsets[e + 1]
        if m1 > m0:
            xe = qact_rows(xq, m0, m1) if kind in INT_KINDS else x[m0:m1]
            want[m0:m1] = emulate_matmul(xe, w)
            if bias is not None:
                want[m0:m1] = want[m0:m1] + bias[e]
    off = np.asarray(offsets, np.int64)
    for name, amx in MODES:
        with mode(name, amx):
            xk = K.quantize_act(x) if kind in INT_KINDS else x
            for nt in THREADS:
                out = K.matmul_experts(xk, ws, off, bias, nthreads=nt)
                assert out.dtype == np.float32 and out.shape == want.shape
                assert np.array_equal(out, want), (name, amx, nt)
    r = ref.matmul_experts(xin, ws, off, bias).astype(np.float64)
    xd = ref.dequantize_act(xq) if kind in INT_KINDS else x
    for e, w in enumerate(ws):
        m0, m1 = offsets[e], offsets[e + 1]
        tol = tolerance(qact_rows(xq, m0, m1) if kind in INT_KINDS else x[m0:m1], w, xd[m0:m1])
        if bias is not None:
            tol = tol + U * np.abs(r[m0:m1]) * 2
        assert np.all(np.abs(want[m0:m1].astype(np.float64) - r[m0:m1]) <= tol), e


def random_offsets(rng, E, M):
    """Rows split among E experts in order, some experts empty."""
    cuts = np.sort(rng.integers(0, M + 1, E - 1))
    return [0] + cuts.tolist() + [M]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    "E,M,n_out,Kd",
    [(1, 1, 16, 64), (4, 4, 50, 128), (8, 8, 33, 256), (6, 40, 70, 192), (3, 100, 20, 512)],
)
def test_matmul_experts(kind, E, M, n_out, Kd):
    rng = np.random.default_rng(hash((kind, E, M, n_out)) % 2**32)
    Kd = kdim(kind, Kd)
    ws = [make_weight(rng, kind, n_out, Kd, raw=e % 2 == 1) for e in range(E)]
    # one row per expert (a decode step's top-k), then uneven splits with empty experts
    check_experts(
        make_x(rng, M, Kd), ws, list(range(M + 1)) if E == M else random_offsets(rng, E, M)
    )
    bias = rng.standard_normal((E, n_out)).astype(np.float32)
    check_experts(make_x(rng, M, Kd), ws, random_offsets(rng, E, M), bias)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(KINDS),
    E=st.integers(1, 9),
    M=st.integers(0, 40),
    n_out=st.integers(1, 70),
    G=st.integers(1, 4),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
# no rows at all; one expert, one row, one output; more experts than rows; AMX tiles of 16 / 17
@example(kind="q4_k", E=9, M=0, n_out=1, G=1, with_bias=True, seed=1)
@example(kind="q6_k", E=1, M=1, n_out=1, G=1, with_bias=False, seed=2)
@example(kind="q5_k", E=9, M=3, n_out=17, G=2, with_bias=True, seed=3)
@example(kind="q8_0", E=2, M=33, n_out=16, G=4, with_bias=False, seed=4)
@example(kind="mxfp4", E=3, M=40, n_out=70, G=1, with_bias=True, seed=5)
@example(kind="q5_0", E=2, M=17, n_out=17, G=1, with_bias=False, seed=6)
@example(kind="q5_1", E=9, M=3, n_out=33, G=2, with_bias=True, seed=7)
def test_matmul_experts_property(kind, E, M, n_out, G, with_bias, seed):
    """Any number of experts, rows (none too), splits (empty experts anywhere): each expert's
    rows carry matmul's bits on every variant, AMX on and off, and every thread count."""
    rng = np.random.default_rng(seed)
    Kd = G * (QK_K if kind in K_KINDS else GROUP)
    ws = [make_weight(rng, kind, n_out, Kd) for _ in range(E)]
    bias = rng.standard_normal((E, n_out)).astype(np.float32) if with_bias else None
    check_experts(make_x(rng, M, Kd), ws, random_offsets(rng, E, M), bias)


@pytest.mark.parametrize("name, amx", MODES)
@pytest.mark.parametrize("nt", [1, 2, 3])
def test_bind_matmul_experts_reads_offsets_when_run(name, amx, nt):
    """A bound op follows the offsets written before each run (a decode step's routing), into
    rows of a larger buffer, writing nothing else."""
    rng = np.random.default_rng(40 + nt)
    E, M, n_out, Kd = 6, 20, 40, 256
    ws = [make_weight(rng, "q4_0", n_out, Kd) for _ in range(E)]
    bias = rng.standard_normal((E, n_out)).astype(np.float32)
    q = QAct.empty(M, Kd)
    off = np.zeros(E + 1, np.int64)
    out = np.full((M + 4, n_out), np.nan, np.float32)
    y = out[2 : 2 + M]
    with mode(name, amx):
        g = GRAPH.Graph([K.bind_matmul_experts(q, ws, off, bias, y, nthreads=nt)], nt)
        for step in range(3):
            x = make_x(rng, M, Kd)
            xq = K.quantize_act(x)
            for a, b in zip((q.qa, q.da, q.asum, q.sa), (xq.qa, xq.da, xq.asum, xq.sa)):
                a[...] = b
            off[:] = [0, M] + [M] * (E - 1) if step == 0 else random_offsets(rng, E, M)
            off[:] = np.sort(off)
            g.run()
            assert np.array_equal(y, K.matmul_experts(xq, ws, off, bias)), step
            assert np.isnan(out[:2]).all() and np.isnan(out[2 + M :]).all()


def test_matmul_experts_errors():
    rng = np.random.default_rng(9)
    ws = [make_weight(rng, "q4_0", 20, 64) for _ in range(3)]
    xq = K.quantize_act(make_x(rng, 5, 64))
    off = np.array([0, 2, 2, 5], np.int64)
    K.matmul_experts(xq, ws, off)
    with pytest.raises(ValueError, match="non-empty"):
        K.matmul_experts(xq, [], off[:1])
    with pytest.raises(ValueError, match="must match"):
        K.matmul_experts(xq, ws[:2] + [make_weight(rng, "q8_0", 20, 64)], off)
    with pytest.raises(ValueError, match="must match"):
        K.matmul_experts(xq, ws[:2] + [make_weight(rng, "q4_0", 21, 64)], off)
    for bad in ([0, 2, 1, 5], [1, 2, 2, 5], [0, 2, 2, 4], [0, 2, 2, 6]):
        with pytest.raises(ValueError, match="offsets"):
            K.matmul_experts(xq, ws, np.array(bad, np.int64))
        with pytest.raises(ValueError, match="offsets"):
            ref.matmul_experts(xq, ws, np.array(bad, np.int64))
    with pytest.raises(ValueError, match="shape"):
        K.matmul_experts(xq, ws, off[:3])
    with pytest.raises(TypeError):
        K.matmul_experts(xq, ws, off.astype(np.int32))
    with pytest.raises(ValueError, match="shape"):
        K.matmul_experts(xq, ws, off, np.zeros((3, 19), np.float32))
    with pytest.raises(TypeError):
        K.matmul_experts(make_x(rng, 5, 64), ws, off)  # int weights take a QAct
    with pytest.raises(ValueError, match="needs out"):
        K.bind_matmul_experts(xq, ws, off, None, None)
