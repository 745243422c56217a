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
from goinfer._kernels.checks cimport (carray, carray_writeable, check_threads, grain_threads,
                                      swap_grain)
from goinfer._kernels.dispatch cimport variant_table, table_variant
from goinfer._kernels.graph cimport Op, bound, run_shares, share_fn

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


cdef inline const gi_moe_ops *_table() noexcept nogil:
    return <const gi_moe_ops *>variant_table(&gi_moe_ops_portable, &gi_moe_ops_avx2,
                                             &gi_moe_ops_avx512)


# ============================================================================ argument checks

cdef bint _overlap(cnp.ndarray a, cnp.ndarray b):
    cdef char *a0 = <char *>cnp.PyArray_DATA(a)
    cdef char *b0 = <char *>cnp.PyArray_DATA(b)
    cdef cnp.npy_intp na = cnp.PyArray_NBYTES(a), nb = cnp.PyArray_NBYTES(b)
    return na > 0 and nb > 0 and a0 < b0 + nb and b0 < a0 + na


cdef inline int _nth(int nthreads, int64_t work, int64_t units) noexcept nogil:
    """Threads for `work` elements split into at most `units` (>= 1) pieces."""
    cdef int n = grain_threads(_GRAIN, nthreads, work)
    return <int>(n if n < units else units)


# ============================================================================ argument records
# Each kernel is: check the arguments and fill a record (_*_prepare), then run shares 0 ..
# n-1 of it (_*_share), one per OpenMP thread.  The Python functions run the shares at once;
# the bind_* functions keep the record in an Op for graph replay (graph.pyx), where the
# routing of each step is read from the same buffers when the op runs.


# ============================================================================ routing

cdef struct route_args:
    const gi_moe_ops *ops
    const float *logits
    int64_t T, E
    int k, mode, norm
    double scale
    int32_t *ids
    float *w
    double *work  # (n, E): a row per share
    int64_t n


cdef void _route_share(const void *args, int64_t i, int tid) noexcept nogil:
    cdef const route_args *r = <const route_args *>args
    r.ops.route(r.logits, r.E, r.T * i // r.n, r.T * (i + 1) // r.n, r.k, r.mode, r.norm,
                r.scale, r.ids, r.w, r.work + i * r.E)


cdef tuple _route_prepare(route_args *r, object logits, object k, object mode, object norm,
                          object scale, object ids, object weights, int nt):
    """-> (ids, weights, work): work is the record's scratch (keep it alive with the record)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    cdef cnp.ndarray la = carray(logits, "logits", cnp.NPY_FLOAT32, "float32", 2)
    cdef int64_t T = la.shape[0], E = la.shape[1]
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or not 1 <= k <= E:
        raise ValueError(f"k must be an int in [1, {E}] (the number of experts), got {k!r}")
    cdef int kk = <int>k
    if ids is None:
        ids = np.empty((T, kk), np.int32)
    if weights is None:
        weights = np.empty((T, kk), np.float32)
    cdef cnp.ndarray ia = carray_writeable(ids, "ids", cnp.NPY_INT32, "int32", 2, T, kk)
    cdef cnp.ndarray wa = carray_writeable(weights, "weights", cnp.NPY_FLOAT32, "float32", 2, T, kk)
    r.n = _nth(nt, T * E * 8, T) if T > 0 else 0
    work = np.empty((max(r.n, 1), max(E, 1)), np.float64)
    r.ops = _table()
    r.logits = <const float *>cnp.PyArray_DATA(la)
    r.T = T
    r.E = E
    r.k = kk
    r.mode = MODES[mode]
    r.norm = 1 if norm else 0
    r.scale = float(scale)
    r.ids = <int32_t *>cnp.PyArray_DATA(ia)
    r.w = <float *>cnp.PyArray_DATA(wa)
    r.work = <double *>cnp.PyArray_DATA(<cnp.ndarray>work)
    return ids, weights, work


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
    cdef int nt = check_threads(nthreads)
    cdef route_args r
    ids, weights, work = _route_prepare(&r, logits, k, mode, norm, scale, ids, weights, nt)
    run_shares(_route_share, &r, r.n)
    return ids, weights


def bind_moe_route(logits, k, mode="softmax_topk", norm=False, scale=1.0, ids=None,
                   weights=None, *, nthreads=1):
    if ids is None or weights is None:  # (the Op points into them: they must outlive it)
        raise ValueError("a bound moe_route needs ids and weights")
    cdef int nt = check_threads(nthreads)
    cdef route_args tmp
    _, _, work = _route_prepare(&tmp, logits, k, mode, norm, scale, ids, weights, nt)
    cdef void *rec
    cdef Op op = bound("moe_route", (logits, ids, weights, work), _route_share,
                       sizeof(route_args), &rec)
    (<route_args *>rec)[0] = tmp
    op.op.nshares = tmp.n
    return op


# ============================================================================ grouping

cdef struct group_args:
    const int32_t *ids
    int64_t T, k, E
    int32_t *rows
    int32_t *pos
    int64_t *offsets
    int64_t *count  # (E,) scratch
    int rc


cdef void _group_share(const void *args, int64_t i, int tid) noexcept nogil:
    cdef group_args *r = <group_args *>args
    r.rc = gi_moe_group(r.ids, r.T, <int>r.k, r.E, r.rows, r.pos, r.offsets, r.count)


cdef tuple _group_prepare(group_args *r, object ids, object n_expert, object rows,
                          object offsets, object pos):
    """-> (rows, offsets, pos, count): count is the record's scratch."""
    cdef cnp.ndarray ia = carray(ids, "ids", cnp.NPY_INT32, "int32", 2)
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
    cdef cnp.ndarray ra = carray_writeable(rows, "rows", cnp.NPY_INT32, "int32", 1, T * kk)
    cdef cnp.ndarray oa = carray_writeable(offsets, "offsets", cnp.NPY_INT64, "int64", 1, E + 1)
    cdef cnp.ndarray pa = carray_writeable(pos, "pos", cnp.NPY_INT32, "int32", 1, T * kk)
    count = np.empty(E, np.int64)
    r.ids = <const int32_t *>cnp.PyArray_DATA(ia)
    r.T = T
    r.k = kk
    r.E = E
    r.rows = <int32_t *>cnp.PyArray_DATA(ra)
    r.pos = <int32_t *>cnp.PyArray_DATA(pa)
    r.offsets = <int64_t *>cnp.PyArray_DATA(oa)
    r.count = <int64_t *>cnp.PyArray_DATA(<cnp.ndarray>count)
    r.rc = 0
    return rows, offsets, pos, count


def moe_group(ids, n_expert, rows=None, offsets=None, pos=None, *, nthreads=1):
    """Sort the T*k routed entries (t, r) by expert (stable: then by t*k + r).

    Returns rows (T*k,) int32 (the row t of each sorted entry), offsets (n_expert + 1,) int64
    (expert e's entries are offsets[e]:offsets[e+1]) and pos (T*k,) int32 (pos[t*k + r] is
    the sorted index of entry (t, r)).  Serial (cheap next to the expert GEMMs)."""
    check_threads(nthreads)
    cdef group_args r
    rows, offsets, pos, count = _group_prepare(&r, ids, n_expert, rows, offsets, pos)
    run_shares(_group_share, &r, 1)
    if r.rc != 0:
        raise ValueError(f"ids must lie in [0, {n_expert}), got [{np.min(ids)}, {np.max(ids)}]")
    return rows, offsets, pos


def bind_moe_group(ids, n_expert, rows=None, offsets=None, pos=None, *, nthreads=1):
    """The caller keeps ids inside [0, n_expert) for every run (moe_route's are)."""
    if rows is None or offsets is None or pos is None:
        raise ValueError("a bound moe_group needs rows, offsets and pos")
    check_threads(nthreads)
    cdef group_args tmp
    _, _, _, count = _group_prepare(&tmp, ids, n_expert, rows, offsets, pos)
    cdef void *rec
    cdef Op op = bound("moe_group", (ids, rows, offsets, pos, count), _group_share,
                       sizeof(group_args), &rec)
    (<group_args *>rec)[0] = tmp
    op.op.nshares = 1
    return op


# ============================================================================ fold

cdef struct fold_args:
    const gi_moe_ops *ops
    const float *y
    const float *w
    const int32_t *pos
    const float *sh
    const float *sh_logit
    float *out
    int64_t T, D, k, n
    int renorm, by_rows


cdef void _fold_share(const void *args, int64_t i, int tid) noexcept nogil:
    cdef const fold_args *r = <const fold_args *>args
    cdef int64_t c0, c1
    if r.by_rows:
        r.ops.fold(r.y, r.D, r.w, r.pos, <int>r.k, r.renorm, r.sh, r.D, r.sh_logit,
                   r.T * i // r.n, r.T * (i + 1) // r.n, 0, r.D, r.out, r.D)
    else:  # few long rows: split columns (at multiples of 16 floats)
        c0 = (r.D * i // r.n) & ~(<int64_t>15)
        c1 = r.D if i == r.n - 1 else (r.D * (i + 1) // r.n) & ~(<int64_t>15)
        r.ops.fold(r.y, r.D, r.w, r.pos, <int>r.k, r.renorm, r.sh, r.D, r.sh_logit,
                   0, r.T, c0, c1, r.out, r.D)


cdef object _fold_prepare(fold_args *r, object y, object weights, object pos, object shared,
                          object shared_logit, object renorm, object out, int nt, bint check_pos):
    cdef cnp.ndarray wa = carray(weights, "weights", cnp.NPY_FLOAT32, "float32", 2)
    cdef int64_t T = wa.shape[0], kk = wa.shape[1]
    cdef cnp.ndarray ya = carray(y, "y", cnp.NPY_FLOAT32, "float32", 2)
    cdef int64_t N = ya.shape[0], D = ya.shape[1]
    cdef cnp.ndarray pa = carray(pos, "pos", cnp.NPY_INT32, "int32", 1, T * kk)
    cdef const int32_t *pp = <const int32_t *>cnp.PyArray_DATA(pa)
    cdef int64_t i, bad = -1
    if check_pos:
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
    r.sh = NULL
    r.sh_logit = NULL
    if shared is not None:
        sa = carray(shared, "shared", cnp.NPY_FLOAT32, "float32", 2, T, D)
        ga = carray(shared_logit, "shared_logit", cnp.NPY_FLOAT32, "float32", 1, T)
        r.sh = <const float *>cnp.PyArray_DATA(sa)
        r.sh_logit = <const float *>cnp.PyArray_DATA(ga)
    if out is None:
        out = np.empty((T, D), np.float32)
    cdef cnp.ndarray oa = carray_writeable(out, "out", cnp.NPY_FLOAT32, "float32", 2, T, D)
    if _overlap(oa, ya) or (sa is not None and _overlap(oa, sa)):
        raise ValueError("out must not overlap y or shared")
    r.ops = _table()
    r.y = <const float *>cnp.PyArray_DATA(ya)
    r.w = <const float *>cnp.PyArray_DATA(wa)
    r.pos = pp
    r.out = <float *>cnp.PyArray_DATA(oa)
    r.T = T
    r.D = D
    r.k = kk
    r.renorm = 1 if renorm else 0
    r.n = 0 if T == 0 or D == 0 else _nth(nt, T * D * (kk + 1), nt)
    r.by_rows = r.n <= 1 or T >= r.n
    return out


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
    cdef int nt = check_threads(nthreads)
    cdef fold_args r
    out = _fold_prepare(&r, y, weights, pos, shared, shared_logit, renorm, out, nt, True)
    run_shares(_fold_share, &r, r.n)
    return out


def bind_moe_fold(y, weights, pos, shared=None, shared_logit=None, renorm=False, out=None, *,
                  nthreads=1):
    """The caller keeps pos inside the rows of y for every run (moe_group's are)."""
    if out is None:
        raise ValueError("a bound moe_fold needs out")
    cdef int nt = check_threads(nthreads)
    cdef void *rec
    cdef Op op = bound("moe_fold", (y, weights, pos, shared, shared_logit, out), _fold_share,
                       sizeof(fold_args), &rec)
    _fold_prepare(<fold_args *>rec, y, weights, pos, shared, shared_logit, renorm, out, nt, False)
    op.op.nshares = (<fold_args *>rec).n
    return op


# ============================================================================ test hooks

def _variant_used():
    """Name of the variant whose table this module calls now."""
    return table_variant(_table(), &gi_moe_ops_portable, &gi_moe_ops_avx2, &gi_moe_ops_avx512)


def _set_grain(n):
    """Work per thread below which calls stay single-threaded (tests set 0 to force threads).
    Returns the previous value."""
    return swap_grain(&_GRAIN, n)
