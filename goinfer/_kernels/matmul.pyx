# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Matrix-multiply kernels: quantize_act, quantize_gated, matmul, get_rows (same API as
goinfer._reference).

The C kernels (src/matmul_impl.c) compute one rectangular output tile (activation rows x row
blocks of 16 output rows) per call; here the output is split into at most `nthreads` tiles
that OpenMP threads compute without overlap, so every output element is written by exactly
one thread and its bits do not depend on the split.
"""
cimport numpy as cnp
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t
from libc.stdlib cimport free, malloc

from goinfer._kernels.checks cimport (carray, carray_writeable, check_threads, check_writeable,
                                      f32_rows, rows_view, swap_grain)
from goinfer._kernels.dispatch cimport (GI_AVX2, gi_avxvnni_enabled, gi_variant, table_variant,
                                        variant_table)
from goinfer._kernels.dispatch cimport gi_gemv_warm_kb
from goinfer._kernels.graph cimport Op, gi_warm_bytes, run_shares, run_shares_dynamic, share_fn
from goinfer._kernels.ops cimport (gi_ops_ops, gi_ops_ops_avx2, gi_ops_ops_avx512,
                                   gi_ops_ops_portable)

import time

import numpy as np

from goinfer.quant import QAct, QWeight

cnp.import_array()

# kind name -> (C kind, qs numpy type, qs dtype name)
_KIND = {
    "q4_0": GI_Q4_0, "q4_1": GI_Q4_1, "q8_0": GI_Q8_0, "mxfp4": GI_MXFP4, "q6_k": GI_Q6_K,
    "q4_k": GI_Q4_K, "q5_k": GI_Q5_K, "q5_0": GI_Q5_0, "q5_1": GI_Q5_1,
    "f32": GI_F32, "f16": GI_F16, "bf16": GI_BF16,
}
_QS_TYPE = {
    GI_Q4_0: (cnp.NPY_UINT8, "uint8"), GI_Q4_1: (cnp.NPY_UINT8, "uint8"),
    GI_Q8_0: (cnp.NPY_INT8, "int8"), GI_MXFP4: (cnp.NPY_UINT8, "uint8"), GI_Q6_K: (cnp.NPY_UINT8, "uint8"),
    GI_Q4_K: (cnp.NPY_UINT8, "uint8"), GI_Q5_K: (cnp.NPY_UINT8, "uint8"),
    GI_Q5_0: (cnp.NPY_UINT8, "uint8"), GI_Q5_1: (cnp.NPY_UINT8, "uint8"),
    GI_F32: (cnp.NPY_FLOAT32, "float32"),
    GI_F16: (cnp.NPY_FLOAT16, "float16"), GI_BF16: (cnp.NPY_UINT16, "uint16 (bf16 bits)"),
}

# Thread count: a tile should hold at least MIN_NS_PER_THREAD of estimated work, else the
# OpenMP fork/join (~1-2 us with idle cores) eats the gain.  Estimate for one core: weight
# bytes at ~12 GB/s (DRAM stream, GEMV) plus multiply-adds at ~150 per ns (VNNI GEMM).
cdef int64_t MIN_NS_PER_THREAD = 2000


# A GEMM (M > 1) is cut into up to SHARES_PER_THREAD tiles per thread, which the threads claim
# as they go: a thread the machine slows (a busy neighbour, a slower core) takes fewer, rather
# than the others waiting for its one equal share.  (Every output element is still computed by
# one tile: the bits do not depend on it.)
cdef int64_t SHARES_PER_THREAD = 4

# A GEMV (M = 1) streams its weight.  Each thread takes one long equal share of the first
# 100 - GEMV_TAIL_PERCENT % of the row blocks (one sequential stream each: 4 or 16 equal shares
# per thread decoded slower), then the rest is cut into GEMV_TAIL_SHARES shares per thread,
# claimed as the threads finish, so that the first one done does not idle at the next op's
# barrier while the other finishes its half.  Weights of fewer than GEMV_TAIL_MIN_RB row
# blocks per thread keep one share each.  On a 2-core Emerald Rapids guest the threads' waits
# at the step's barriers fell from a median of 3.6% of their cycles to 2.1%, and the
# Llama-3.2-1B-shape Q4_K_M file decoded at a median 1.06x the rate on avx2 and 1.02x on
# avx512-vnni over 11 alternating rounds of a noisy host (per round 0.83-1.57x and
# 0.96-1.46x; docs/benchmarks.md, "Decode GEMV of the 4-bit kinds").
cdef int64_t GEMV_TAIL_SHARES = 2
cdef int64_t GEMV_TAIL_PERCENT = 10
cdef int64_t GEMV_TAIL_MIN_RB = 16


def _set_gemv_tail_shares(v):
    """Tests, benchmarks: GEMV tail shares per thread (0: one equal share each); returns the
    old value.  A bound op keeps the shares it was bound with."""
    return swap_grain(&GEMV_TAIL_SHARES, v)


def _set_shares_per_thread(v):
    """Tests, benchmarks: GEMM tiles per thread (1: one equal share each); returns the old value."""
    return swap_grain(&SHARES_PER_THREAD, v)


def _set_min_ns_per_thread(v):
    """Tests: change the work threshold below which fewer threads are used (0: always use
    nthreads); returns the old value."""
    return swap_grain(&MIN_NS_PER_THREAD, v)


# ============================================================================ helpers


cdef inline const gi_matmul_ops *_ops() noexcept nogil:
    """The variant's table; the avx2 variant's with AVX-VNNI where it is on (dispatch.h)."""
    if gi_variant() == GI_AVX2 and gi_avxvnni_enabled():
        return &gi_matmul_ops_avx2vnni
    return <const gi_matmul_ops *>variant_table(&gi_matmul_ops_portable, &gi_matmul_ops_avx2,
                                                &gi_matmul_ops_avx512)


def _variant_used():
    """Name of the variant whose kernel table matmul, quantize_act and get_rows call now
    (tests: dispatch follows _config.set_variant); the AVX-VNNI table is the avx2 variant's."""
    if _ops() == &gi_matmul_ops_avx2vnni:
        return "avx2"
    return table_variant(_ops(), &gi_matmul_ops_portable, &gi_matmul_ops_avx2,
                         &gi_matmul_ops_avx512)


def _avxvnni_used():
    """True if matmul calls the avx2 variant's AVX-VNNI table now (tests)."""
    return _ops() == &gi_matmul_ops_avx2vnni


# ============================================================================ peaks


cdef struct probe_args:
    const gi_matmul_ops *ops
    int64_t reps
    int kind  # 0: int8_probe, 1: fma_probe, 2: f16_fma_probe


cdef int64_t _probe(const probe_args *a, int64_t reps) noexcept nogil:
    if a.kind == 1:
        return a.ops.fma_probe(reps)
    if a.kind == 2:
        return a.ops.f16_fma_probe(reps)
    return a.ops.int8_probe(reps)


cdef void _probe_share(const void *args, int64_t t, int tid) noexcept nogil:
    cdef const probe_args *a = <const probe_args *>args
    _probe(a, a.reps)


cdef double _peak(int kind, int nthreads, double min_time) except? -1.0:
    """Operations per second of one probe of the running variant on nthreads threads at once:
    the fastest of 3 runs of a round count whose fastest run takes at least min_time / 2 (the
    rounds double until then: a run stretched by a thread descheduled under other load does
    not stop the doubling at a count too small to time).  0.0: no probe."""
    cdef probe_args r
    cdef int nt = check_threads(nthreads)
    r.ops = _ops()
    r.kind = kind
    cdef int64_t per = _probe(&r, 1)
    if per == 0:
        return 0.0
    r.reps = 1024
    while True:
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            run_shares(_probe_share, &r, nt)
            best = min(best, time.perf_counter() - t0)
            if best < min_time / 2:
                break
        if best >= min_time / 2 or r.reps >= (1 << 40):
            return per * r.reps * nt / best
        r.reps *= 2


def _int8_peak(nthreads=1, double min_time=0.1):
    """The measured int8 peak (benchmarks): int8 operations per second (2 per multiply-add) of
    the running variant's dot-product instruction alone (gi_matmul_ops.int8_probe), on nthreads
    threads at once; 0.0 for the portable variant."""
    return _peak(0, nthreads, min_time)


def _fma_peak(nthreads=1, double min_time=0.1):
    """The measured float32 FMA peak (benchmarks): float operations per second (2 per lane of a
    fused multiply-add) on the running variant's float vector (gi_matmul_ops.fma_probe), on
    nthreads threads at once; 0.0 for the portable variant."""
    return _peak(1, nthreads, min_time)


def _f16_fma_peak(nthreads=1, double min_time=0.1):
    """The FMA rate of the f16 attention mix (benchmarks): float operations per second of the
    fused multiply-adds of gi_matmul_ops.f16_fma_probe (a vector converted from float16 for
    every 4 of them, as QK and AV over an f16 cache for 4 query heads per kv head), on nthreads
    threads at once: the most an f16 decode attention can reach; 0.0 for portable."""
    return _peak(2, nthreads, min_time)


cdef inline void *_data(cnp.ndarray a) noexcept:
    return cnp.PyArray_DATA(a)


cdef int _weight(object w, gi_weight *cw) except -1:
    """Fill cw from a QWeight, checking every array against the documented layout."""
    if not isinstance(w, QWeight):
        raise TypeError(f"w must be a goinfer.quant.QWeight, got {type(w).__name__}")
    kind = _KIND.get(w.kind)
    if kind is None:
        raise ValueError(f"unknown weight kind {w.kind!r}; known: {', '.join(_KIND)}")
    cdef int64_t n_out = w.n_out, n_in = w.n_in
    if n_out < 0 or n_in < 0:
        raise ValueError(f"bad weight shape ({n_out}, {n_in})")
    cdef int64_t n_rb = (n_out + GI_ROWS - 1) // GI_ROWS
    cdef int64_t G
    typenum, dtname = _QS_TYPE[kind]
    cw.kind = kind
    cw.n_out = n_out
    cw.n_in = n_in
    cw.n_rb = n_rb
    cw.d = NULL
    cw.m = NULL
    cw.e = NULL
    cw.sc = NULL
    cw.ks = NULL
    cw.kdec = NULL
    cw.kdec_u0 = 0
    cw.q6lo = NULL
    cw.q6lo_m0 = 0
    if kind >= GI_F32:
        cw.qs = _data(carray(w.qs, "w.qs", typenum, dtname, 3, n_rb, n_in, GI_ROWS))
        return 0
    if n_in % GI_GROUP:
        raise ValueError(f"{w.kind} weights need n_in divisible by {GI_GROUP}, got {n_in}")
    G = n_in // GI_GROUP
    if kind == GI_Q6_K:  # d per super-block of 256, int8 scales per 16 in w.m
        if n_in % 256:
            raise ValueError(f"q6_k weights need n_in divisible by 256, got {n_in}")
        cw.qs = _data(carray(w.qs, "w.qs", typenum, dtname, 5, n_rb, G, 6, GI_ROWS, 4))
        cw.d = <const uint16_t *>_data(carray(w.d, "w.d", cnp.NPY_FLOAT16, "float16", 3, n_rb,
                                              G // 8, GI_ROWS))
        cw.sc = <const int8_t *>_data(carray(w.m, "w.m", cnp.NPY_INT8, "int8 (q6_k scales)", 4,
                                             n_rb, G, GI_ROWS, 2))
        return 0
    if kind == GI_Q4_K or kind == GI_Q5_K:  # d, dmin per super-block; packed scales, mins in w.m
        if n_in % 256:
            raise ValueError(f"{w.kind} weights need n_in divisible by 256, got {n_in}")
        cw.qs = _data(carray(w.qs, "w.qs", typenum, dtname, 5, n_rb, G, 4 if kind == GI_Q4_K else 5,
                             GI_ROWS, 4))
        cw.d = <const uint16_t *>_data(carray(w.d, "w.d", cnp.NPY_FLOAT16, "float16", 4, n_rb,
                                              G // 8, 2, GI_ROWS))
        cw.ks = <const uint8_t *>_data(carray(w.m, "w.m", cnp.NPY_UINT8, "uint8 (packed scales)", 4,
                                              n_rb, G // 8, 12, GI_ROWS))
        return 0
    cw.qs = _data(carray(w.qs, "w.qs", typenum, dtname, 5, n_rb, G,
                         8 if kind == GI_Q8_0 else 5 if kind == GI_Q5_0 or kind == GI_Q5_1 else 4,
                         GI_ROWS, 4))
    if kind == GI_MXFP4:  # e8m0 exponents in w.d
        cw.e = <const uint8_t *>_data(carray(w.d, "w.d", cnp.NPY_UINT8, "uint8 (e8m0)", 3, n_rb, G,
                                             GI_ROWS))
        return 0
    cw.d = <const uint16_t *>_data(carray(w.d, "w.d", cnp.NPY_FLOAT16, "float16", 3, n_rb, G,
                                          GI_ROWS))
    if kind == GI_Q4_1 or kind == GI_Q5_1:
        cw.m = <const uint16_t *>_data(carray(w.m, "w.m", cnp.NPY_FLOAT16, "float16", 3, n_rb, G,
                                              GI_ROWS))
    return 0


cdef int64_t _weight_bytes(const gi_weight *w) noexcept nogil:
    """Bytes of qs + scales (what a GEMV streams)."""
    cdef int64_t G = w.n_in // GI_GROUP
    if w.kind == GI_F32:
        return w.n_rb * w.n_in * GI_ROWS * 4
    if w.kind >= GI_F32:
        return w.n_rb * w.n_in * GI_ROWS * 2
    if w.kind == GI_Q8_0:
        return w.n_rb * G * (512 + 32)
    if w.kind == GI_MXFP4:
        return w.n_rb * G * (256 + 16)
    if w.kind == GI_Q6_K:
        return w.n_rb * G * (384 + 32 + 4)
    if w.kind == GI_Q4_K or w.kind == GI_Q5_K:
        return w.n_rb * G * ((256 if w.kind == GI_Q4_K else 320) + 32)
    if w.kind == GI_Q5_0 or w.kind == GI_Q5_1:
        return w.n_rb * G * (320 + (64 if w.kind == GI_Q5_1 else 32))
    return w.n_rb * G * (256 + (64 if w.kind == GI_Q4_1 else 32))


cdef int _qact(object a, gi_qact *ca, int64_t *M, int64_t K, bint writable) except -1:
    """Fill ca from a QAct of K columns (any number of rows M)."""
    if not isinstance(a, QAct):
        raise TypeError(f"expected a goinfer.quant.QAct, got {type(a).__name__}")
    qa = a.qa
    if not isinstance(qa, cnp.ndarray) or (<cnp.ndarray>qa).ndim != 2:
        raise ValueError("QAct.qa must be a 2-D numpy array (M, K)")
    M[0] = qa.shape[0]
    if K < 0:
        K = qa.shape[1]
    if K % GI_GROUP:
        raise ValueError(f"K must be divisible by {GI_GROUP}, got {K}")
    cdef int64_t G = K // GI_GROUP
    ca.K = K
    arrays = (carray(qa, "QAct.qa", cnp.NPY_INT8, "int8", 2, M[0], K),
              carray(a.da, "QAct.da", cnp.NPY_FLOAT32, "float32", 2, M[0], G),
              carray(a.asum, "QAct.asum", cnp.NPY_INT32, "int32", 2, M[0], G),
              carray(a.sa, "QAct.sa", cnp.NPY_FLOAT32, "float32", 2, M[0], G))
    if writable:  # quantize_act's out
        for arr, name in zip(arrays, ("QAct.qa", "QAct.da", "QAct.asum", "QAct.sa")):
            check_writeable(arr, name)
    ca.qa = <const int8_t *>_data(arrays[0])
    ca.da = <const float *>_data(arrays[1])
    ca.asum = <const int32_t *>_data(arrays[2])
    ca.sa = <const float *>_data(arrays[3])
    return 0


cdef inline int64_t _min(int64_t a, int64_t b) noexcept nogil:
    return a if a < b else b


cdef inline int64_t _elem_threads(int64_t nthreads, int64_t rows, int64_t elems) noexcept:
    """Threads for a row-parallel elementwise pass (quantize_act, get_rows): ~32K elements each."""
    cdef int64_t n = _min(nthreads, rows)
    if MIN_NS_PER_THREAD > 0:
        n = _min(n, elems >> 15)
    return n if n > 1 else 1


# ============================================================================ tiling
# The output (M rows x n_rb row blocks) is cut into n_rt x n_mt tiles: row blocks split in
# n_rt nearly equal ranges, activation rows in n_mt ranges aligned to the microkernel's MR.
# Tile t is (t // n_mt, t % n_mt).


cdef struct plan:
    int64_t M, n_rb, n_rt, n_mt, mr
    int64_t tail     # GEMV: the last `tail` of the n_rt row shares are tail shares (_tile)


cdef plan _plan(int64_t M, int64_t n_rb, int64_t est_ns, int mr, int nthreads) noexcept:
    cdef plan p
    cdef int64_t nmu = (M + mr - 1) // mr, best = -1, cost, n_rt, n_mt, nt
    p.M = M
    p.n_rb = n_rb
    p.mr = mr
    p.n_rt = 1
    p.n_mt = 1
    p.tail = 0
    nt = _min(nthreads, est_ns // MIN_NS_PER_THREAD) if MIN_NS_PER_THREAD > 0 else nthreads
    if nt <= 1 or n_rb == 0 or M == 0:
        return p
    # every factorisation nt = n_rt * n_mt; keep the smallest largest tile (ties: split rows of W)
    for n_mt in range(1, nt + 1):
        if nt % n_mt:
            continue
        n_rt = nt // n_mt
        if n_rt > n_rb or n_mt > nmu:
            continue
        cost = ((n_rb + n_rt - 1) // n_rt) * ((nmu + n_mt - 1) // n_mt)
        if best < 0 or cost < best:
            best = cost
            p.n_rt = n_rt
            p.n_mt = n_mt
    return p


cdef inline void _tile(const plan *p, int64_t t, int64_t *m0, int64_t *m1,
                       int64_t *rb0, int64_t *rb1) noexcept nogil:
    cdef int64_t ir = t // p.n_mt, im = t % p.n_mt
    cdef int64_t nmu = (p.M + p.mr - 1) // p.mr
    cdef int64_t nb, big
    if p.tail > 0:  # GEMV: nb equal shares of the first `big` row blocks, then the tail's
        nb = p.n_rt - p.tail
        big = p.n_rb - p.n_rb * GEMV_TAIL_PERCENT // 100
        if ir < nb:
            rb0[0] = ir * big // nb
            rb1[0] = (ir + 1) * big // nb
        else:
            rb0[0] = big + (ir - nb) * (p.n_rb - big) // p.tail
            rb1[0] = big + (ir - nb + 1) * (p.n_rb - big) // p.tail
    else:
        rb0[0] = ir * p.n_rb // p.n_rt
        rb1[0] = (ir + 1) * p.n_rb // p.n_rt
    m0[0] = _min(p.M, (im * nmu // p.n_mt) * p.mr)
    m1[0] = _min(p.M, ((im + 1) * nmu // p.n_mt) * p.mr)


cdef void _run_q(const gi_matmul_ops *ops, const plan *p, int64_t t, const gi_weight *w,
                 const gi_qact *a, float *out, int64_t ldo) noexcept nogil:
    cdef int64_t m0, m1, rb0, rb1
    _tile(p, t, &m0, &m1, &rb0, &rb1)
    ops.matmul_q(w, a, m0, m1, rb0, rb1, out, ldo)


cdef void _run_f(const gi_matmul_ops *ops, const plan *p, int64_t t, const gi_weight *w,
                 const float *x, float *out, int64_t ldo) noexcept nogil:
    cdef int64_t m0, m1, rb0, rb1
    _tile(p, t, &m0, &m1, &rb0, &rb1)
    ops.matmul_f(w, x, m0, m1, rb0, rb1, out, ldo)


def _threads_used(w, int64_t M, nthreads):
    """How many OpenMP threads matmul(x with M rows, w, nthreads=...) runs (tiles of its plan)."""
    cdef gi_weight cw
    _weight(w, &cw)
    cdef const gi_matmul_ops *ops = _ops()
    cdef int64_t est_ns = _weight_bytes(&cw) // 12 + M * cw.n_rb * GI_ROWS * cw.n_in // 150
    cdef plan p = _plan(M, cw.n_rb, est_ns, ops.mr_q if cw.kind < GI_F32 else ops.mr_f,
                        check_threads(nthreads))
    return p.n_rt * p.n_mt


# ============================================================================ argument records
# Each kernel is: check the arguments and fill a record (_*_prepare), then run shares 0 ..
# n-1 of the record (_*_share), one per OpenMP thread.  The Python functions run the shares
# at once; the bind_* functions keep the record in an Op for graph replay (graph.pyx).


cdef struct qz_args:
    const gi_matmul_ops *ops
    const float *x
    int64_t M, K, n
    int8_t *qa
    float *da
    int32_t *asum
    float *sa


cdef struct qg_args:
    const gi_matmul_ops *ops
    const gi_ops_ops *eops
    int act  # _GATED: 0 swiglu, 1 gelu_tanh_mul
    int by_cols  # shares split each row's groups (fewer rows than shares) instead of rows
    const float *g
    int64_t gs
    const float *u
    int64_t us
    float *buf  # (n, K) float32: a share's row of the product
    int64_t M, K, n
    int8_t *qa
    float *da
    int32_t *asum
    float *sa


cdef struct mm_args:
    const gi_matmul_ops *ops
    gi_weight w
    gi_qact a
    const float *x
    float *out
    plan p
    bint is_int
    # the weight's arrays, each (n_rb, ...): qs, then d, m where present (warming, _warm_chunk)
    const char *wa[3]
    int64_t wsz[3]    # bytes per row block of each
    int nwa
    int64_t warm_len  # qs bytes of the longest share warmed


cdef struct gr_args:
    const gi_matmul_ops *ops
    gi_weight w
    const int64_t *ids
    int64_t T, n
    float *out



cdef void _qz_share(const void *args, int64_t t, int tid) noexcept nogil:
    cdef const qz_args *a = <const qz_args *>args
    a.ops.quantize_act(a.x, a.K, t * a.M // a.n, (t + 1) * a.M // a.n, a.qa, a.da, a.asum, a.sa)


cdef void _qg_share(const void *args, int64_t t, int tid) noexcept nogil:
    """Rows (or, by_cols, every row's groups) of share t: each row's product computed into
    the share's buffer, then quantized from it while it is in L1."""
    cdef const qg_args *a = <const qg_args *>args
    cdef int64_t G = a.K // GI_GROUP, m0 = 0, m1 = a.M, g0 = 0, g1 = G, m, c0, w
    if a.by_cols:
        g0 = t * G // a.n
        g1 = (t + 1) * G // a.n
    else:
        m0 = t * a.M // a.n
        m1 = (t + 1) * a.M // a.n
    c0 = g0 * GI_GROUP
    w = (g1 - g0) * GI_GROUP
    cdef float *buf = a.buf + t * a.K
    for m in range(m0, m1):
        if a.act == 0:
            a.eops.swiglu(a.g + m * a.gs + c0, a.gs, a.u + m * a.us + c0, a.us, buf, w, 0, 1, 0, w)
        else:
            a.eops.gelu_tanh_mul(a.g + m * a.gs + c0, a.gs, a.u + m * a.us + c0, a.us, buf, w, 0,
                                 1, 0, w)
        a.ops.quantize_act(buf, w, 0, 1, a.qa + m * a.K + c0, a.da + m * G + g0,
                           a.asum + m * G + g0, a.sa + m * G + g0)


cdef void _mm_share(const void *args, int64_t t, int tid) noexcept nogil:
    cdef const mm_args *a = <const mm_args *>args
    if a.is_int:
        _run_q(a.ops, &a.p, t, &a.w, &a.a, a.out, a.w.n_out)
    else:
        _run_f(a.ops, &a.p, t, &a.w, a.x, a.out, a.w.n_out)


# Warming (graph replay, src/graph.h): while a thread waits at a barrier before a bound matmul
# it prefetches the heads of the matmul's row shares (each share's first bytes, what the thread
# that claims it reads first), gemv_warm() KB of qs split evenly between the shares (the GEMV's
# tail shares, short and claimed last, are left out), with the same share of each scale array.
# Chunk c is WARM_CHUNK bytes of qs: share c % n, the (c // n)-th chunk of its head.
cdef int64_t WARM_CHUNK = 4096


cdef int _warm_chunk(const mm_args *a, int64_t c, int64_t *lo, int64_t *hi) noexcept nogil:
    """The byte ranges [lo[i], hi[i]) of a.wa[i] that chunk c warms (empty where c's share is
    shorter than the others); 0 (no ranges) once c is past the limit of every share."""
    cdef int64_t n = a.p.n_rt - a.p.tail, head, s, rb0, rb1, m0, m1, o0, o1
    cdef int i
    if n <= 0 or a.nwa == 0 or c < 0:
        return 0
    head = _min(<int64_t>gi_gemv_warm_kb() * 1024 // n, a.warm_len)
    o0 = (c // n) * WARM_CHUNK  # offsets in share c % n's qs
    if o0 >= head:
        return 0
    s = c % n
    _tile(&a.p, s * a.p.n_mt, &m0, &m1, &rb0, &rb1)
    o1 = _min(o0 + WARM_CHUNK, _min(head, (rb1 - rb0) * a.wsz[0]))
    for i in range(a.nwa):
        lo[i] = rb0 * a.wsz[i] + o0 * a.wsz[i] // a.wsz[0]
        hi[i] = rb0 * a.wsz[i] + (o1 * a.wsz[i] + a.wsz[0] - 1) // a.wsz[0] if o1 > o0 else lo[i]
    return 1


cdef int _mm_warm(const void *args, int64_t c) noexcept nogil:
    cdef const mm_args *a = <const mm_args *>args
    cdef int64_t lo[3]
    cdef int64_t hi[3]
    cdef int i
    if not _warm_chunk(a, c, lo, hi):
        return 0
    for i in range(a.nwa):
        if hi[i] > lo[i]:
            gi_warm_bytes(a.wa[i] + lo[i], hi[i] - lo[i])
    return 1


cdef void _warm_arrays(mm_args *r, object w):
    """r.wa / wsz / nwa: the arrays of w (checked by _weight) a warm chunk prefetches;
    r.warm_len: the qs bytes of the longest share warmed."""
    cdef int64_t s, m0, m1, rb0, rb1
    r.nwa = 0
    r.warm_len = 0
    if r.w.n_rb == 0:
        return
    for arr in (w.qs, w.d, w.m):
        if arr is not None and arr.nbytes > 0:
            r.wa[r.nwa] = <const char *>_data(arr)
            r.wsz[r.nwa] = arr.nbytes // r.w.n_rb
            r.nwa += 1
    for s in range(r.p.n_rt - r.p.tail):
        _tile(&r.p, s * r.p.n_mt, &m0, &m1, &rb0, &rb1)
        r.warm_len = max(r.warm_len, (rb1 - rb0) * r.wsz[0])


cdef void _gr_share(const void *args, int64_t t, int tid) noexcept nogil:
    cdef const gr_args *a = <const gr_args *>args
    a.ops.get_rows(&a.w, a.ids, t * a.T // a.n, (t + 1) * a.T // a.n, a.out)


# Experts: rows [offsets[e], offsets[e+1]) of the activation times expert e's weight, all
# experts of a layer in one call.  The (expert, row block) units of the experts that have rows
# are laid end to end, each costing MX_ROW_COST + its rows (streaming a block of weights vs
# multiplying one row by it), and share t takes the units starting in [t*C/n, (t+1)*C/n) of the
# total cost C.  The offsets are read when the share runs (a bound op follows the routing of
# each step); every output element is still one matmul_q / matmul_f tile's, so its bits are
# those of matmul on the same rows.
cdef int64_t MX_ROW_COST = 8


cdef struct mx_args:
    const gi_matmul_ops *ops
    gi_weight *w            # (E,) experts, same kind and shape (stored after this record)
    int64_t E, M
    gi_qact a
    const float *x
    const int64_t *offsets  # (E+1,)
    const float *bias       # (E, n_out) or NULL
    float *out              # (M, n_out)
    int64_t n
    bint is_int


cdef inline int64_t _cdiv(int64_t a, int64_t b) noexcept nogil:
    return (a + b - 1) // b


cdef void _mx_share(const void *args, int64_t t, int tid) noexcept nogil:
    cdef const mx_args *a = <const mx_args *>args
    cdef const int64_t *off = a.offsets
    cdef int64_t n_rb = a.w[0].n_rb, N = a.w[0].n_out
    cdef int64_t e, m0, m1, u, C = 0, base = 0, lo, hi, rb0, rb1, r, c, c1
    cdef float *o
    cdef const float *b
    for e in range(a.E):
        if off[e + 1] > off[e]:
            C += n_rb * (MX_ROW_COST + off[e + 1] - off[e])
    lo = t * C // a.n
    hi = (t + 1) * C // a.n
    for e in range(a.E):
        if base >= hi:
            break
        m0 = off[e]
        m1 = off[e + 1]
        if m1 <= m0:
            continue
        u = MX_ROW_COST + m1 - m0
        rb0 = _cdiv(lo - base, u) if lo > base else 0
        rb1 = _min(n_rb, _cdiv(hi - base, u))
        base += n_rb * u
        if rb1 <= rb0:
            continue
        if a.is_int:
            a.ops.matmul_q(&a.w[e], &a.a, m0, m1, rb0, rb1, a.out, N)
        else:
            a.ops.matmul_f(&a.w[e], a.x, m0, m1, rb0, rb1, a.out, N)
        if a.bias != NULL:  # out + b, as add_bias computes it
            c1 = _min(N, rb1 * GI_ROWS)
            b = a.bias + e * N
            for r in range(m0, m1):
                o = a.out + r * N
                for c in range(rb0 * GI_ROWS, c1):
                    o[c] = o[c] + b[c]


cdef object _mx_prepare(mx_args *r, object x_or_qact, object ws, object offsets, object bias,
                        object out, int nt, bint check_offsets):
    """r.w must point to len(ws) gi_weight records.  check_offsets: also check the offsets'
    values (a bound op gets them filled later)."""
    cdef int64_t E = len(ws), e, M = 0
    for e in range(E):
        _weight(ws[e], &r.w[e])
        if e and (r.w[e].kind != r.w[0].kind or r.w[e].n_out != r.w[0].n_out
                  or r.w[e].n_in != r.w[0].n_in):
            raise ValueError(f"expert {e} is {ws[e].kind} ({ws[e].n_out}, {ws[e].n_in}), expert 0 "
                             f"{ws[0].kind} ({ws[0].n_out}, {ws[0].n_in}): experts must match")
    cdef int64_t N = r.w[0].n_out, K = r.w[0].n_in
    r.E = E
    r.is_int = r.w[0].kind < GI_F32
    M = _operand(x_or_qact, &r.w[0], ws[0].kind, &r.a, &r.x)
    r.M = M
    r.offsets = <const int64_t *>_data(carray(offsets, "offsets", cnp.NPY_INT64, "int64", 1, E + 1))
    if check_offsets:
        for e in range(E):
            if not 0 <= r.offsets[e] <= r.offsets[e + 1] <= M:
                raise ValueError(f"offsets must rise from 0 to M = {M}, got {list(offsets)}")
        if r.offsets[0] != 0 or r.offsets[E] != M:
            raise ValueError(f"offsets must rise from 0 to M = {M}, got {list(offsets)}")
    r.bias = NULL
    if bias is not None:
        r.bias = <const float *>_data(carray(bias, "bias", cnp.NPY_FLOAT32, "float32", 2, E, N))
    out = _output(out, M, &r.w[0], r.x, &r.out)
    r.ops = _ops()
    # work of the routed rows: at most min(E, M) experts' weights streamed
    cdef int64_t est_ns = _min(E, M) * _weight_bytes(&r.w[0]) // 12 + M * r.w[0].n_rb * GI_ROWS * K // 150
    r.n = _min(nt, est_ns // MIN_NS_PER_THREAD) if MIN_NS_PER_THREAD > 0 else nt
    r.n = _min(r.n, r.w[0].n_rb * _min(E, M)) if M > 0 else 0
    if r.n < 1 and M > 0:
        r.n = 1
    return out


cdef object _qact_out(object out, int64_t M, int64_t K, str xname, gi_qact *ca):
    """A quantizing kernel's out: a QAct of M rows and K columns (a new one when None), its
    arrays' pointers in ca."""
    cdef int64_t Mo = 0
    if out is None:
        out = QAct.empty(M, K)
    _qact(out, ca, &Mo, K, True)
    if Mo != M:
        raise ValueError(f"out has {Mo} rows, {xname} has {M}")
    return out


cdef object _qz_prepare(qz_args *r, object x, object out, int nt):
    if not isinstance(x, cnp.ndarray) or (<cnp.ndarray>x).ndim != 2:
        raise ValueError("x must be a 2-D numpy array (M, K) of float32")
    cdef int64_t M = x.shape[0], K = x.shape[1]
    if K % GI_GROUP:
        raise ValueError(f"K must be divisible by {GI_GROUP}, got {K}")
    r.x = <const float *>_data(carray(x, "x", cnp.NPY_FLOAT32, "float32", 2, M, K))
    cdef gi_qact ca
    out = _qact_out(out, M, K, "x", &ca)
    r.ops = _ops()
    r.M = M
    r.K = K
    r.n = _elem_threads(nt, M, M * K)
    r.qa = <int8_t *>ca.qa
    r.da = <float *>ca.da
    r.asum = <int32_t *>ca.asum
    r.sa = <float *>ca.sa
    return out


_GATED = {"swiglu": 0, "gelu_tanh_mul": 1}


cdef tuple _qg_prepare(qg_args *r, object gate, object up, str act, object out, int nt):
    """-> (out, the shares' row buffer)"""
    if act not in _GATED:
        raise ValueError(f"act must be one of {sorted(_GATED)}, got {act!r}")
    cdef f32_rows gr = rows_view(gate, "gate", False)
    cdef f32_rows ur = rows_view(up, "up", False)
    if np.ndim(gate) != 2 or np.shape(gate) != np.shape(up):
        raise ValueError(f"gate and up must be 2-D arrays of the same shape, got "
                         f"{np.shape(gate)} and {np.shape(up)}")
    cdef int64_t M = gr.M, K = gr.N
    if K % GI_GROUP:
        raise ValueError(f"K must be divisible by {GI_GROUP}, got {K}")
    cdef gi_qact ca
    out = _qact_out(out, M, K, "gate", &ca)
    r.ops = _ops()
    r.eops = <const gi_ops_ops *>variant_table(&gi_ops_ops_portable, &gi_ops_ops_avx2,
                                               &gi_ops_ops_avx512)
    r.act = _GATED[act]
    r.g = gr.p
    r.gs = gr.stride
    r.u = ur.p
    r.us = ur.stride
    r.M = M
    r.K = K
    r.n = _elem_threads(nt, M if M > 1 else K // GI_GROUP, M * K)
    r.by_cols = M < r.n
    buf = np.empty((r.n, max(K, 1)), np.float32)
    r.buf = <float *>_data(buf)
    r.qa = <int8_t *>ca.qa
    r.da = <float *>ca.da
    r.asum = <int32_t *>ca.asum
    r.sa = <float *>ca.sa
    return out, buf


cdef int64_t _operand(object x_or_qact, const gi_weight *w, str kind, gi_qact *a,
                      const float **x) except -1:
    """The activation a matmul with w reads: a QAct (int kinds) into a, float32 rows (float
    kinds) into x.  Returns its rows M."""
    cdef int64_t M = 0
    x[0] = NULL
    if w.kind < GI_F32:
        if not isinstance(x_or_qact, QAct):
            raise TypeError(f"{kind} weights multiply a QAct; call quantize_act first "
                            f"(got {type(x_or_qact).__name__})")
        _qact(x_or_qact, a, &M, w.n_in, False)
        return M
    if isinstance(x_or_qact, QAct):
        raise TypeError(f"{kind} weights multiply float32 x, not a QAct")
    if not isinstance(x_or_qact, cnp.ndarray) or (<cnp.ndarray>x_or_qact).ndim != 2:
        raise ValueError("x must be a 2-D numpy array (M, K) of float32")
    M = x_or_qact.shape[0]
    x[0] = <const float *>_data(carray(x_or_qact, "x", cnp.NPY_FLOAT32, "float32", 2, M, w.n_in))
    return M


cdef object _output(object out, int64_t M, const gi_weight *w, const float *x, float **o):
    """out (M, n_out) float32 (allocated when None) into o; float x must not overlap it."""
    if out is None:
        out = np.empty((M, w.n_out), dtype=np.float32)
    o[0] = <float *>_data(carray_writeable(out, "out", cnp.NPY_FLOAT32, "float32", 2, M, w.n_out))
    if x != NULL and M > 0 and <const char *>o[0] < <const char *>(x + M * w.n_in) \
            and <const char *>x < <const char *>(o[0] + M * w.n_out):
        raise ValueError("out must not overlap x")
    return out


cdef object _mm_prepare(mm_args *r, object x_or_qact, object w, object out, int nt):
    _weight(w, &r.w)
    r.is_int = r.w.kind < GI_F32
    cdef int64_t M = _operand(x_or_qact, &r.w, w.kind, &r.a, &r.x)
    out = _output(out, M, &r.w, r.x, &r.out)
    r.ops = _ops()
    cdef int64_t est_ns = _weight_bytes(&r.w) // 12 + M * r.w.n_rb * GI_ROWS * r.w.n_in // 150
    cdef int spt = <int>SHARES_PER_THREAD if M > 1 and nt > 1 else 1
    r.p = _plan(M, r.w.n_rb, est_ns, r.ops.mr_q if r.is_int else r.ops.mr_f, nt * spt)
    if M == 1 and r.p.n_rt > 1 and GEMV_TAIL_SHARES > 0 and r.w.n_rb >= GEMV_TAIL_MIN_RB * r.p.n_rt:
        r.p.tail = GEMV_TAIL_SHARES * r.p.n_rt
        r.p.n_rt += r.p.tail
    return out


cdef object _gr_prepare(gr_args *r, object w, object ids, object out, int nt, bint strict):
    """strict (bind): ids must already be a C-contiguous int64 (T,) array (used in place)."""
    _weight(w, &r.w)
    ids_arr = np.asarray(ids)
    if ids_arr.size == 0 and ids_arr.ndim == 1:
        ids_arr = np.empty(0, np.int64)  # e.g. [] (float64 to NumPy)
    if ids_arr.dtype.kind not in "iu":
        raise TypeError(f"ids must be integers, got {ids_arr.dtype}")
    if ids_arr.ndim != 1:
        raise ValueError(f"ids must be 1-D (T,), got shape {ids_arr.shape}")
    if ids_arr.dtype != np.int64 or not ids_arr.flags.c_contiguous:
        if strict:
            raise TypeError("bound ids must be a C-contiguous int64 array")
        ids_arr = np.ascontiguousarray(ids_arr, dtype=np.int64)
    cdef int64_t T = ids_arr.shape[0], t, bad = -1
    cdef const int64_t *idp = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>ids_arr)
    with nogil:
        for t in range(T):
            if idp[t] < 0 or idp[t] >= r.w.n_out:
                bad = t
                break
    if bad >= 0:
        raise IndexError(f"ids[{bad}] = {idp[bad]} is out of range for {r.w.n_out} rows")
    if out is None:
        out = np.empty((T, r.w.n_in), dtype=np.float32)
    r.out = <float *>_data(carray_writeable(out, "out", cnp.NPY_FLOAT32, "float32", 2, T, r.w.n_in))
    r.ops = _ops()
    r.ids = idp
    r.T = T
    r.n = _elem_threads(nt, T, T * r.w.n_in)
    return out, ids_arr


# ============================================================================ public API


def quantize_act(x, out=None, *, nthreads=1):
    """x (M, K) float32, K % 32 == 0 -> QAct (int8 per group of 32, bit-exact with the reference)."""
    cdef int nt = check_threads(nthreads)
    cdef qz_args r
    out = _qz_prepare(&r, x, out, nt)
    run_shares(_qz_share, &r, r.n)
    return out


def quantize_gated(gate, up, act="swiglu", out=None, *, nthreads=1):
    """QAct of the gated activation act(gate) * up (act: "swiglu" or "gelu_tanh_mul"): the
    bits quantize_act(swiglu(gate, up)) gives, without the float32 product in memory (each
    row of it is computed into a buffer and quantized while in L1).  gate, up (M, K), K % 32
    == 0, may be strided column halves of one (M, 2K) buffer (rows strided, last axis
    contiguous)."""
    cdef int nt = check_threads(nthreads)
    cdef qg_args r
    out, buf = _qg_prepare(&r, gate, up, act, out, nt)
    if r.M > 0:
        run_shares(_qg_share, &r, r.n)
    return out


def matmul(x_or_qact, w, out=None, *, nthreads=1):
    """out (M, n_out) float32 = x (M, K) @ W.T.

    Integer weights (q4_0, q4_1, q8_0, mxfp4, q6_k, q4_k, q5_k, q5_0, q5_1) take a QAct from
    quantize_act; float weights (f32, f16, bf16) take float32 x (M, K).  out, if given, is (M, n_out) float32 C-contiguous.
    """
    cdef int nt = check_threads(nthreads)
    cdef mm_args r
    out = _mm_prepare(&r, x_or_qact, w, out, nt)
    run_shares_dynamic(_mm_share, &r, r.p.n_rt * r.p.n_mt, nt)
    return out


def get_rows(w, ids, out=None, *, nthreads=1):
    """Embedding lookup: out (T, n_in) float32 = dequantized rows ids (T,) of w.

    ids are integers in [0, n_out) (negative ids are rejected, not wrapped); int64 ids are
    used in place, other integer dtypes are converted.
    """
    cdef int nt = check_threads(nthreads)
    cdef gr_args r
    out, _ = _gr_prepare(&r, w, ids, out, nt, False)
    run_shares(_gr_share, &r, r.n)
    return out


def matmul_experts(x_or_qact, ws, offsets, bias=None, out=None, *, nthreads=1):
    """Every expert of a layer in one call: out (M, n_out) float32, where rows
    [offsets[e], offsets[e+1]) are those rows of x (or the QAct) times ws[e].T (+ bias[e]).

    ws: E QWeights of one kind and shape; offsets (E+1,) int64 rising from 0 to M (moe_group's);
    bias (E, n_out) float32 or None.  Each output element has the bits matmul gives it.
    """
    cdef int nt = check_threads(nthreads)
    cdef int64_t E = _n_experts(ws)
    cdef mx_args *r = <mx_args *>malloc(sizeof(mx_args) + E * sizeof(gi_weight))
    if r == NULL:
        raise MemoryError()
    try:
        r.w = <gi_weight *>(r + 1)
        out = _mx_prepare(r, x_or_qact, ws, offsets, bias, out, nt, True)
        run_shares(_mx_share, r, r.n)
    finally:
        free(r)
    return out


cdef int64_t _n_experts(object ws) except -1:
    if not isinstance(ws, (list, tuple)) or len(ws) == 0:
        raise ValueError("ws must be a non-empty list of expert QWeights")
    return len(ws)


# ============================================================================ bind (graph replay)
# The same checks as the functions above; `out` must be given (a persistent buffer).  The
# Op keeps every argument alive; the caller keeps their contents valid (e.g. ids in range).


def bind_quantize_act(x, out, *, nthreads=1):
    if out is None:  # (the Op points into out: it must outlive it)
        raise ValueError("a bound quantize_act needs out")
    cdef int nt = check_threads(nthreads)
    cdef Op op = Op("quantize_act", (x, out))
    cdef qz_args *r = <qz_args *>op.alloc(sizeof(qz_args))
    _qz_prepare(r, x, out, nt)
    op.op.run = _qz_share
    op.op.nshares = r.n if r.M > 0 else 0
    return op


def bind_quantize_gated(gate, up, act, out, *, nthreads=1):
    if out is None:  # (the Op points into out: it must outlive it)
        raise ValueError("a bound quantize_gated needs out")
    cdef int nt = check_threads(nthreads)
    cdef Op op = Op("quantize_gated", (gate, up, out))
    cdef qg_args *r = <qg_args *>op.alloc(sizeof(qg_args))
    _, buf = _qg_prepare(r, gate, up, act, out, nt)
    op.refs = op.refs + (buf,)
    op.op.run = _qg_share
    op.op.nshares = r.n if r.M > 0 else 0
    return op


def bind_matmul(x_or_qact, w, out, *, nthreads=1):
    if out is None:  # (the Op points into out: it must outlive it)
        raise ValueError("a bound matmul needs out")
    cdef int nt = check_threads(nthreads)
    cdef Op op = Op("matmul", (x_or_qact, w, out))
    cdef mm_args *r = <mm_args *>op.alloc(sizeof(mm_args))
    _mm_prepare(r, x_or_qact, w, out, nt)
    op.op.run = _mm_share
    op.op.nshares = r.p.n_rt * r.p.n_mt if r.p.M > 0 and r.p.n_rb > 0 else 0
    _warm_arrays(r, w)
    if op.op.nshares > 0 and r.nwa > 0:
        op.op.warm = _mm_warm
    return op


def _warm_ranges(Op op):
    """Test hook: the chunks a bound matmul's warm prefetches at the current gemv_warm(), in
    order, as (chunk, array, lo, hi) byte ranges of its weight's arrays (0: qs, then d, m)."""
    if op.name != "matmul" or op.op.warm == NULL:
        return []
    cdef const mm_args *a = <const mm_args *>op.mem
    cdef int64_t lo[3]
    cdef int64_t hi[3]
    cdef int64_t c = 0
    out = []
    while _warm_chunk(a, c, lo, hi):
        out.extend((c, i, lo[i], hi[i]) for i in range(a.nwa))
        c += 1
    return out


def bind_get_rows(w, ids, out, *, nthreads=1):
    if out is None:  # (the Op points into out: it must outlive it)
        raise ValueError("a bound get_rows needs out")
    cdef int nt = check_threads(nthreads)
    cdef Op op = Op("get_rows", (w, ids, out))
    cdef gr_args *r = <gr_args *>op.alloc(sizeof(gr_args))
    _gr_prepare(r, w, ids, out, nt, True)
    op.op.run = _gr_share
    op.op.nshares = r.n if r.T > 0 else 0
    return op


def bind_matmul_experts(x_or_qact, ws, offsets, bias, out, *, nthreads=1):
    """offsets are read when the op runs (fill them before each run: moe_group's output)."""
    if out is None:  # (the Op points into out: it must outlive it)
        raise ValueError("a bound matmul_experts needs out")
    cdef int nt = check_threads(nthreads)
    cdef int64_t E = _n_experts(ws)
    cdef Op op = Op("matmul_experts", (x_or_qact, tuple(ws), offsets, bias, out))
    cdef mx_args *r = <mx_args *>op.alloc(sizeof(mx_args) + E * sizeof(gi_weight))
    r.w = <gi_weight *>(r + 1)
    _mx_prepare(r, x_or_qact, ws, offsets, bias, out, nt, False)
    op.op.run = _mx_share
    op.op.nshares = r.n
    return op
