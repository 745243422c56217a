# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Exact and fast attention over the paged KV cache, and the KV-cache write.

Same names, signatures and meaning as goinfer._reference.kv_write / attention; the exact
numerics contract is in docs/design/kernels.md and src/attention_impl.c.

Per layer:  k_cache (n_blocks, n_kv, hd, bs), v_cache (n_blocks, n_kv, bs, hd), both
C-contiguous, float32 or float16; or q8_0 as int8 with the scales in extra rows:
k_cache (n_blocks, n_kv, hd + hd/16, bs), v_cache (n_blocks, n_kv, bs, hd + hd/16)
(src/kv_types.h, goinfer.kv_cache.kv_shapes).  kv_write rounds k and v once to the cache's
type; both kernels compute on the stored values.  Supported: hd a multiple of 8 (64, 128,
256, ...; of 32 for q8_0), any bs >= 1, any H that is a multiple of n_kv (GQA / MQA).

Numerics: float64 accumulation in d order (QK) and key order (l and AV) as kernels.md says;
each softmax weight is the kernel's own exp with its significand cut to 29 bits, so that
weight * v is exact in double and every ISA variant (FMA or not) gives the same bits.  A
query's output does not depend on the batch, the thread count or the variant.

attention_fast: float32 tiles with an online softmax, for long prefills; a bounded distance
from attention (src/attention_fast_impl.c).  attention_counters() / reset_attention_counters():
how many calls and query rows each kernel ran (non-vacuity checks in tests).

Note: ``from goinfer._kernels import attention`` is the function; this module (with the test
hooks _exp_f64, _tanh_f64, _weight_f64, _set_grain, _variant_used) is
``importlib.import_module("goinfer._kernels.attention")``.
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t
from libc.stdlib cimport calloc, free
from libc.math cimport isfinite
from cython.parallel cimport prange, threadid
from goinfer._kernels.checks cimport (carray, carray_writeable, check_threads, check_writeable,
                                      swap_grain)
from goinfer._kernels.dispatch cimport variant_table, table_variant
from goinfer._kernels.graph cimport Op

cnp.import_array()

cdef extern from "<stdlib.h>" nogil:
    void *aligned_alloc(size_t alignment, size_t size)

cdef extern from "attention.h" nogil:
    int gi_attn_timing
    int64_t gi_attn_phase_ns[3]
    ctypedef struct gi_attn_args:
        const float *q
        const void *k_cache
        const void *v_cache
        int kv_dtype
        const int32_t *block_table
        const int32_t *q_pos
        float *out
        int64_t T, H, n_kv, hd, bs
        double scale
        double softcap
        int64_t window
        const float *sinks
        int64_t tq, nh, nparts, n_items, scratch_doubles
        int split_ok
        int64_t max_pos, kchunks, kvspan, shared_bytes
        void *shared
    ctypedef struct gi_attn_ops:
        void (*plan)(gi_attn_args *a, int nthreads) noexcept nogil
        void (*run)(const gi_attn_args *a, int64_t item, double *scratch) noexcept nogil
        void (*kv_write)(void *k_cache, void *v_cache, int kv_dtype, const float *k,
                         const float *v, const int64_t *slots, int64_t T, int64_t n_kv,
                         int64_t hd, int64_t bs, int64_t h0, int64_t h1) noexcept nogil
        void (*exp_f64)(const double *x, double *y, int64_t n) noexcept nogil
        void (*tanh_f64)(const double *x, double *y, int64_t n) noexcept nogil
        void (*weight_f64)(const double *x, double *y, int64_t n) noexcept nogil
    const gi_attn_ops gi_attn_ops_portable
    const gi_attn_ops gi_attn_ops_avx2
    const gi_attn_ops gi_attn_ops_avx512
    ctypedef struct gi_attn_fast_ops:
        void (*plan)(gi_attn_args *a, int nthreads) noexcept nogil
        void (*run)(const gi_attn_args *a, int64_t item, double *scratch) noexcept nogil
        int64_t (*share)(const gi_attn_args *a, int64_t s, int64_t nshares, double *scratch,
                         int64_t *items) noexcept nogil
    const gi_attn_fast_ops gi_attn_fast_ops_portable
    const gi_attn_fast_ops gi_attn_fast_ops_avx2
    const gi_attn_fast_ops gi_attn_fast_ops_avx512

# below this much work (multiply-adds) a call runs on one thread
cdef int64_t _GRAIN = 65536


cdef inline const gi_attn_ops *_table() noexcept nogil:
    return <const gi_attn_ops *>variant_table(&gi_attn_ops_portable, &gi_attn_ops_avx2,
                                              &gi_attn_ops_avx512)


cdef inline const gi_attn_fast_ops *_fast_table() noexcept nogil:
    return <const gi_attn_fast_ops *>variant_table(&gi_attn_fast_ops_portable,
                                                   &gi_attn_fast_ops_avx2,
                                                   &gi_attn_fast_ops_avx512)


# ============================================================================ argument checks

cdef inline int64_t _dim(cnp.ndarray a, int i) noexcept:
    return cnp.PyArray_DIMS(a)[i]


# cache storage types (src/kv_types.h): numpy dtype -> code
cdef enum:
    KV_F32 = 0
    KV_F16 = 1
    KV_Q8_0 = 2


cdef tuple _check_caches(object k_cache, object v_cache):
    """-> (kc, vc, kv_dtype, hd, bs) after checking the caches' types and shapes"""
    if not cnp.PyArray_Check(k_cache) or not cnp.PyArray_Check(v_cache):
        raise TypeError(f"k_cache and v_cache must be numpy arrays, got "
                        f"{type(k_cache).__name__} and {type(v_cache).__name__}")
    cdef int typenum = cnp.PyArray_TYPE(<cnp.ndarray>k_cache)
    cdef int dt
    if typenum == cnp.NPY_FLOAT32:
        dt = KV_F32
    elif typenum == cnp.NPY_FLOAT16:
        dt = KV_F16
    elif typenum == cnp.NPY_INT8:
        dt = KV_Q8_0
    else:
        raise TypeError(f"k_cache must be float32, float16 or int8 (q8_0), got {k_cache.dtype}")
    tname = str(k_cache.dtype)
    cdef cnp.ndarray kc = carray(k_cache, "k_cache", typenum, tname, 4)
    cdef cnp.ndarray vc = carray(v_cache, "v_cache", typenum, tname, 4)
    cdef int64_t nb = _dim(kc, 0), n_kv = _dim(kc, 1), rows = _dim(kc, 2), bs = _dim(kc, 3)
    cdef int64_t hd = rows
    if dt == KV_Q8_0:  # rows = hd + hd/16 (the scale rows)
        hd = rows * 16 // 17
        if hd % 32 != 0 or hd + hd // 16 != rows:
            raise ValueError(f"a q8_0 k_cache has hd + hd/16 rows with hd a multiple of 32, "
                             f"got {rows}")
    if _dim(vc, 0) != nb or _dim(vc, 1) != n_kv or _dim(vc, 2) != bs or _dim(vc, 3) != rows:
        raise ValueError(f"v_cache must have shape (n_blocks, n_kv, bs, {rows}) = "
                         f"{(nb, n_kv, bs, rows)} to match k_cache {np.shape(kc)}, got "
                         f"{np.shape(vc)}")
    if hd % 8 != 0 or hd == 0:
        raise ValueError(f"head_dim must be a positive multiple of 8, got {hd}")
    if bs < 1 or n_kv < 1:
        raise ValueError(f"empty cache shape {np.shape(kc)}")
    return kc, vc, dt, hd, bs


# ============================================================================ KV write

cdef struct kvw_args:
    const gi_attn_ops *ops
    void *kc
    void *vc
    int dt
    const float *k
    const float *v
    const int64_t *slots
    int64_t T, n_kv, hd, bs, n


cdef void _kvw_share(const void *args, int64_t i, int tid) noexcept nogil:
    # threads own disjoint kv heads; each writes its tokens in order
    cdef const kvw_args *r = <const kvw_args *>args
    r.ops.kv_write(r.kc, r.vc, r.dt, r.k, r.v, r.slots, r.T, r.n_kv, r.hd, r.bs,
                   r.n_kv * i // r.n, r.n_kv * (i + 1) // r.n)


cdef int _kvw_prepare(kvw_args *r, object k_cache, object v_cache, object k, object v,
                      object slots, int nt) except -1:
    cdef cnp.ndarray kc, vc
    cdef int dt
    cdef int64_t hd, bs
    kc, vc, dt, hd, bs = _check_caches(k_cache, v_cache)
    cdef int64_t nb = _dim(kc, 0), n_kv = _dim(kc, 1)
    check_writeable(kc, "k_cache")
    check_writeable(vc, "v_cache")
    cdef cnp.ndarray ka = carray(k, "k", cnp.NPY_FLOAT32, "float32", 3)
    cdef cnp.ndarray va = carray(v, "v", cnp.NPY_FLOAT32, "float32", 3)
    cdef cnp.ndarray sa = carray(slots, "slots", cnp.NPY_INT64, "int64", 1)
    cdef int64_t T = _dim(ka, 0)
    if (_dim(ka, 1) != n_kv or _dim(ka, 2) != hd or _dim(va, 0) != T or _dim(va, 1) != n_kv
            or _dim(va, 2) != hd):
        raise ValueError(f"k and v must have shape (T, n_kv, hd) = (T, {n_kv}, {hd}), got "
                         f"{np.shape(ka)} and {np.shape(va)}")
    if _dim(sa, 0) != T:
        raise ValueError(f"slots must have shape ({T},), got {np.shape(sa)}")
    r.n = 0
    if T == 0:
        return 0
    cdef const int64_t *sp = <const int64_t *>cnp.PyArray_DATA(sa)
    cdef int64_t smin = sp[0], smax = sp[0], i
    for i in range(T):
        smin = sp[i] if sp[i] < smin else smin
        smax = sp[i] if sp[i] > smax else smax
    if smin < 0 or smax >= nb * bs:
        raise ValueError(f"slots must lie in [0, {nb * bs}), got [{smin}, {smax}]")
    r.kc = cnp.PyArray_DATA(kc)
    r.vc = cnp.PyArray_DATA(vc)
    r.dt = dt
    r.k = <const float *>cnp.PyArray_DATA(ka)
    r.v = <const float *>cnp.PyArray_DATA(va)
    r.slots = sp
    r.ops = _table()
    r.T = T
    r.n_kv = n_kv
    r.hd = hd
    r.bs = bs
    cdef int n = nt
    if n > n_kv:
        n = <int>n_kv
    if T * n_kv * hd < _GRAIN:
        n = 1
    r.n = n if n > 1 else 1
    return 0


def kv_write(k_cache, v_cache, k, v, slots, *, nthreads=1):
    """Store k, v (T, n_kv, hd) float32 at slots (T,) int64 (slot = block * bs + offset),
    rounded once to the cache's type (float16: to nearest even; q8_0: per 32 values of one
    token, src/kv_types.h).  Tokens are written in order, so a repeated slot keeps the last."""
    cdef int nt = check_threads(nthreads)
    cdef kvw_args r
    _kvw_prepare(&r, k_cache, v_cache, k, v, slots, nt)
    cdef int64_t i
    with nogil:
        if r.n == 1:
            _kvw_share(&r, 0, 0)
        elif r.n > 1:
            for i in prange(r.n, num_threads=r.n, schedule='static'):
                _kvw_share(&r, i, <int>i)


def bind_kv_write(k_cache, v_cache, k, v, slots, *, nthreads=1):
    """The caller keeps slots inside the cache for every run."""
    cdef int nt = check_threads(nthreads)
    cdef Op op = Op("kv_write", (k_cache, v_cache, k, v, slots))
    cdef kvw_args *r = <kvw_args *>op.alloc(sizeof(kvw_args))
    _kvw_prepare(r, k_cache, v_cache, k, v, slots, nt)
    op.op.run = _kvw_share
    op.op.nshares = r.n
    return op


# ============================================================================ attention

# Per-process counters of attention calls and query rows, per kernel (tests prove with them
# that the fast kernel ran where it should and not elsewhere).  Updated with the GIL held.
cdef int64_t _exact_calls = 0, _exact_queries = 0, _fast_calls = 0, _fast_queries = 0


def attention_phase_timing(on):
    """Turn the attention kernels' phase timers on or off (goinfer profile); returns the old
    setting.  Timing reads a clock around each phase of each work item; results are unchanged."""
    global gi_attn_timing
    old = bool(gi_attn_timing)
    gi_attn_timing = 1 if on else 0
    return old


def attention_phase_seconds(reset=False):
    """{"qk", "softmax", "av"}: thread-seconds both attention kernels spent in each phase while
    the timers were on (summed over threads; QK includes gathering the keys)."""
    res = {"qk": gi_attn_phase_ns[0] * 1e-9, "softmax": gi_attn_phase_ns[1] * 1e-9,
           "av": gi_attn_phase_ns[2] * 1e-9}
    if reset:
        gi_attn_phase_ns[0] = gi_attn_phase_ns[1] = gi_attn_phase_ns[2] = 0
    return res


def attention_counters():
    """{"exact_calls", "exact_queries", "fast_calls", "fast_queries"}: calls of attention /
    attention_fast with at least one query, and the queries (rows of q, T) they computed,
    since the process started or the last reset_attention_counters()."""
    return {"exact_calls": _exact_calls, "exact_queries": _exact_queries,
            "fast_calls": _fast_calls, "fast_queries": _fast_queries}


def reset_attention_counters():
    global _exact_calls, _exact_queries, _fast_calls, _fast_queries
    _exact_calls = _exact_queries = _fast_calls = _fast_queries = 0


cdef object _sinks(object sinks, int64_t H):
    """None, or a C-contiguous float32 (H,) array of finite values or -inf (checked)."""
    if sinks is None:
        return None
    cdef cnp.ndarray sa = carray(sinks, "sinks", cnp.NPY_FLOAT32, "float32", 1)
    if _dim(sa, 0) != H:
        raise ValueError(f"sinks must have shape ({H},), one per query head, got {np.shape(sa)}")
    if np.isnan(sa).any() or (sa == np.inf).any():
        raise ValueError("sinks must be finite or -inf (no sink)")
    return sa


cdef object _prepare(gi_attn_args *a, object q, object k_cache, object v_cache,
                     object block_table, object q_pos, object scale, object window,
                     object softcap, object out, int64_t *pmax_out, object sinks=None):
    """Check the arguments of attention / attention_fast and fill a (and *pmax_out, the
    largest query position); returns out.  The caller keeps `sinks` alive while a is used."""
    cdef cnp.ndarray kc, vc
    cdef int dt
    cdef int64_t hd, bs
    kc, vc, dt, hd, bs = _check_caches(k_cache, v_cache)
    cdef int64_t nb = _dim(kc, 0), n_kv = _dim(kc, 1)
    cdef cnp.ndarray qa = carray(q, "q", cnp.NPY_FLOAT32, "float32", 3)
    cdef int64_t T = _dim(qa, 0), H = _dim(qa, 1)
    if _dim(qa, 2) != hd:
        raise ValueError(f"q head_dim {_dim(qa, 2)} != cache head_dim {hd}")
    if H < 1 or H % n_kv != 0:
        raise ValueError(f"the number of query heads ({H}) must be a positive multiple of the "
                         f"number of kv heads ({n_kv})")
    cdef cnp.ndarray bt = carray(block_table, "block_table", cnp.NPY_INT32, "int32", 1)
    cdef cnp.ndarray pa = carray(q_pos, "q_pos", cnp.NPY_INT32, "int32", 1)
    if _dim(pa, 0) != T:
        raise ValueError(f"q_pos must have shape ({T},), got {np.shape(pa)}")
    cdef double sc = float(scale), cap = float(softcap)
    if not isfinite(sc):
        raise ValueError(f"scale must be finite, got {scale!r}")
    if not isfinite(cap) or cap < 0:
        raise ValueError(f"softcap must be >= 0 (0: off), got {softcap!r}")
    if not isinstance(window, (int, np.integer)) or window < 0:
        raise ValueError(f"window must be an int >= 0 (0: off), got {window!r}")
    sk = _sinks(sinks, H)
    a.sinks = <const float *>cnp.PyArray_DATA(<cnp.ndarray>sk) if sk is not None else NULL
    if out is None:
        out = np.empty((T, H, hd), dtype=np.float32)
    cdef cnp.ndarray oa = carray_writeable(out, "out", cnp.NPY_FLOAT32, "float32", 3)
    if _dim(oa, 0) != T or _dim(oa, 1) != H or _dim(oa, 2) != hd:
        raise ValueError(f"out must have shape {np.shape(qa)}, got {np.shape(oa)}")
    a.T = T
    a.split_ok = 0
    a.max_pos = 0
    a.kchunks = 1
    a.kvspan = 1
    a.shared_bytes = 0
    a.shared = NULL
    if T == 0:
        return out
    cdef const int32_t *pp = <const int32_t *>cnp.PyArray_DATA(pa)
    cdef const int32_t *bp = <const int32_t *>cnp.PyArray_DATA(bt)
    cdef int64_t pmin = pp[0], pmax = pp[0], i, bmin, bmax
    for i in range(T):
        pmin = pp[i] if pp[i] < pmin else pmin
        pmax = pp[i] if pp[i] > pmax else pmax
    if pmin < 0:
        raise ValueError(f"q_pos must be >= 0, got {pmin}")
    cdef int64_t need = pmax // bs + 1
    if need > _dim(bt, 0):
        raise ValueError(f"position {pmax} needs {need} blocks, block_table has {_dim(bt, 0)}")
    bmin = bp[0]
    bmax = bp[0]
    for i in range(need):
        bmin = bp[i] if bp[i] < bmin else bmin
        bmax = bp[i] if bp[i] > bmax else bmax
    if bmin < 0 or bmax >= nb:
        raise ValueError(f"block ids must lie in [0, {nb}), got [{bmin}, {bmax}]")

    a.q = <const float *>cnp.PyArray_DATA(qa)
    a.k_cache = cnp.PyArray_DATA(kc)
    a.v_cache = cnp.PyArray_DATA(vc)
    a.kv_dtype = dt
    a.block_table = bp
    a.q_pos = pp
    a.out = <float *>cnp.PyArray_DATA(oa)
    a.H = H
    a.n_kv = n_kv
    a.hd = hd
    a.bs = bs
    a.scale = sc
    a.softcap = cap
    a.window = window
    pmax_out[0] = pmax
    return out


ctypedef void (*plan_fn)(gi_attn_args *a, int nthreads) noexcept nogil
ctypedef void (*run_fn)(const gi_attn_args *a, int64_t item, double *scratch) noexcept nogil
ctypedef int64_t (*share_fn)(const gi_attn_args *a, int64_t s, int64_t nshares, double *scratch,
                             int64_t *items) noexcept nogil


cdef int _run_items(gi_attn_args *a, plan_fn plan, run_fn run, int nt, int64_t pmax) except -1:
    """Plan and run every work item of a, on up to nt threads (one scratch per thread; the
    memory a split fast plan shares between items, zeroed)."""
    cdef int n = nt
    if a.T * a.H * (pmax + 1) * a.hd < _GRAIN:
        n = 1
    a.split_ok = 1
    plan(a, n)
    if n > a.n_items:
        n = <int>a.n_items
    cdef int64_t per = (a.scratch_doubles + 7) & ~(<int64_t>7)  # 64-byte aligned slices
    cdef double *scratch = <double *>aligned_alloc(64, <size_t>(per * n * 8))
    if scratch == NULL:
        raise MemoryError(f"attention scratch of {per * n * 8} bytes")
    if a.shared_bytes > 0:
        a.shared = calloc(<size_t>a.shared_bytes, 1)
        if a.shared == NULL:
            free(scratch)
            raise MemoryError(f"attention partials of {a.shared_bytes} bytes")
    cdef int64_t it
    try:
        with nogil:
            if n <= 1:
                for it in range(a.n_items):
                    run(a, it, scratch)
            else:
                for it in prange(a.n_items, num_threads=n, schedule='dynamic', chunksize=1):
                    run(a, it, scratch + threadid() * per)
    finally:
        free(scratch)
        free(a.shared)
        a.shared = NULL
    return 0


def attention(q, k_cache, v_cache, block_table, q_pos, scale, window=0, softcap=0.0, out=None,
              *, nthreads=1, sinks=None):
    """Causal exact attention of q (T, H, hd) float32 at positions q_pos (T,) int32 over the
    sequence's cached keys (block_table (n,) int32).  Query head h reads kv head h // (H/n_kv).
    Query t sees keys p with lo <= p <= q_pos[t], lo = max(0, q_pos[t] - window + 1) if
    window > 0 else 0.  softcap > 0: s = softcap * tanh(s / softcap).  sinks (H,) float32:
    a logit per query head that joins the softmax's denominator only (gpt-oss; -inf: none).
    Keys 0..max(q_pos) must have been written (kv_write).  Returns out (T, H, hd) float32."""
    global _exact_calls, _exact_queries
    cdef int nt = check_threads(nthreads)
    cdef gi_attn_args a
    cdef int64_t pmax = 0
    out = _prepare(&a, q, k_cache, v_cache, block_table, q_pos, scale, window, softcap, out,
                   &pmax, sinks)
    if a.T == 0:
        return out
    _exact_calls += 1
    _exact_queries += a.T
    cdef const gi_attn_ops *ops = _table()
    _run_items(&a, ops.plan, ops.run, nt, pmax)
    return out


def attention_fast(q, k_cache, v_cache, block_table, q_pos, scale, window=0, softcap=0.0,
                   out=None, *, nthreads=1, sinks=None):
    """Fast attention: the same arguments and result as attention(), computed in float32 with
    key tiles and an online softmax (flash-style), in parallel over (kv head, query block).
    Not bit-exact: its distance from attention() is a cosine bound (docs/design/kernels.md).
    A query's result does not depend on the other queries of the call or on nthreads."""
    global _fast_calls, _fast_queries
    cdef int nt = check_threads(nthreads)
    cdef gi_attn_args a
    cdef int64_t pmax = 0
    out = _prepare(&a, q, k_cache, v_cache, block_table, q_pos, scale, window, softcap, out,
                   &pmax, sinks)
    if a.T == 0:
        return out
    _fast_calls += 1
    _fast_queries += a.T
    cdef const gi_attn_fast_ops *ops = _fast_table()
    _run_items(&a, ops.plan, ops.run, nt, pmax)
    return out


# ============================================================================ bind (graph replay)
# A bound attention's work items are striped over nshares shares (item i in share
# i % nshares; the fast kernel's split items in runs of consecutive chunks, its share()); an
# item is never split, so the result is the dynamic schedule's.  The scratch
# is a float64 buffer (threads, per) given by the caller: row tid serves the thread running a
# share, so one buffer can serve every bound attention of a graph.  attention_scratch() sizes
# a row for the largest position the op will ever see.


cdef struct att_args:
    gi_attn_args a
    run_fn run
    share_fn share  # the fast kernel's (NULL: striped)
    double *scratch
    int64_t per, nshares


cdef void _att_share(const void *args, int64_t s, int tid) noexcept nogil:
    cdef const att_args *r = <const att_args *>args
    cdef int64_t it = s
    cdef double *sc = r.scratch + tid * r.per
    if r.share != NULL:
        r.share(&r.a, s, r.nshares, sc, NULL)
        return
    while it < r.a.n_items:
        r.run(&r.a, it, sc)
        it += r.nshares


cdef int _bind_shared(Op op, gi_attn_args *a) except -1:
    """The memory a split fast plan shares between its items (zeroed; each run leaves its
    counters at 0, so one buffer serves every run), kept alive by the op."""
    if a.shared_bytes <= 0:
        return 0
    cdef cnp.ndarray buf = np.zeros(a.shared_bytes + 64, np.uint8)
    cdef size_t addr = <size_t>cnp.PyArray_DATA(buf)
    a.shared = <void *>(<char *>cnp.PyArray_DATA(buf) + (64 - addr % 64) % 64)
    op.refs = op.refs + (buf,)
    return 0


cdef int _att_threads(gi_attn_args *a, int nt, int64_t pmax):
    return 1 if a.T * a.H * (pmax + 1) * a.hd < _GRAIN else nt


cdef int64_t _plan_bound(gi_attn_args *a, int nt, int64_t pmax, int64_t max_pos, bint fast):
    """Plan a as a bound op on nt threads for positions up to max_pos (the fast plan may
    split keys: sized for max_pos, with shared memory); returns the op's shares."""
    cdef int n = _att_threads(a, nt, pmax)
    a.split_ok = 1
    a.max_pos = max_pos
    if fast:
        _fast_table().plan(a, n)
    else:
        _table().plan(a, n)
    return n if n < a.n_items else a.n_items


def attention_scratch(q, k_cache, v_cache, block_table, q_pos, scale, window=0, softcap=0.0,
                      out=None, *, nthreads=1, max_pos, fast=False, sinks=None):
    """Doubles of scratch per thread a bound attention (fast: attention_fast) over these
    arguments needs for any query positions up to max_pos."""
    cdef int nt = check_threads(nthreads)
    cdef gi_attn_args a
    cdef int64_t pmax = 0
    _prepare(&a, q, k_cache, v_cache, block_table, q_pos, scale, window, softcap, out, &pmax,
             sinks)
    if a.T == 0:
        return 0
    # the widest key range: every query at max_pos, no window
    cdef cnp.ndarray worst = np.full(a.T, max_pos, np.int32)
    a.q_pos = <const int32_t *>cnp.PyArray_DATA(worst)
    a.window = 0
    _plan_bound(&a, nt, pmax, max_pos, fast)  # as _bind plans it
    return (a.scratch_doubles + 7) & ~(<int64_t>7)


cdef object _bind(str name, bint fast, object q, object k_cache, object v_cache,
                  object block_table, object q_pos, object scale, object window, object softcap,
                  object out, object nthreads, object scratch, object max_pos, object sinks):
    """bind_attention / bind_attention_fast: the kernel's work items as an Op."""
    cdef int nt = check_threads(nthreads)
    cdef Op op = Op(name, (q, k_cache, v_cache, block_table, q_pos, out, scratch, sinks))
    cdef att_args *r = <att_args *>op.alloc(sizeof(att_args))
    cdef int64_t pmax = 0
    if out is None:
        raise ValueError("a bound attention needs out")
    _prepare(&r.a, q, k_cache, v_cache, block_table, q_pos, scale, window, softcap, out, &pmax,
             sinks)
    if r.a.T == 0:
        return op
    if max_pos < pmax or max_pos // r.a.bs >= _dim(<cnp.ndarray>block_table, 0):
        raise ValueError(f"max_pos {max_pos} is below the current positions or beyond the "
                         f"block table")
    need_per = attention_scratch(q, k_cache, v_cache, block_table, q_pos, scale, window,
                                 softcap, out, nthreads=nt, max_pos=max_pos, fast=fast)
    cdef cnp.ndarray sa = carray_writeable(scratch, "scratch", cnp.NPY_FLOAT64, "float64", 2)
    if _dim(sa, 0) < nt or _dim(sa, 1) < need_per:
        raise ValueError(f"scratch must be at least ({nt}, {need_per}), got {np.shape(sa)}")
    r.nshares = _plan_bound(&r.a, nt, pmax, max_pos, fast)
    r.run = _fast_table().run if fast else _table().run
    r.share = _fast_table().share if fast else NULL
    _bind_shared(op, &r.a)
    r.scratch = <double *>cnp.PyArray_DATA(sa)
    r.per = _dim(sa, 1)
    op.op.run = _att_share
    op.op.nshares = r.nshares
    return op


def bind_attention(q, k_cache, v_cache, block_table, q_pos, scale, window=0, softcap=0.0,
                   out=None, *, nthreads=1, scratch, max_pos, sinks=None):
    """Exact attention as an Op.  scratch: C-contiguous float64 (threads, per): a row per
    thread that may run the graph, per >= attention_scratch(...); the caller keeps
    q_pos <= max_pos and the block table valid for every run."""
    return _bind("attention", False, q, k_cache, v_cache, block_table, q_pos, scale, window,
                 softcap, out, nthreads, scratch, max_pos, sinks)


def bind_attention_fast(q, k_cache, v_cache, block_table, q_pos, scale, window=0, softcap=0.0,
                        out=None, *, nthreads=1, scratch, max_pos, sinks=None):
    """attention_fast as an Op, as bind_attention (per >= attention_scratch(..., fast=True)).
    A row's bits are attention_fast's; a decode step's keys are split by chunk over the
    threads (kchunks sized for max_pos), with the same bits."""
    return _bind("attention_fast", True, q, k_cache, v_cache, block_table, q_pos, scale,
                 window, softcap, out, nthreads, scratch, max_pos, sinks)


def count_exact(int64_t calls, int64_t queries):
    """Add graph-replayed exact attention calls / query rows to attention_counters()."""
    global _exact_calls, _exact_queries
    _exact_calls += calls
    _exact_queries += queries


def count_fast(int64_t calls, int64_t queries):
    """Add graph-replayed fast attention calls / query rows to attention_counters()."""
    global _fast_calls, _fast_queries
    _fast_calls += calls
    _fast_queries += queries


# ============================================================================ test hooks

def _variant_used():
    """Name of the variant whose table this module calls now (tests: dispatch follows
    _config.set_variant)."""
    return table_variant(_table(), &gi_attn_ops_portable, &gi_attn_ops_avx2,
                         &gi_attn_ops_avx512)


def _fast_plan(q, k_cache, v_cache, block_table, q_pos, window=0, *, nthreads=1):
    """{"n_items", "kchunks", "kvspan"} of attention_fast's plan for this call (tests:
    kchunks > 1 when the keys of a few rows are split over threads, kvspan > 1 when an item
    covers several kv heads)."""
    cdef int nt = check_threads(nthreads)
    cdef gi_attn_args a
    cdef int64_t pmax = 0
    _prepare(&a, q, k_cache, v_cache, block_table, q_pos, 1.0, window, 0.0, None, &pmax)
    if a.T == 0:
        return {"n_items": 0, "kchunks": 1, "kvspan": 1}
    if a.T * a.H * (pmax + 1) * a.hd < _GRAIN:
        nt = 1
    a.split_ok = 1
    _fast_table().plan(&a, nt)
    return {"n_items": a.n_items, "kchunks": a.kchunks, "kvspan": a.kvspan}


def _fast_shares(q, k_cache, v_cache, block_table, q_pos, window=0, *, nthreads, max_pos):
    """The items of each share of a bound attention_fast planned for max_pos on nthreads (as
    bind_attention_fast plans it), in run order, for a run at q_pos: (kchunks, n_items, [items
    of share 0, ...]); item = group * kchunks + chunk (tests)."""
    cdef int nt = check_threads(nthreads)
    cdef gi_attn_args a
    cdef int64_t pmax = 0
    _prepare(&a, q, k_cache, v_cache, block_table, q_pos, 1.0, window, 0.0, None, &pmax)
    if a.T == 0:
        return 1, 0, []
    cdef int64_t ns = _plan_bound(&a, nt, pmax, max_pos, True)
    cdef cnp.ndarray items = np.empty(a.n_items, np.int64)
    cdef int64_t *ip = <int64_t *>cnp.PyArray_DATA(items)
    shares = []
    for s in range(ns):
        shares.append(items[: _fast_table().share(&a, s, ns, NULL, ip)].tolist())
    return a.kchunks, a.n_items, shares


def _get_grain():
    """Work (multiply-adds) below which calls stay single-threaded."""
    return _GRAIN


def _set_grain(n):
    """Work (multiply-adds) below which calls stay single-threaded (tests set 0 to force
    threads).  Returns the previous value."""
    return swap_grain(&_GRAIN, n)


cdef object _map_f64(int which, object x):
    cdef cnp.ndarray xa = np.ascontiguousarray(x, dtype=np.float64).ravel()
    cdef cnp.ndarray ya = np.empty_like(xa)
    cdef const double *xp = <const double *>cnp.PyArray_DATA(xa)
    cdef double *yp = <double *>cnp.PyArray_DATA(ya)
    cdef const gi_attn_ops *ops = _table()
    if which == 0:
        ops.exp_f64(xp, yp, xa.shape[0])
    elif which == 1:
        ops.tanh_f64(xp, yp, xa.shape[0])
    else:
        ops.weight_f64(xp, yp, xa.shape[0])
    return ya


def _exp_f64(x):
    """The kernel's float64 exp (current variant), for tests."""
    return _map_f64(0, x)


def _tanh_f64(x):
    """The kernel's float64 tanh (softcap), for tests."""
    return _map_f64(1, x)


def _weight_f64(x):
    """The attention weight trunc29(exp(x)) of the kernel, for tests."""
    return _map_f64(2, x)
