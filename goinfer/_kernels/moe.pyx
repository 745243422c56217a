# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Mixture-of-Experts kernels: moe_route, moe_group, moe_fold (same API as goinfer._reference).

An MoE feed-forward over T rows with k experts per row runs as

    ids, w = moe_route(router_logits, k, mode, norm)      # (T, k) int32, (T, k) float32
    rows, offsets, pos = moe_group(ids, n_expert)          # entries sorted by expert
    # expert e's entries are offsets[e]:offsets[e+1]; their input rows are x[rows[...]];
    # one GEMM per expert writes their outputs to y[offsets[e]:offsets[e+1]]
    out = moe_fold(y, w, pos, renorm=True)                 # (T, D), rank order per row

Every output row depends only on its own logits / entries, in one fixed order, so the
result is the same for any T, any thread count, any variant (docs/design/kernels.md).
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t
from cython.parallel cimport prange
from goinfer._kernels.dispatch cimport GI_AVX2, GI_AVX512, gi_variant
from goinfer._kernels import _config as _cfg

cnp.import_array()

cdef extern from "moe.h" nogil:
    enum:
        GI_MOE_SOFTMAX_TOPK
        GI_MOE_TOPK_SOFTMAX
    ctypedef struct gi_moe_ops:
        void (*route)(const float *logits, int64_t E, int64_t t0, int64_t t1, int k, int mode,
                      int norm, double scale, int32_t *ids, float *w, double *work) noexcept nogil
        void (*fold)(const float *y, int64_t ldy, const float *w, const int32_t *pos, int k,
                     int renorm, const float *sh, int64_t lds, const float *sh_logit, int64_t t0,
                     int64_t t1, int64_t c0, int64_t c1, float *out, int64_t ldo) noexcept nogil
    const gi_moe_ops gi_moe_ops_portable
    const gi_moe_ops gi_moe_ops_avx2
    const gi_moe_ops gi_moe_ops_avx512
    int gi_moe_group(const int32_t *ids, int64_t T, int k, int64_t E, int32_t *rows,
                     int32_t *pos, int64_t *offsets, int64_t *count) noexcept nogil

MODES = {"softmax_topk": GI_MOE_SOFTMAX_TOPK, "topk_softmax": GI_MOE_TOPK_SOFTMAX}

# below this much work per thread (elements), extra threads cost more than they give
cdef int64_t _GRAIN = 32768


cdef const gi_moe_ops *_table() noexcept nogil:
    cdef int v = gi_variant()
    if v == GI_AVX512:
        return &gi_moe_ops_avx512
    if v == GI_AVX2:
        return &gi_moe_ops_avx2
    return &gi_moe_ops_portable


# ============================================================================ argument checks

cdef int _check_threads(object nthreads) except -1:
    if isinstance(nthreads, (int, np.integer)) and not isinstance(nthreads, bool):
        if 1 <= nthreads <= 1024:
            return <int>nthreads
    raise ValueError(f"nthreads must be a positive int, got {nthreads!r}")


cdef cnp.ndarray _arr(object a, str name, int typenum, str tname, tuple shape, bint writeable=False):
    """a must be a C-contiguous ndarray of this dtype and shape (None in shape: any size)."""
    if not cnp.PyArray_Check(a):
        raise TypeError(f"{name} must be a numpy array of {tname}, got {type(a).__name__}")
    cdef cnp.ndarray arr = <cnp.ndarray>a
    if cnp.PyArray_TYPE(arr) != typenum:
        raise TypeError(f"{name} must have dtype {tname}, got {arr.dtype}")
    got = (<object>arr).shape
    if len(got) != len(shape) or any(s is not None and got[i] != s for i, s in enumerate(shape)):
        want = tuple("?" if s is None else s for s in shape)
        raise ValueError(f"{name} must have shape {want}, got {got}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr) or not cnp.PyArray_ISALIGNED(arr):
        raise ValueError(f"{name} must be C-contiguous and aligned")
    if writeable and not cnp.PyArray_ISWRITEABLE(arr):
        raise ValueError(f"{name} is read-only")
    return arr


cdef bint _overlap(cnp.ndarray a, cnp.ndarray b):
    cdef char *a0 = <char *>cnp.PyArray_DATA(a)
    cdef char *b0 = <char *>cnp.PyArray_DATA(b)
    cdef cnp.npy_intp na = cnp.PyArray_NBYTES(a), nb = cnp.PyArray_NBYTES(b)
    return na > 0 and nb > 0 and a0 < b0 + nb and b0 < a0 + na


cdef inline int _nth(int nthreads, int64_t work, int64_t units) noexcept nogil:
    """Threads for `work` elements split into at most `units` pieces."""
    cdef int64_t n = work // _GRAIN if _GRAIN > 0 else nthreads
    if n > nthreads:
        n = nthreads
    if n > units:
        n = units
    return <int>(n if n > 1 else 1)


# ============================================================================ routing

def moe_route(logits, k, mode="softmax_topk", norm=False, scale=1.0, ids=None, weights=None,
              *, nthreads=1):
    """Router logits (T, E) float32 -> (ids (T, k) int32, weights (T, k) float32).

    mode "softmax_topk" (qwen2moe, qwen3moe, olmoe): softmax over all E in float64, then the
    k largest probabilities; norm=True divides them by their sum (rank order, float64).
    mode "topk_softmax" (mixtral): the k largest logits, then softmax over those k (norm is
    implied).  Ties go to the lower expert index; NaN ranks lowest (in softmax_topk a NaN
    logit makes its whole row NaN, so the weights are NaN).  The weights are
    float32(w * scale).  ids[t] lists experts by rank (largest first).  Bit-exact with
    goinfer._reference.moe_route."""
    cdef int nt = _check_threads(nthreads)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    cdef cnp.ndarray la = _arr(logits, "logits", cnp.NPY_FLOAT32, "float32", (None, None))
    cdef int64_t T = la.shape[0], E = la.shape[1]
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 1 <= k <= E:
        raise ValueError(f"k must be an int in [1, {E}] (the number of experts), got {k!r}")
    cdef int kk = <int>k
    if ids is None:
        ids = np.empty((T, kk), np.int32)
    if weights is None:
        weights = np.empty((T, kk), np.float32)
    cdef cnp.ndarray ia = _arr(ids, "ids", cnp.NPY_INT32, "int32", (T, kk), True)
    cdef cnp.ndarray wa = _arr(weights, "weights", cnp.NPY_FLOAT32, "float32", (T, kk), True)
    cdef int md = MODES[mode]
    cdef int nm = 1 if norm else 0
    cdef double sc = float(scale)
    cdef int n = _nth(nt, T * E * 8, T)
    cdef cnp.ndarray work = np.empty((n, max(E, 1)), np.float64)
    cdef const float *lp = <const float *>cnp.PyArray_DATA(la)
    cdef int32_t *ip = <int32_t *>cnp.PyArray_DATA(ia)
    cdef float *wp = <float *>cnp.PyArray_DATA(wa)
    cdef double *kp = <double *>cnp.PyArray_DATA(work)
    cdef const gi_moe_ops *ops = _table()
    cdef int64_t i
    if T == 0:
        return ids, weights
    with nogil:
        if n <= 1:
            ops.route(lp, E, 0, T, kk, md, nm, sc, ip, wp, kp)
        else:
            for i in prange(n, num_threads=n, schedule='static'):
                ops.route(lp, E, T * i // n, T * (i + 1) // n, kk, md, nm, sc, ip, wp, kp + i * E)
    return ids, weights


# ============================================================================ grouping

def moe_group(ids, n_expert, rows=None, offsets=None, pos=None, *, nthreads=1):
    """Sort the T*k routed entries (t, r) by expert (stable: then by t*k + r).

    Returns rows (T*k,) int32 (the row t of each sorted entry), offsets (n_expert + 1,) int64
    (expert e's entries are offsets[e]:offsets[e+1]) and pos (T*k,) int32 (pos[t*k + r] is
    the sorted index of entry (t, r)).  Serial (cheap next to the expert GEMMs)."""
    _check_threads(nthreads)
    cdef cnp.ndarray ia = _arr(ids, "ids", cnp.NPY_INT32, "int32", (None, None))
    cdef int64_t T = ia.shape[0], kk = ia.shape[1], E
    if not isinstance(n_expert, (int, np.integer)) or isinstance(n_expert, bool) or n_expert < 1:
        raise ValueError(f"n_expert must be a positive int, got {n_expert!r}")
    E = n_expert
    if T * kk > 2**31 - 1:
        raise ValueError(f"{T} x {kk} routed entries exceed the int32 index range")
    if rows is None:
        rows = np.empty(T * kk, np.int32)
    if offsets is None:
        offsets = np.empty(E + 1, np.int64)
    if pos is None:
        pos = np.empty(T * kk, np.int32)
    cdef cnp.ndarray ra = _arr(rows, "rows", cnp.NPY_INT32, "int32", (T * kk,), True)
    cdef cnp.ndarray oa = _arr(offsets, "offsets", cnp.NPY_INT64, "int64", (E + 1,), True)
    cdef cnp.ndarray pa = _arr(pos, "pos", cnp.NPY_INT32, "int32", (T * kk,), True)
    cdef cnp.ndarray count = np.empty(E, np.int64)
    cdef int rc
    with nogil:
        rc = gi_moe_group(<const int32_t *>cnp.PyArray_DATA(ia), T, <int>kk, E,
                          <int32_t *>cnp.PyArray_DATA(ra), <int32_t *>cnp.PyArray_DATA(pa),
                          <int64_t *>cnp.PyArray_DATA(oa), <int64_t *>cnp.PyArray_DATA(count))
    if rc != 0:
        raise ValueError(f"ids must lie in [0, {E}), got [{ia.min()}, {ia.max()}]")
    return rows, offsets, pos


# ============================================================================ fold

def moe_fold(y, weights, pos, shared=None, shared_logit=None, renorm=False, out=None, *,
             nthreads=1):
    """out (T, D) float32: each row's expert outputs weighted and summed in rank order.

    y (N, D) float32 holds the expert outputs in sorted order (moe_group), weights (T, k)
    float32, pos (T*k,) int32 indexes y.  Per row t and column c, in float64 (products of
    floats are exact), rounded to float32 once at the end:
        acc = w[t,0]*y[pos[t*k],c];  acc = acc + w[t,r]*y[pos[t*k+r],c]  for r = 1..k-1
        renorm:  acc = acc / (w[t,0] + ... + w[t,k-1])   (routings whose weights sum to 1:
                 cancels their float32 rounding, so k identical experts give exactly one)
        shared:  acc = acc + float32(sigmoid(shared_logit[t])) * shared[t,c]   (qwen2moe)
    Bit-exact with goinfer._reference.moe_fold."""
    cdef int nt = _check_threads(nthreads)
    cdef cnp.ndarray wa = _arr(weights, "weights", cnp.NPY_FLOAT32, "float32", (None, None))
    cdef int64_t T = wa.shape[0], kk = wa.shape[1]
    cdef cnp.ndarray ya = _arr(y, "y", cnp.NPY_FLOAT32, "float32", (None, None))
    cdef int64_t N = ya.shape[0], D = ya.shape[1]
    cdef cnp.ndarray pa = _arr(pos, "pos", cnp.NPY_INT32, "int32", (T * kk,))
    cdef const int32_t *pp = <const int32_t *>cnp.PyArray_DATA(pa)
    cdef int64_t i, bad = -1
    with nogil:
        for i in range(T * kk):
            if pp[i] < 0 or pp[i] >= N:
                bad = i
                break
    if bad >= 0:
        raise ValueError(f"pos[{bad}] = {pp[bad]} is outside the {N} rows of y")
    if (shared is None) != (shared_logit is None):
        raise ValueError("shared and shared_logit go together")
    cdef cnp.ndarray sa = None, ga = None
    cdef const float *sp = NULL
    cdef const float *gp = NULL
    if shared is not None:
        sa = _arr(shared, "shared", cnp.NPY_FLOAT32, "float32", (T, D))
        ga = _arr(shared_logit, "shared_logit", cnp.NPY_FLOAT32, "float32", (T,))
        sp = <const float *>cnp.PyArray_DATA(sa)
        gp = <const float *>cnp.PyArray_DATA(ga)
    if out is None:
        out = np.empty((T, D), np.float32)
    cdef cnp.ndarray oa = _arr(out, "out", cnp.NPY_FLOAT32, "float32", (T, D), True)
    if _overlap(oa, ya) or (sa is not None and _overlap(oa, sa)):
        raise ValueError("out must not overlap y or shared")
    if T == 0 or D == 0:
        return out
    cdef const gi_moe_ops *ops = _table()
    cdef const float *yp = <const float *>cnp.PyArray_DATA(ya)
    cdef const float *wp = <const float *>cnp.PyArray_DATA(wa)
    cdef float *op = <float *>cnp.PyArray_DATA(oa)
    cdef int n = _nth(nt, T * D * (kk + 1), nt)
    cdef int rn = 1 if renorm else 0
    cdef int64_t c0, c1
    with nogil:
        if n <= 1:
            ops.fold(yp, D, wp, pp, <int>kk, rn, sp, D, gp, 0, T, 0, D, op, D)
        elif T >= n:  # split rows
            for i in prange(n, num_threads=n, schedule='static'):
                ops.fold(yp, D, wp, pp, <int>kk, rn, sp, D, gp, T * i // n, T * (i + 1) // n,
                         0, D, op, D)
        else:  # few long rows: split columns (at multiples of 16 floats)
            for i in prange(n, num_threads=n, schedule='static'):
                c0 = (D * i // n) & ~(<int64_t>15)
                c1 = D if i == n - 1 else (D * (i + 1) // n) & ~(<int64_t>15)
                ops.fold(yp, D, wp, pp, <int>kk, rn, sp, D, gp, 0, T, c0, c1, op, D)
    return out


# ============================================================================ test hooks

def _variant_used():
    """Name of the variant whose table this module calls now."""
    cdef const gi_moe_ops *t = _table()
    if t == &gi_moe_ops_avx512:
        return _cfg.VARIANTS[GI_AVX512]
    if t == &gi_moe_ops_avx2:
        return _cfg.VARIANTS[GI_AVX2]
    return _cfg.VARIANTS[0]


def _set_grain(n):
    """Work per thread below which calls stay single-threaded (tests set 0 to force threads).
    Returns the previous value."""
    global _GRAIN
    old = _GRAIN
    _GRAIN = n
    return old
