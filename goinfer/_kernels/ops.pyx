# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Elementwise and normalization kernels: rmsnorm, swiglu, gelu_tanh_mul, rope, add, and the
small data-movement kernels of the forward step: add_bias, copy2d, scale, softcap, gather_rows.

Same names, signatures and meaning as goinfer._reference (see docs/design/kernels.md for the
exact contracts).  All float arrays are float32.

Layouts accepted:
  rmsnorm, swiglu, gelu_tanh_mul, add: a 2-D (M, N) array whose last axis is contiguous and
    whose rows may be strided but do not overlap (e.g. gate = h[:, :F], up = h[:, F:] of one
    (M, 2F) buffer), or any C-contiguous array (treated as (size / N, N)); checks.rows_view.  ``out`` follows the same rule, must
    have the input's shape and may be the same array as an input (in place).
  rope: x (T, H, hd) C-contiguous; ``out`` C-contiguous or ``x`` itself (in place).
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t
from goinfer._kernels.checks cimport (check_threads, check_writeable, f32_rows, grain_threads,
                                      rows_view, swap_grain, typed)
from goinfer._kernels.dispatch cimport variant_table, table_variant
from goinfer._kernels.graph cimport Op, bound, run_shares, share_fn
from libc.string cimport memcpy
from libc.math cimport tanhf

cnp.import_array()

# below this many elements per thread, extra threads cost more than they give
cdef int64_t _GRAIN = 32768


cdef inline const gi_ops_ops *_table() noexcept nogil:
    return <const gi_ops_ops *>variant_table(&gi_ops_ops_portable, &gi_ops_ops_avx2,
                                             &gi_ops_ops_avx512)


# ============================================================================ argument checks

cdef bint _same_shape(object a, object b):
    """a, b: ndarrays"""
    cdef cnp.ndarray x = <cnp.ndarray>a, y = <cnp.ndarray>b
    cdef int nd = cnp.PyArray_NDIM(x), i
    if cnp.PyArray_NDIM(y) != nd:
        return False
    for i in range(nd):
        if cnp.PyArray_DIMS(x)[i] != cnp.PyArray_DIMS(y)[i]:
            return False
    return True


cdef f32_rows _out_rows(object out, object like) except *:
    cdef f32_rows r = rows_view(out, "out", True)
    if not _same_shape(out, like):
        raise ValueError(f"out has shape {np.shape(out)}, expected {np.shape(like)}")
    return r


cdef inline int _nth(int nthreads, int64_t work) noexcept nogil:
    return grain_threads(_GRAIN, nthreads, work)


# ============================================================================ argument records
# Each kernel is: check the arguments and fill a record (_*_prepare), then run shares 0 ..
# n-1 of it (_*_share), one per OpenMP thread.  The Python functions run the shares at once;
# the bind_* functions keep the record in an Op for graph replay (graph.pyx).


cdef Op _bound(str name, tuple refs, share_fn fn, size_t size, void **rec):
    if refs[len(refs) - 1] is None:  # out (the Op points into it: it must outlive it)
        raise ValueError(f"a bound {name} needs out")
    return bound(name, refs, fn, size, rec)


# ============================================================================ RMSNorm

cdef struct norm_args:
    const gi_ops_ops *ops
    const float *x
    int64_t xs
    const float *w
    float *out
    int64_t os, M, D, n
    double eps


cdef void _norm_share(const void *args, int64_t i, int tid) noexcept nogil:
    cdef const norm_args *a = <const norm_args *>args
    a.ops.rmsnorm(a.x, a.xs, a.w, a.out, a.os, a.M * i // a.n, a.M * (i + 1) // a.n, a.D, a.eps)


cdef object _norm_prepare(norm_args *r, object x, object w, object eps, object out, int nt):
    """Fill r; r.n = 0 when there is nothing to do."""
    cdef f32_rows xr = rows_view(x, "x", False)
    cdef cnp.ndarray wa = typed(w, "w", cnp.NPY_FLOAT32, "float32")
    if cnp.PyArray_NDIM(wa) != 1 or cnp.PyArray_DIMS(wa)[0] != xr.N:
        raise ValueError(f"w must have shape ({xr.N},), got {np.shape(wa)}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(wa):
        raise ValueError("w must be contiguous")
    if out is None:
        out = np.empty_like(x, order="C")
    cdef f32_rows orow = _out_rows(out, x)
    r.eps = float(eps)
    r.ops = _table()
    r.x = xr.p
    r.xs = xr.stride
    r.w = <const float *>cnp.PyArray_DATA(wa)
    r.out = orow.p
    r.os = orow.stride
    r.M = xr.M
    r.D = xr.N
    cdef int n = _nth(nt, r.M * r.D)
    if n > r.M:
        n = <int>r.M
    r.n = 0 if r.M == 0 else (n if n > 1 else 1)
    return out


def rmsnorm(x, w, eps, out=None, *, nthreads=1):
    """out = float32(x * r) * w, r = float32(1 / sqrt(mean(x^2) + eps)) per row (last axis).

    Bit-exact with goinfer._reference.rmsnorm.  x (M, D) (or any C-contiguous (..., D)),
    w (D,) float32."""
    cdef int nt = check_threads(nthreads)
    cdef norm_args r
    out = _norm_prepare(&r, x, w, eps, out, nt)
    run_shares(_norm_share, &r, r.n)
    return out


def bind_rmsnorm(x, w, eps, out, *, nthreads=1):
    cdef int nt = check_threads(nthreads)
    cdef void *rec
    cdef Op op = _bound("rmsnorm", (x, w, out), _norm_share, sizeof(norm_args), &rec)
    _norm_prepare(<norm_args *>rec, x, w, eps, out, nt)
    op.op.nshares = (<norm_args *>rec).n
    return op


# ============================================================================ elementwise (binary)

cdef int _KIND_SWIGLU = 0
cdef int _KIND_GELU = 1
cdef int _KIND_ADD = 2
cdef int _KIND_SWIGLU_OAI = 3

cdef struct bin_args:
    const gi_ops_ops *ops
    int kind
    int split  # 0: one share, 1: rows, 2: columns (at multiples of 16 floats)
    const float *a
    int64_t as_
    const float *b
    int64_t bs
    float *o
    int64_t os, M, N, n
    float p0, p1  # swiglu_oai: alpha, limit


cdef inline void _binary_call(const bin_args *r, int64_t m0, int64_t m1, int64_t c0,
                              int64_t c1) noexcept nogil:
    cdef const gi_ops_ops *ops = r.ops
    cdef int kind = r.kind
    cdef const float *a = r.a
    cdef const float *b = r.b
    cdef float *o = r.o
    cdef int64_t as_ = r.as_, bs = r.bs, os = r.os
    if kind == _KIND_SWIGLU:
        ops.swiglu(a, as_, b, bs, o, os, m0, m1, c0, c1)
    elif kind == _KIND_SWIGLU_OAI:
        ops.swiglu_oai(a, as_, b, bs, o, os, m0, m1, c0, c1, r.p0, r.p1)
    elif kind == _KIND_GELU:
        ops.gelu_tanh_mul(a, as_, b, bs, o, os, m0, m1, c0, c1)
    else:
        ops.add(a, as_, b, bs, o, os, m0, m1, c0, c1)


cdef void _binary_share(const void *args, int64_t i, int tid) noexcept nogil:
    cdef const bin_args *r = <const bin_args *>args
    cdef int64_t M = r.M, N = r.N, n = r.n, c0, c1
    if r.split == 0:
        _binary_call(r, 0, M, 0, N)
    elif r.split == 1:
        _binary_call(r, M * i // n, M * (i + 1) // n, 0, N)
    else:
        c0 = (N * i // n) & ~(<int64_t>15)
        c1 = N if i == n - 1 else (N * (i + 1) // n) & ~(<int64_t>15)
        _binary_call(r, 0, M, c0, c1)


cdef object _binary_prepare(bin_args *r, int kind, object a, object b, object out, int nt,
                            str an, str bn, bint bias, float p0=0.0, float p1=0.0):
    """bias: b is one row (N,) added to every row of a (row stride 0).  p0, p1: the kernel's
    scalar parameters (swiglu_oai: alpha, limit)."""
    cdef f32_rows ar = rows_view(a, an, False)
    cdef f32_rows br = rows_view(b, bn, False)
    if bias:
        if cnp.PyArray_NDIM(<cnp.ndarray>b) != 1 or br.N != ar.N or br.stride != br.N:
            raise ValueError(f"{bn} must be a contiguous ({ar.N},) array, got shape {np.shape(b)}")
        br.stride = 0
    elif not _same_shape(a, b):
        raise ValueError(f"{an} and {bn} must have the same shape, got {np.shape(a)} and "
                         f"{np.shape(b)}")
    if out is None:
        out = np.empty_like(a, order="C")
    cdef f32_rows orow = _out_rows(out, a)
    r.ops = _table()
    r.kind = kind
    r.p0 = p0
    r.p1 = p1
    r.a = ar.p
    r.as_ = ar.stride
    r.b = br.p
    r.bs = br.stride
    r.o = orow.p
    r.os = orow.stride
    r.M = ar.M
    r.N = ar.N
    r.n = _nth(nt, r.M * r.N)
    if r.M == 0 or r.N == 0:
        r.n = 0
    elif r.n <= 1:
        r.split = 0
        r.n = 1
    else:
        r.split = 1 if r.M >= r.n else 2
    return out


cdef object _binary(int kind, object a, object b, object out, object nthreads, str an, str bn,
                    bint bias=False, float p0=0.0, float p1=0.0):
    cdef int nt = check_threads(nthreads)
    cdef bin_args r
    out = _binary_prepare(&r, kind, a, b, out, nt, an, bn, bias, p0, p1)
    run_shares(_binary_share, &r, r.n)
    return out


cdef Op _bind_binary(str name, int kind, object a, object b, object out, object nthreads,
                     str an, str bn, bint bias=False, float p0=0.0, float p1=0.0):
    cdef int nt = check_threads(nthreads)
    cdef void *rec
    cdef Op op = _bound(name, (a, b, out), _binary_share, sizeof(bin_args), &rec)
    _binary_prepare(<bin_args *>rec, kind, a, b, out, nt, an, bn, bias, p0, p1)
    op.op.nshares = (<bin_args *>rec).n
    return op


def swiglu(gate, up, out=None, *, nthreads=1):
    """out = silu(gate) * up, silu(g) = g / (1 + exp(-g)), in float32 with the kernel's own
    exp (one operation sequence per element).  gate/up may be strided column halves of one
    (M, 2F) buffer (rows strided, last axis contiguous)."""
    return _binary(_KIND_SWIGLU, gate, up, out, nthreads, "gate", "up")


def _oai_params(alpha, limit):
    a, lim = float(alpha), float(limit)
    if not (np.isfinite(a) and np.isfinite(lim) and lim >= 0):
        raise ValueError(f"swiglu_oai needs a finite alpha and limit >= 0, got {alpha!r}, {limit!r}")
    return a, lim


def swiglu_oai(gate, up, alpha, limit, out=None, *, nthreads=1):
    """gpt-oss's clamped SwiGLU: x = min(gate, limit), y = clamp(up, -limit, limit),
    out = (x / (1 + exp(-(alpha x)))) * (y + 1), in float32 with the kernel's exp (alpha and
    limit rounded to float32).  Layouts as swiglu."""
    a, lim = _oai_params(alpha, limit)
    return _binary(_KIND_SWIGLU_OAI, gate, up, out, nthreads, "gate", "up", False, a, lim)


def gelu_tanh_mul(gate, up, out=None, *, nthreads=1):
    """out = gelu_tanh(gate) * up (GeGLU), computed as g / (1 + exp(-2c(g + 0.044715 g^3)))
    (= 0.5 g (1 + tanh(c(g + 0.044715 g^3))), c = sqrt(2/pi)) in float32."""
    return _binary(_KIND_GELU, gate, up, out, nthreads, "gate", "up")


def add(x, y, out=None, *, nthreads=1):
    """out = x + y in float32 (residual add; bit-exact with numpy).  out may be x."""
    return _binary(_KIND_ADD, x, y, out, nthreads, "x", "y")


def add_bias(x, b, out=None, *, nthreads=1):
    """out = x + b in float32 with b (N,) added to every row of x (M, N) (bias; bit-exact with
    numpy's broadcast add).  out may be x."""
    return _binary(_KIND_ADD, x, b, out, nthreads, "x", "b", True)


def bind_swiglu(gate, up, out, *, nthreads=1):
    return _bind_binary("swiglu", _KIND_SWIGLU, gate, up, out, nthreads, "gate", "up")


def bind_swiglu_oai(gate, up, alpha, limit, out, *, nthreads=1):
    a, lim = _oai_params(alpha, limit)
    return _bind_binary("swiglu_oai", _KIND_SWIGLU_OAI, gate, up, out, nthreads, "gate", "up",
                        False, a, lim)


def bind_gelu_tanh_mul(gate, up, out, *, nthreads=1):
    return _bind_binary("gelu_tanh_mul", _KIND_GELU, gate, up, out, nthreads, "gate", "up")


def bind_add(x, y, out, *, nthreads=1):
    return _bind_binary("add", _KIND_ADD, x, y, out, nthreads, "x", "y")


def bind_add_bias(x, b, out, *, nthreads=1):
    return _bind_binary("add_bias", _KIND_ADD, x, b, out, nthreads, "x", "b", True)


# ============================================================================ copy2d, scale, softcap
# Row-strided (M, N) float32 in and out, split over rows like the elementwise kernels.

cdef struct rowmap_args:
    const float *x
    int64_t xs
    float *o
    int64_t os, M, N, n
    float s  # scale: the factor; softcap: the cap


cdef void _copy_share(const void *args, int64_t i, int tid) noexcept nogil:
    cdef const rowmap_args *r = <const rowmap_args *>args
    cdef int64_t m
    for m in range(r.M * i // r.n, r.M * (i + 1) // r.n):
        memcpy(r.o + m * r.os, r.x + m * r.xs, <size_t>r.N * 4)


cdef void _scale_share(const void *args, int64_t i, int tid) noexcept nogil:
    cdef const rowmap_args *r = <const rowmap_args *>args
    cdef int64_t m, c
    cdef const float *xr
    cdef float *orow
    cdef float s = r.s
    for m in range(r.M * i // r.n, r.M * (i + 1) // r.n):
        xr = r.x + m * r.xs
        orow = r.o + m * r.os
        for c in range(r.N):
            orow[c] = xr[c] * s


cdef void _softcap_share(const void *args, int64_t i, int tid) noexcept nogil:
    cdef const rowmap_args *r = <const rowmap_args *>args
    cdef int64_t m, c
    cdef const float *xr
    cdef float *orow
    cdef float cap = r.s
    for m in range(r.M * i // r.n, r.M * (i + 1) // r.n):
        xr = r.x + m * r.xs
        orow = r.o + m * r.os
        for c in range(r.N):
            orow[c] = tanhf(xr[c] / cap) * cap


cdef object _rowmap_prepare(rowmap_args *r, object x, object out, int nt, bint alias_ok):
    cdef f32_rows xr = rows_view(x, "x", False)
    if out is None:
        out = np.empty_like(x, order="C")
    cdef f32_rows orow = _out_rows(out, x)
    cdef char *xlo = <char *>xr.p
    cdef char *olo = <char *>orow.p
    cdef char *xhi = xlo + ((xr.M - 1) * xr.stride + xr.N) * 4 if xr.M > 0 else xlo
    cdef char *ohi = olo + ((orow.M - 1) * orow.stride + orow.N) * 4 if orow.M > 0 else olo
    if not alias_ok and xr.M > 0 and xr.N > 0 and olo < xhi and xlo < ohi:
        raise ValueError("out must not overlap x")
    if alias_ok and xr.M > 0 and xr.N > 0 and olo < xhi and xlo < ohi and (
            olo != xlo or orow.stride != xr.stride):
        raise ValueError("out must be x itself or not overlap it")
    r.x = xr.p
    r.xs = xr.stride
    r.o = orow.p
    r.os = orow.stride
    r.M = xr.M
    r.N = xr.N
    cdef int n = _nth(nt, r.M * r.N)
    if n > r.M:
        n = <int>r.M
    r.n = 0 if r.M == 0 or r.N == 0 else (n if n > 1 else 1)
    return out


def copy2d(x, out, *, nthreads=1):
    """out[...] = x for float32 x (M, N) whose rows may be strided (e.g. the q / k / v column
    ranges of a fused QKV output); out (M, N), rows may be strided too, must not overlap x."""
    cdef int nt = check_threads(nthreads)
    cdef rowmap_args r
    out = _rowmap_prepare(&r, x, out, nt, False)
    run_shares(_copy_share, &r, r.n)
    return out


def scale(x, s, out=None, *, nthreads=1):
    """out = x * float32(s) in float32 (bit-exact with numpy).  out may be x."""
    cdef int nt = check_threads(nthreads)
    cdef rowmap_args r
    out = _rowmap_prepare(&r, x, out, nt, True)
    r.s = <float>float(s)
    run_shares(_scale_share, &r, r.n)
    return out


cdef float _check_cap(object cap) except? -1:
    cdef double c = float(cap)
    if not c > 0 or c == float("inf"):
        raise ValueError(f"softcap cap must be a finite number > 0, got {cap!r}")
    return <float>c


def softcap(x, cap, out=None, *, nthreads=1):
    """out = float32(tanhf(x / cap) * cap) per element (Gemma's final logit softcap), with
    libm's tanhf: one code path for every ISA variant and thread count.  out may be x."""
    cdef int nt = check_threads(nthreads)
    cdef float c = _check_cap(cap)
    cdef rowmap_args r
    out = _rowmap_prepare(&r, x, out, nt, True)
    r.s = c
    run_shares(_softcap_share, &r, r.n)
    return out


def bind_softcap(x, cap, out, *, nthreads=1):
    cdef int nt = check_threads(nthreads)
    cdef float c = _check_cap(cap)
    cdef void *rec
    cdef Op op = _bound("softcap", (x, out), _softcap_share, sizeof(rowmap_args), &rec)
    _rowmap_prepare(<rowmap_args *>rec, x, out, nt, True)
    (<rowmap_args *>rec).s = c
    op.op.nshares = (<rowmap_args *>rec).n
    return op


def bind_copy2d(x, out, *, nthreads=1):
    cdef int nt = check_threads(nthreads)
    cdef void *rec
    cdef Op op = _bound("copy2d", (x, out), _copy_share, sizeof(rowmap_args), &rec)
    _rowmap_prepare(<rowmap_args *>rec, x, out, nt, False)
    op.op.nshares = (<rowmap_args *>rec).n
    return op


def bind_scale(x, s, out, *, nthreads=1):
    cdef int nt = check_threads(nthreads)
    cdef void *rec
    cdef Op op = _bound("scale", (x, out), _scale_share, sizeof(rowmap_args), &rec)
    _rowmap_prepare(<rowmap_args *>rec, x, out, nt, True)
    (<rowmap_args *>rec).s = <float>float(s)
    op.op.nshares = (<rowmap_args *>rec).n
    return op


# ============================================================================ gather_rows

cdef struct gather_args:
    const float *x
    int64_t xs
    const int64_t *rows    # int64 rows, or
    const int32_t *rows32  # int32 rows (moe_group's)
    float *o
    int64_t os, R, N, n


cdef void _gather_share(const void *args, int64_t i, int tid) noexcept nogil:
    cdef const gather_args *r = <const gather_args *>args
    cdef int64_t j, src
    for j in range(r.R * i // r.n, r.R * (i + 1) // r.n):
        src = r.rows32[j] if r.rows32 != NULL else r.rows[j]
        memcpy(r.o + j * r.os, r.x + src * r.xs, <size_t>r.N * 4)


cdef object _gather_prepare(gather_args *r, object x, object rows, object out, int nt,
                            bint check_rows=True):
    """check_rows: also check the rows' values (a bound op's are filled later)."""
    cdef f32_rows xr = rows_view(x, "x", False)
    if not isinstance(rows, np.ndarray) or rows.dtype not in (np.int64, np.int32):
        raise TypeError(f"rows must be a numpy array of int64 or int32, got "
                        f"{getattr(rows, 'dtype', type(rows).__name__)}")
    cdef cnp.ndarray ra = <cnp.ndarray>rows
    if cnp.PyArray_NDIM(ra) != 1 or not cnp.PyArray_IS_C_CONTIGUOUS(ra):
        raise ValueError(f"rows must be a contiguous 1-D array, got shape {np.shape(ra)}")
    cdef int64_t R = ra.shape[0], j, src
    r.rows = NULL
    r.rows32 = NULL
    if ra.dtype == np.int64:
        r.rows = <const int64_t *>cnp.PyArray_DATA(ra)
    else:
        r.rows32 = <const int32_t *>cnp.PyArray_DATA(ra)
    if check_rows:
        for j in range(R):
            src = r.rows32[j] if r.rows32 != NULL else r.rows[j]
            if src < 0 or src >= xr.M:
                raise IndexError(f"rows[{j}] = {src} is out of range for {xr.M} rows")
    if out is None:
        out = np.empty((R, xr.N), dtype=np.float32)
    cdef f32_rows orow = rows_view(out, "out", True)
    if orow.M != R or orow.N != xr.N or cnp.PyArray_NDIM(<cnp.ndarray>out) != 2:
        raise ValueError(f"out must have shape ({R}, {xr.N}), got {np.shape(out)}")
    cdef char *xlo = <char *>xr.p
    cdef char *olo = <char *>orow.p
    if R > 0 and xr.M > 0 and xr.N > 0 and olo < xlo + ((xr.M - 1) * xr.stride + xr.N) * 4 \
            and xlo < olo + ((R - 1) * orow.stride + orow.N) * 4:
        raise ValueError("out must not overlap x")
    r.x = xr.p
    r.xs = xr.stride
    r.o = orow.p
    r.os = orow.stride
    r.R = R
    r.N = xr.N
    cdef int n = _nth(nt, R * r.N)
    if n > R:
        n = <int>R
    r.n = 0 if R == 0 or r.N == 0 else (n if n > 1 else 1)
    return out


def gather_rows(x, rows, out=None, *, nthreads=1):
    """out[j] = x[rows[j]] for float32 x (M, N) (rows may be strided) and rows (R,) int64 or
    int32 in [0, M): the positions of a batch that need logits, an MoE layer's routed rows."""
    cdef int nt = check_threads(nthreads)
    cdef gather_args r
    out = _gather_prepare(&r, x, rows, out, nt)
    run_shares(_gather_share, &r, r.n)
    return out


def bind_gather_rows(x, rows, out, *, nthreads=1):
    """The caller keeps rows inside [0, M) for every run."""
    cdef int nt = check_threads(nthreads)
    cdef void *rec
    cdef Op op = _bound("gather_rows", (x, rows, out), _gather_share, sizeof(gather_args), &rec)
    _gather_prepare(<gather_args *>rec, x, rows, out, nt, False)
    op.op.nshares = (<gather_args *>rec).n
    return op


# ============================================================================ RoPE

cdef struct rope_args:
    const gi_ops_ops *ops
    const float *x
    float *out
    const int32_t *pos
    const double *cos_t
    const double *sin_t
    int64_t T, H, hd, half, n
    int neox


cdef void _rope_share(const void *args, int64_t i, int tid) noexcept nogil:
    cdef const rope_args *r = <const rope_args *>args
    r.ops.rope(r.x, r.out, r.pos, r.cos_t, r.sin_t, r.T * i // r.n, r.T * (i + 1) // r.n, r.H,
               r.hd, r.half, r.neox)


cdef object _rope_prepare(rope_args *r, object x, object pos, object cos, object sin, object neox,
                          object out, int nt):
    cdef cnp.ndarray xa = typed(x, "x", cnp.NPY_FLOAT32, "float32")
    cdef cnp.ndarray pa = typed(pos, "pos", cnp.NPY_INT32, "int32")
    cdef cnp.ndarray ca = typed(cos, "cos", cnp.NPY_FLOAT64, "float64")
    cdef cnp.ndarray sa = typed(sin, "sin", cnp.NPY_FLOAT64, "float64")
    if cnp.PyArray_NDIM(xa) != 3 or not cnp.PyArray_IS_C_CONTIGUOUS(xa):
        raise ValueError(f"x must be a C-contiguous (T, H, hd) array, got shape {np.shape(xa)}")
    cdef int64_t T = xa.shape[0], H = xa.shape[1], hd = xa.shape[2]
    if cnp.PyArray_NDIM(pa) != 1 or pa.shape[0] != T or not cnp.PyArray_IS_C_CONTIGUOUS(pa):
        raise ValueError(f"pos must be a contiguous ({T},) array, got shape {np.shape(pa)}")
    if (cnp.PyArray_NDIM(ca) != 2 or not cnp.PyArray_IS_C_CONTIGUOUS(ca)
            or not cnp.PyArray_IS_C_CONTIGUOUS(sa) or not _same_shape(ca, sa)):
        raise ValueError(f"cos and sin must be C-contiguous (max_pos, n_rot/2) arrays of one "
                         f"shape, got {np.shape(ca)} and {np.shape(sa)}")
    cdef int64_t max_pos = ca.shape[0], half = ca.shape[1]
    if 2 * half > hd:
        raise ValueError(f"n_rot = {2 * half} exceeds head_dim {hd}")
    cdef const int32_t *pp = <const int32_t *>cnp.PyArray_DATA(pa)
    cdef int64_t i, pmin = 0, pmax = 0
    if T > 0:
        pmin = pp[0]
        pmax = pp[0]
    for i in range(T):
        pmin = pp[i] if pp[i] < pmin else pmin
        pmax = pp[i] if pp[i] > pmax else pmax
    if pmin < 0 or pmax >= max_pos:
        raise ValueError(f"positions must lie in [0, {max_pos}), got [{pmin}, {pmax}]")
    if out is None:
        out = np.empty((T, H, hd), dtype=np.float32)
    cdef cnp.ndarray oa = typed(out, "out", cnp.NPY_FLOAT32, "float32")
    if not _same_shape(oa, xa) or not cnp.PyArray_IS_C_CONTIGUOUS(oa):
        raise ValueError(f"out must be a C-contiguous array of shape {np.shape(xa)}")
    check_writeable(oa, "out")
    r.x = <const float *>cnp.PyArray_DATA(xa)
    r.out = <float *>cnp.PyArray_DATA(oa)
    r.pos = pp
    r.cos_t = <const double *>cnp.PyArray_DATA(ca)
    r.sin_t = <const double *>cnp.PyArray_DATA(sa)
    r.neox = 1 if neox else 0
    r.ops = _table()
    r.T = T
    r.H = H
    r.hd = hd
    r.half = half
    cdef int n = _nth(nt, T * H * hd)
    if n > T:
        n = <int>T
    r.n = 0 if T == 0 else (n if n > 1 else 1)
    return out


def rope(x, pos, cos, sin, neox, out=None, *, nthreads=1):
    """Rotary embedding of x (T, H, hd) at rows pos (T,) int32 of cos/sin (n, n_rot/2) float64
    (RopeCache.rows: the rows of a batch's positions).  neox=False: pairs (2i, 2i+1); True: (i, i + n_rot/2).  Dims past
    n_rot pass through.  In place when out is x.  Bit-exact with goinfer._reference.rope."""
    cdef int nt = check_threads(nthreads)
    cdef rope_args r
    out = _rope_prepare(&r, x, pos, cos, sin, neox, out, nt)
    run_shares(_rope_share, &r, r.n)
    return out


def bind_rope(x, pos, cos, sin, neox, out, *, nthreads=1):
    """The caller keeps pos inside [0, len(cos)) for every run."""
    cdef int nt = check_threads(nthreads)
    cdef void *rec
    cdef Op op = _bound("rope", (x, pos, cos, sin, out), _rope_share, sizeof(rope_args), &rec)
    _rope_prepare(<rope_args *>rec, x, pos, cos, sin, neox, out, nt)
    op.op.nshares = (<rope_args *>rec).n
    return op


# ============================================================================ test hooks

def _variant_used():
    """Name of the variant whose table this module calls now (tests: dispatch follows
    _config.set_variant)."""
    return table_variant(_table(), &gi_ops_ops_portable, &gi_ops_ops_avx2, &gi_ops_ops_avx512)


def _set_grain(n):
    """Work per thread below which calls stay single-threaded (tests set 0 to force
    threads).  Returns the previous value."""
    return swap_grain(&_GRAIN, n)


def _exp_f32(x):
    """The kernel's float32 exp (current variant) of a 1-D float32 array (for tests)."""
    cdef cnp.ndarray xa = np.ascontiguousarray(x, dtype=np.float32).ravel()
    cdef cnp.ndarray ya = np.empty_like(xa)
    _table().exp_f32(<const float *>cnp.PyArray_DATA(xa), <float *>cnp.PyArray_DATA(ya),
                     xa.shape[0])
    return ya
