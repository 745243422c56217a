# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Linear-attention kernels of hybrid models (Qwen3.5's Gated DeltaNet): ssm_conv (short causal
depthwise conv + SiLU, with its state), gated_delta (the gated delta rule, recurrent form, with
its state) and sigmoid_mul (the sigmoid output gate of full-attention layers).

Same names, signatures and meaning as goinfer._reference (see src/ssm.h and
docs/design/families.md for the contracts).  All float arrays are float32.  2-D inputs may have
strided rows (a column slice of a fused projection) with a contiguous last axis.

State arrays are updated in place.  ``snap_rows`` (int32, increasing, rows of this call) and
``snaps`` ask for copies of the state as it is right after those rows: ``snaps[s]`` receives
the state after row ``snap_rows[s]`` (snapshots for prefix reuse, at block boundaries inside a
prefill).

Each kernel is *prepare* (check the arguments, fill a C record) and *share* (compute share i of
n: the columns / rows / work items the Python function hands to OpenMP thread i), as in
matmul.pyx; ``bind_*`` returns the record as an ``Op`` for graph replay (goinfer/graph.py).
A bound op may take its state through ``state_slot=(table, i)``: a uint64 array whose entry i
holds the state's address, read at every run, so a replayed decode step works on whichever
sequence's state the plan writes there (the state must have the bound state's shape; binding
fills an empty (0) entry with the bound state's address and keeps a filled one).
Bound ops take no snapshots.
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t
from goinfer._kernels.checks cimport (carray, carray_writeable, check_threads, rows_view,
                                      swap_grain, typed)
from goinfer._kernels.dispatch cimport table_variant, variant_table
from goinfer._kernels.graph cimport Op, bound, run_shares, share_fn

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

DEF COLS = 64  # columns per work item (conv) / value columns (recurrence); any width gives the same bits

# below this many elements, ssm_conv and sigmoid_mul run on one thread (tests set 0)
cdef int64_t _GRAIN = 16384


def _set_grain(g):
    """Set the one-thread threshold (elements); returns the old one (tests)."""
    return swap_grain(&_GRAIN, g)


cdef inline const gi_ssm_ops *_table() noexcept nogil:
    return <const gi_ssm_ops *>variant_table(&gi_ssm_ops_portable, &gi_ssm_ops_avx2,
                                             &gi_ssm_ops_avx512)


def _variant_used():
    """Name of the variant whose table this module calls now (tests: dispatch follows
    _config.set_variant)."""
    return table_variant(_table(), &gi_ssm_ops_portable, &gi_ssm_ops_avx2, &gi_ssm_ops_avx512)


cdef object _f32(object a, str name):
    """a float32 ndarray (checks.typed), as a Python object: the checks below read its shape,
    strides and flags at the Python level."""
    return typed(a, name, cnp.NPY_FLOAT32, "float32")


cdef inline void *_ptr(object a):
    return cnp.PyArray_DATA(<cnp.ndarray>a)



cdef float **_state_ref(float **local, float *state, object slot) except NULL:
    """Where a record reads its state pointer: its own field, or entry i of a slot table."""
    local[0] = state
    if slot is None:
        return local
    table, i = slot
    if not isinstance(table, np.ndarray) or table.dtype != np.uint64 or table.ndim != 1 \
            or not table.flags.c_contiguous or not table.flags.writeable:
        raise TypeError("state_slot table must be a writeable contiguous uint64 array")
    if not 0 <= i < table.shape[0]:
        raise IndexError(f"state_slot index {i} out of range for {table.shape[0]} entries")
    cdef float **ref = <float **>(<char *>_ptr(table) + 8 * <int64_t>i)
    if ref[0] == NULL:  # an empty slot starts at the bound state; a filled one is kept
        ref[0] = state
    return ref


cdef _no_snaps(snap_rows, snaps):
    if snap_rows is not None or snaps is not None:
        raise ValueError("a bound ssm kernel takes no snapshots")


cdef int64_t _row_stride(object a, str name, bint writeable) except -1:
    """A 2-D float32 array with a contiguous last axis and rows that do not overlap: its row
    stride in floats."""
    if np.ndim(a) != 2:
        raise ValueError(f"{name} must be 2-D, got shape {np.shape(a)}")
    return rows_view(a, name, writeable).stride


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

cdef struct conv_args:
    const gi_ssm_ops *ops
    const float *x
    int64_t xs
    const float *wT
    float *state_local
    float **state_ref
    float *out
    int64_t os, T, C, K, nblk, n
    const int32_t *rows
    int64_t n_snap
    float *snap
    int64_t sstride


cdef void _conv_share(const void *args, int64_t i, int tid) noexcept nogil:
    cdef const conv_args *a = <const conv_args *>args
    cdef int64_t c0 = (a.nblk * i // a.n) * COLS, c1 = (a.nblk * (i + 1) // a.n) * COLS
    if c1 > a.C:
        c1 = a.C
    a.ops.conv(a.x, a.xs, a.wT, a.state_ref[0], a.out, a.os, a.T, a.C, a.K, c0, c1, a.rows,
               a.n_snap, a.snap, a.sstride)


cdef tuple _conv_prepare(conv_args *r, x, wT, state, out, snap_rows, snaps, int nt, slot):
    """-> (out, the arrays the record points into)."""
    xa = _f32(x, "x")
    cdef int64_t xs = _row_stride(xa, "x", False)
    cdef int64_t T = xa.shape[0], C = xa.shape[1]
    wa = _f32(wT, "wT")
    if wa.ndim != 2 or wa.shape[1] != C or wa.shape[0] < 1 or not wa.flags.c_contiguous:
        raise ValueError(f"wT must be C-contiguous (K, {C}), got {np.shape(wa)}")
    cdef int64_t K = wa.shape[0]
    sa = carray_writeable(state, "state", cnp.NPY_FLOAT32, "float32", 2, K - 1, C)
    if out is None:
        out = np.empty((T, C), np.float32)
    oa = _f32(out, "out")
    if oa.shape != (T, C):
        raise ValueError(f"out must have shape ({T}, {C}), got {np.shape(oa)}")
    cdef int64_t os = _row_stride(oa, "out", True)
    rows, sn, n_snap, sstride = _snaps(snap_rows, snaps, (K - 1, C), T)
    r.ops = _table()
    r.x = <const float *>_ptr(xa)
    r.xs = xs
    r.wT = <const float *>_ptr(wa)
    r.state_ref = _state_ref(&r.state_local, <float *>_ptr(sa), slot)
    r.out = <float *>_ptr(oa)
    r.os = os
    r.T, r.C, r.K = T, C, K
    r.rows = <const int32_t *>_ptr(rows)
    r.n_snap = n_snap
    r.snap = <float *>_ptr(sn)
    r.sstride = sstride
    r.nblk = (C + COLS - 1) // COLS
    r.n = nt if nt < r.nblk else r.nblk
    if T * C < _GRAIN:
        r.n = 1
    if C == 0 or T == 0:
        r.n = 0
    return out, (xa, wa, sa, oa, rows, sn)


def ssm_conv(x, wT, state, out=None, *, snap_rows=None, snaps=None, nthreads=1):
    """Causal depthwise conv + SiLU over the T rows of x (T, C) with the K-1 rows before them
    in state (K-1, C) (updated in place to the last K-1 inputs).  wT (K, C): tap j of channel c
    multiplies the input j rows before the newest... i.e. out[t] = silu(sum_j wT[j] * xx[t+j])
    with xx = state ++ x.  Returns out (T, C)."""
    cdef int nt = check_threads(nthreads)
    cdef conv_args r
    out, keep = _conv_prepare(&r, x, wT, state, out, snap_rows, snaps, nt, None)
    run_shares(_conv_share, &r, r.n)
    return out


def bind_ssm_conv(x, wT, state, out, *, snap_rows=None, snaps=None, nthreads=1, state_slot=None):
    _no_snaps(snap_rows, snaps)
    cdef int nt = check_threads(nthreads)
    cdef void *rec
    cdef Op op = bound("ssm_conv", (), _conv_share, sizeof(conv_args), &rec)
    _, keep = _conv_prepare(<conv_args *>rec, x, wT, state, out, None, None, nt, state_slot)
    op.refs = keep + (state_slot,)
    op.op.nshares = (<conv_args *>rec).n
    return op


# ============================================================================ gated delta rule

cdef struct gd_args:
    const gi_ssm_ops *ops
    const float *qkv
    int64_t qs
    const float *ab
    int64_t abs_
    const float *A
    const float *dt_bias
    float *qn
    float *kn
    float *beta
    float *decay
    float *state_local
    float **state_ref
    float *out
    int64_t os, T, Hk, Hv, dk, dv, nj, n_items, n_prep, n_delta
    double eps
    const int32_t *rows
    int64_t n_snap
    float *snap
    int64_t sstride


cdef void _gd_prep_share(const void *args, int64_t i, int tid) noexcept nogil:
    cdef const gd_args *a = <const gd_args *>args
    gi_ssm_prep(a.qkv, a.qs, a.ab, a.abs_, a.A, a.dt_bias, a.qn, a.kn, a.beta, a.decay,
                a.T * i // a.n_prep, a.T * (i + 1) // a.n_prep, a.Hk, a.Hv, a.dk, a.eps)


cdef void _gd_delta_share(const void *args, int64_t i, int tid) noexcept nogil:
    cdef const gd_args *a = <const gd_args *>args
    cdef int64_t it, h, j0, j1
    cdef float *sp = a.state_ref[0]
    for it in range(a.n_items * i // a.n_delta, a.n_items * (i + 1) // a.n_delta):
        h = it // a.nj
        j0 = (it % a.nj) * COLS
        j1 = j0 + COLS if j0 + COLS < a.dv else a.dv
        a.ops.delta(a.qn, a.kn, a.qkv + 2 * a.Hk * a.dk, a.qs, a.beta, a.decay, sp, a.out, a.os,
                    a.T, a.Hk, a.Hv, a.dk, a.dv, h, j0, j1, a.rows, a.n_snap, a.snap, a.sstride)


cdef tuple _gd_prepare(gd_args *r, qkv, ab, A, dt_bias, state, n_k_heads, out, snap_rows, snaps,
                       eps, int nt, slot):
    """-> (out, the arrays the record points into)."""
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
    Aa = carray(A, "A", cnp.NPY_FLOAT32, "float32", 1, Hv)
    da = carray(dt_bias, "dt_bias", cnp.NPY_FLOAT32, "float32", 1, Hv)
    if out is None:
        out = np.empty((T, Hv * dv), np.float32)
    oa = _f32(out, "out")
    if oa.ndim == 3 and oa.shape == (T, Hv, dv) and oa.flags.c_contiguous:
        oa = oa.reshape(T, Hv * dv)
    if oa.shape != (T, Hv * dv):
        raise ValueError(f"out must have shape ({T}, {Hv * dv}), got {np.shape(out)}")
    cdef int64_t os = _row_stride(oa, "out", True)
    rows, sn, n_snap, sstride = _snaps(snap_rows, snaps, (Hv, dk, dv), T)
    qn = np.empty((max(T, 1), Hk, dk), np.float32)  # scratch of the pre-pass
    kn = np.empty((max(T, 1), Hk, dk), np.float32)
    be = np.empty((max(T, 1), Hv), np.float32)
    de = np.empty((max(T, 1), Hv), np.float32)
    r.ops = _table()
    r.qkv = <const float *>_ptr(qa)
    r.qs = qs
    r.ab = <const float *>_ptr(aba)
    r.abs_ = abs_
    r.A = <const float *>_ptr(Aa)
    r.dt_bias = <const float *>_ptr(da)
    r.qn = <float *>_ptr(qn)
    r.kn = <float *>_ptr(kn)
    r.beta = <float *>_ptr(be)
    r.decay = <float *>_ptr(de)
    r.state_ref = _state_ref(&r.state_local, <float *>_ptr(sa), slot)
    r.out = <float *>_ptr(oa)
    r.os = os
    r.T, r.Hk, r.Hv, r.dk, r.dv = T, Hk, Hv, dk, dv
    r.eps = float(eps)
    r.rows = <const int32_t *>_ptr(rows)
    r.n_snap = n_snap
    r.snap = <float *>_ptr(sn)
    r.sstride = sstride
    r.nj = (dv + COLS - 1) // COLS
    r.n_items = Hv * r.nj
    r.n_prep = nt if nt < T else T
    r.n_delta = nt if nt < r.n_items else r.n_items
    if T == 0:
        r.n_prep = r.n_delta = 0
    return out, (qa, aba, Aa, da, sa, oa, rows, sn, qn, kn, be, de)


def gated_delta(qkv, ab, A, dt_bias, state, n_k_heads, out=None, *, snap_rows=None, snaps=None,
                eps=1e-6, nthreads=1):
    """The gated delta rule over T tokens (recurrent form, token by token).

    qkv (T, >= 2*Hk*dk + Hv*dv): conv outputs q | k | v per row (rows may be strided);
    ab (T, 2*Hv): beta logits | alpha per row; A (Hv,) = -exp(A_log); dt_bias (Hv,);
    state (Hv, dk, dv) updated in place; n_k_heads = Hk (value head h reads key head h % Hk,
    the GGUF order).  q, k are L2-normalized (eps), q scaled by 1/sqrt(dk).
    Returns out (T, Hv*dv)."""
    cdef int nt = check_threads(nthreads)
    cdef gd_args r
    out, keep = _gd_prepare(&r, qkv, ab, A, dt_bias, state, n_k_heads, out, snap_rows, snaps,
                            eps, nt, None)
    run_shares(_gd_prep_share, &r, r.n_prep)
    run_shares(_gd_delta_share, &r, r.n_delta)
    return out


def bind_gated_delta(qkv, ab, A, dt_bias, state, n_k_heads, out, *, snap_rows=None, snaps=None,
                     eps=1e-6, nthreads=1, state_slot=None):
    """Two ops: the pre-pass (q/k normalization, beta, decay) and the recurrence, which must
    start after it (the graph's barrier)."""
    _no_snaps(snap_rows, snaps)
    cdef int nt = check_threads(nthreads)
    cdef void *rec
    cdef Op prep = bound("gated_delta_prep", (), _gd_prep_share, sizeof(gd_args), &rec)
    _, keep = _gd_prepare(<gd_args *>rec, qkv, ab, A, dt_bias, state, n_k_heads, out, None, None,
                          eps, nt, state_slot)
    prep.refs = keep + (state_slot,)
    prep.op.nshares = (<gd_args *>rec).n_prep
    cdef Op delta = Op("gated_delta", (prep,))  # shares prep's record (kept alive by refs)
    delta.op.run = _gd_delta_share
    delta.op.args = prep.op.args
    delta.op.nshares = (<gd_args *>rec).n_delta
    return [prep, delta]


# ============================================================================ sigmoid gate

cdef struct sig_args:
    const gi_ssm_ops *ops
    const float *g
    int64_t gs
    const float *x
    int64_t xs
    float *out
    int64_t os, M, N, n


cdef void _sig_share(const void *args, int64_t i, int tid) noexcept nogil:
    cdef const sig_args *a = <const sig_args *>args
    a.ops.sigmoid_mul(a.g, a.gs, a.x, a.xs, a.out, a.os, a.M * i // a.n, a.M * (i + 1) // a.n, a.N)


cdef tuple _sig_prepare(sig_args *r, gate, x, out, int nt):
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
    r.os = _row_stride(oa, "out", True)
    r.ops = _table()
    r.g = <const float *>_ptr(ga)
    r.gs = gs
    r.x = <const float *>_ptr(xa)
    r.xs = xs
    r.out = <float *>_ptr(oa)
    r.M, r.N = xa.shape[0], xa.shape[1]
    r.n = nt if nt < r.M else r.M
    if r.M * r.N < _GRAIN:
        r.n = 1 if r.M else 0
    return out, (ga, xa, oa)


def sigmoid_mul(gate, x, out=None, *, nthreads=1):
    """out = x * sigmoid(gate), computed as x / (1 + exp(-gate)) in float32 (gate, x (M, N),
    rows may be strided; out may be x)."""
    cdef int nt = check_threads(nthreads)
    cdef sig_args r
    out, keep = _sig_prepare(&r, gate, x, out, nt)
    run_shares(_sig_share, &r, r.n)
    return out


def bind_sigmoid_mul(gate, x, out, *, nthreads=1):
    cdef int nt = check_threads(nthreads)
    cdef void *rec
    cdef Op op = bound("sigmoid_mul", (), _sig_share, sizeof(sig_args), &rec)
    _, keep = _sig_prepare(<sig_args *>rec, gate, x, out, nt)
    op.refs = keep
    op.op.nshares = (<sig_args *>rec).n
    return op
