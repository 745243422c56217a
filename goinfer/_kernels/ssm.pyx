# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Linear-attention kernels of hybrid models (Qwen3.5's Gated DeltaNet): ssm_conv (short causal
depthwise conv + SiLU, with its state), gated_delta (the gated delta rule, recurrent form, with
its state) and sigmoid_mul (the sigmoid output gate of full-attention layers).

Same names, signatures and meaning as goinfer._reference (see src/ssm.h and
docs/design/qwen35.md for the contracts).  All float arrays are float32.  2-D inputs may have
strided rows (a column slice of a fused projection) with a contiguous last axis.

State arrays are updated in place.  ``snap_rows`` (int32, increasing, rows of this call) and
``snaps`` ask for copies of the state as it is right after those rows: ``snaps[s]`` receives
the state after row ``snap_rows[s]`` (snapshots for prefix reuse, at block boundaries inside a
prefill).
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t
from cython.parallel cimport prange
from goinfer._kernels.dispatch cimport GI_AVX2, GI_AVX512, gi_variant

cnp.import_array()

cdef extern from "ssm.h" nogil:
    ctypedef struct gi_ssm_ops:
        void (*conv)(const float *x, int64_t xs, const float *wT, float *state, float *out,
                     int64_t os, int64_t T, int64_t C, int64_t K, int64_t c0, int64_t c1,
                     const int32_t *snap_rows, int64_t n_snap, float *snap,
                     int64_t snap_stride) noexcept nogil
        void (*delta)(const float *qn, const float *kn, const float *v, int64_t vs,
                      const float *beta, const float *decay, float *state, float *out, int64_t os,
                      int64_t T, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, int64_t h,
                      int64_t j0, int64_t j1, const int32_t *snap_rows, int64_t n_snap,
                      float *snap, int64_t snap_stride) noexcept nogil
        void (*sigmoid_mul)(const float *g, int64_t gs, const float *x, int64_t xs, float *out,
                            int64_t os, int64_t m0, int64_t m1, int64_t N) noexcept nogil
    const gi_ssm_ops gi_ssm_ops_portable
    const gi_ssm_ops gi_ssm_ops_avx2
    const gi_ssm_ops gi_ssm_ops_avx512
    void gi_ssm_prep(const float *qkv, int64_t qs, const float *ab, int64_t abs_, const float *A,
                     const float *dt_bias, float *qn, float *kn, float *beta, float *decay,
                     int64_t t0, int64_t t1, int64_t Hk, int64_t Hv, int64_t dk,
                     double eps) noexcept nogil

DEF COLS = 16  # value columns per work item of the recurrence (any width gives the same bits)

# below this many elements, ssm_conv and sigmoid_mul run on one thread (tests set 0)
cdef int64_t _GRAIN = 16384


def _set_grain(g):
    """Set the one-thread threshold (elements); returns the old one (tests)."""
    global _GRAIN
    old = _GRAIN
    _GRAIN = int(g)
    return old


cdef const gi_ssm_ops *_table() except NULL:
    cdef int v = gi_variant()
    if v == GI_AVX512:
        return &gi_ssm_ops_avx512
    if v == GI_AVX2:
        return &gi_ssm_ops_avx2
    return &gi_ssm_ops_portable


cdef int _threads(object nthreads) except -1:
    if isinstance(nthreads, (int, np.integer)) and not isinstance(nthreads, bool):
        if 1 <= nthreads <= 1024:
            return <int>nthreads
    raise ValueError(f"nthreads must be a positive int, got {nthreads!r}")


cdef object _f32(object a, str name):
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy array of float32, got {type(a).__name__}")
    if a.dtype != np.float32:
        raise TypeError(f"{name} must have dtype float32, got {a.dtype}")
    return a


cdef inline void *_ptr(object a):
    return cnp.PyArray_DATA(<cnp.ndarray>a)


cdef int64_t _row_stride(object a, str name, bint writeable) except -1:
    """A 2-D float32 array with a contiguous last axis: its row stride in floats."""
    if writeable and not a.flags.writeable:
        raise ValueError(f"{name} is read-only")
    if a.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {np.shape(a)}")
    if a.shape[1] > 1 and a.strides[1] != 4:
        raise ValueError(f"{name} must have a contiguous last axis")
    if a.shape[0] > 1 and (a.strides[0] % 4 or a.strides[0] < 4 * a.shape[1]):
        raise ValueError(f"{name} has an unsupported row stride {a.strides[0]}")
    return a.strides[0] // 4 if a.shape[0] > 1 else a.shape[1]


cdef object _contig(object a, str name, tuple shape, bint writeable):
    arr = _f32(a, name)
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {np.shape(arr)}")
    if not arr.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if writeable and not arr.flags.writeable:
        raise ValueError(f"{name} is read-only")
    return arr


cdef tuple _snaps(object snap_rows, object snaps, tuple inner, int64_t T):
    """-> (rows int32 array, snaps array, n, stride in floats); checks order and shapes."""
    if snap_rows is None and snaps is None:
        return np.zeros(1, np.int32), np.zeros((1,) + inner, np.float32), 0, 0
    rows = np.ascontiguousarray(snap_rows, dtype=np.int32)
    s = _f32(snaps, "snaps")
    n = rows.shape[0]
    if rows.ndim != 1 or s.ndim != 1 + len(inner) or s.shape[0] != n or tuple(s.shape[1:]) != inner:
        raise ValueError(f"snaps must have shape ({n},) + {inner}, got {np.shape(s)}")
    if n and (rows.min() < 0 or rows.max() >= T or (n > 1 and np.any(np.diff(rows) <= 0))):
        raise ValueError(f"snap_rows must be increasing rows of the call (0..{T - 1})")
    cdef int64_t inner_size = 1
    for d in inner:
        inner_size *= d
    if inner_size == 0:
        return rows, s, n, 0
    expect = 4
    for d in reversed(range(1, s.ndim)):
        if s.shape[d] > 1 and s.strides[d] != expect:
            raise ValueError("each snapshot must be C-contiguous")
        expect *= s.shape[d]
    if not s.flags.writeable:
        raise ValueError("snaps is read-only")
    stride = s.strides[0] // 4 if n > 1 else inner_size
    if n > 1 and (s.strides[0] % 4 or stride < inner_size):
        raise ValueError("snapshots overlap")
    return rows, s, n, stride


# ============================================================================ conv

def ssm_conv(x, wT, state, out=None, *, snap_rows=None, snaps=None, nthreads=1):
    """Causal depthwise conv + SiLU over the T rows of x (T, C) with the K-1 rows before them
    in state (K-1, C) (updated in place to the last K-1 inputs).  wT (K, C): tap j of channel c
    multiplies the input j rows before the newest... i.e. out[t] = silu(sum_j wT[j] * xx[t+j])
    with xx = state ++ x.  Returns out (T, C)."""
    cdef int nt = _threads(nthreads)
    xa = _f32(x, "x")
    cdef int64_t xs = _row_stride(xa, "x", False)
    cdef int64_t T = xa.shape[0], C = xa.shape[1]
    wa = _f32(wT, "wT")
    if wa.ndim != 2 or wa.shape[1] != C or wa.shape[0] < 1 or not wa.flags.c_contiguous:
        raise ValueError(f"wT must be C-contiguous (K, {C}), got {np.shape(wa)}")
    cdef int64_t K = wa.shape[0]
    sa = _contig(state, "state", (K - 1, C), True)
    if out is None:
        out = np.empty((T, C), np.float32)
    oa = _f32(out, "out")
    if oa.shape != (T, C):
        raise ValueError(f"out must have shape ({T}, {C}), got {np.shape(oa)}")
    cdef int64_t os = _row_stride(oa, "out", True)
    rows, sn, n_snap_o, stride_o = _snaps(snap_rows, snaps, (K - 1, C), T)
    ra, sna = rows, sn
    cdef int64_t n_snap = n_snap_o, sstride = stride_o
    cdef const gi_ssm_ops *ops = _table()
    cdef const float *xp = <const float *>_ptr(xa)
    cdef const float *wp = <const float *>_ptr(wa)
    cdef float *sp = <float *>_ptr(sa)
    cdef float *op = <float *>_ptr(oa)
    cdef const int32_t *rp = <const int32_t *>_ptr(ra)
    cdef float *snp = <float *>_ptr(sna)
    cdef int64_t nblk = (C + COLS - 1) // COLS, n = nt, i, c0, c1
    if n > nblk:
        n = nblk
    if T * C < _GRAIN:
        n = 1
    if C == 0:
        return out
    with nogil:
        for i in prange(n, num_threads=n, schedule='static'):
            c0 = (nblk * i // n) * COLS
            c1 = (nblk * (i + 1) // n) * COLS
            if c1 > C:
                c1 = C
            ops.conv(xp, xs, wp, sp, op, os, T, C, K, c0, c1, rp, n_snap, snp, sstride)
    return out


# ============================================================================ gated delta rule

def gated_delta(qkv, ab, A, dt_bias, state, n_k_heads, out=None, *, snap_rows=None, snaps=None,
                eps=1e-6, nthreads=1):
    """The gated delta rule over T tokens (recurrent form, token by token).

    qkv (T, >= 2*Hk*dk + Hv*dv): conv outputs q | k | v per row (rows may be strided);
    ab (T, 2*Hv): beta logits | alpha per row; A (Hv,) = -exp(A_log); dt_bias (Hv,);
    state (Hv, dk, dv) updated in place; n_k_heads = Hk (value head h reads key head h % Hk,
    the GGUF order).  q, k are L2-normalized (eps), q scaled by 1/sqrt(dk).
    Returns out (T, Hv*dv)."""
    cdef int nt = _threads(nthreads)
    sa = _f32(state, "state")
    if sa.ndim != 3 or not sa.flags.c_contiguous or not sa.flags.writeable:
        raise ValueError("state must be a writeable C-contiguous (Hv, dk, dv) array")
    cdef int64_t Hv = sa.shape[0], dk = sa.shape[1], dv = sa.shape[2]
    cdef int64_t Hk = int(n_k_heads)
    if Hk < 1 or Hv % Hk:
        raise ValueError(f"{Hv} value heads are not a multiple of {Hk} key heads")
    qa = _f32(qkv, "qkv")
    cdef int64_t qs = _row_stride(qa, "qkv", False)
    cdef int64_t T = qa.shape[0]
    if qa.shape[1] < 2 * Hk * dk + Hv * dv:
        raise ValueError(f"qkv has {qa.shape[1]} columns, needs {2 * Hk * dk + Hv * dv}")
    aba = _f32(ab, "ab")
    cdef int64_t abs_ = _row_stride(aba, "ab", False)
    if aba.shape != (T, 2 * Hv):
        raise ValueError(f"ab must have shape ({T}, {2 * Hv}), got {np.shape(aba)}")
    Aa = _contig(A, "A", (Hv,), False)
    da = _contig(dt_bias, "dt_bias", (Hv,), False)
    if out is None:
        out = np.empty((T, Hv * dv), np.float32)
    oa = _f32(out, "out")
    if oa.ndim == 3 and oa.shape == (T, Hv, dv) and oa.flags.c_contiguous:
        oa = oa.reshape(T, Hv * dv)
    if oa.shape != (T, Hv * dv):
        raise ValueError(f"out must have shape ({T}, {Hv * dv}), got {np.shape(out)}")
    cdef int64_t os = _row_stride(oa, "out", True)
    rows, sn, n_snap_o, stride_o = _snaps(snap_rows, snaps, (Hv, dk, dv), T)
    ra, sna = rows, sn
    cdef int64_t n_snap = n_snap_o, sstride = stride_o
    if T == 0:
        return out
    qn = np.empty((T, Hk, dk), np.float32)
    kn = np.empty((T, Hk, dk), np.float32)
    be = np.empty((T, Hv), np.float32)
    de = np.empty((T, Hv), np.float32)
    cdef const gi_ssm_ops *ops = _table()
    cdef const float *qp = <const float *>_ptr(qa)
    cdef const float *abp = <const float *>_ptr(aba)
    cdef const float *Ap = <const float *>_ptr(Aa)
    cdef const float *dp = <const float *>_ptr(da)
    cdef float *qnp = <float *>_ptr(qn)
    cdef float *knp = <float *>_ptr(kn)
    cdef float *bep = <float *>_ptr(be)
    cdef float *dep = <float *>_ptr(de)
    cdef float *sp = <float *>_ptr(sa)
    cdef float *op = <float *>_ptr(oa)
    cdef const int32_t *rp = <const int32_t *>_ptr(ra)
    cdef float *snp = <float *>_ptr(sna)
    cdef double e = float(eps)
    cdef int64_t n = nt if nt < T else T, i, it, h, j0, j1
    cdef int64_t nj = (dv + COLS - 1) // COLS, n_items = Hv * nj
    with nogil:
        if n <= 1:
            gi_ssm_prep(qp, qs, abp, abs_, Ap, dp, qnp, knp, bep, dep, 0, T, Hk, Hv, dk, e)
        else:
            for i in prange(n, num_threads=n, schedule='static'):
                gi_ssm_prep(qp, qs, abp, abs_, Ap, dp, qnp, knp, bep, dep, T * i // n,
                            T * (i + 1) // n, Hk, Hv, dk, e)
        n = nt if nt < n_items else n_items
        if n <= 1:
            for it in range(n_items):
                h = it // nj
                j0 = (it % nj) * COLS
                j1 = j0 + COLS if j0 + COLS < dv else dv
                ops.delta(qnp, knp, qp + 2 * Hk * dk, qs, bep, dep, sp, op, os, T, Hk, Hv, dk,
                          dv, h, j0, j1, rp, n_snap, snp, sstride)
        else:
            for it in prange(n_items, num_threads=n, schedule='static'):
                h = it // nj
                j0 = (it % nj) * COLS
                j1 = j0 + COLS if j0 + COLS < dv else dv
                ops.delta(qnp, knp, qp + 2 * Hk * dk, qs, bep, dep, sp, op, os, T, Hk, Hv, dk,
                          dv, h, j0, j1, rp, n_snap, snp, sstride)
    return out


# ============================================================================ sigmoid gate

def sigmoid_mul(gate, x, out=None, *, nthreads=1):
    """out = x * sigmoid(gate), computed as x / (1 + exp(-gate)) in float32 (gate, x (M, N),
    rows may be strided; out may be x)."""
    cdef int nt = _threads(nthreads)
    ga = _f32(gate, "gate")
    xa = _f32(x, "x")
    cdef int64_t gs = _row_stride(ga, "gate", False), xs = _row_stride(xa, "x", False)
    if ga.shape != xa.shape:
        raise ValueError(f"gate and x must have the same shape, got {np.shape(ga)} and {np.shape(xa)}")
    if out is None:
        out = np.empty(xa.shape, np.float32)
    oa = _f32(out, "out")
    if oa.shape != xa.shape:
        raise ValueError(f"out must have shape {np.shape(xa)}, got {np.shape(oa)}")
    cdef int64_t os = _row_stride(oa, "out", True)
    cdef int64_t M = xa.shape[0], N = xa.shape[1], i
    cdef int64_t n = nt if nt < M else M
    if M * N < _GRAIN:
        n = 1
    cdef const gi_ssm_ops *ops = _table()
    cdef const float *gp = <const float *>_ptr(ga)
    cdef const float *xp = <const float *>_ptr(xa)
    cdef float *op = <float *>_ptr(oa)
    if M == 0:
        return out
    with nogil:
        if n <= 1:
            ops.sigmoid_mul(gp, gs, xp, xs, op, os, 0, M, N)
        else:
            for i in prange(n, num_threads=n, schedule='static'):
                ops.sigmoid_mul(gp, gs, xp, xs, op, os, M * i // n, M * (i + 1) // n, N)
    return out
