# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Elementwise and normalization kernels: rmsnorm, swiglu, gelu_tanh_mul, rope, add.

Same names, signatures and meaning as goinfer._reference (see docs/design/kernels.md for the
exact contracts).  All float arrays are float32.

Layouts accepted:
  rmsnorm, swiglu, gelu_tanh_mul, add: a 2-D (M, N) array whose last axis is contiguous and
    whose rows may be strided (e.g. gate = h[:, :F], up = h[:, F:] of one (M, 2F) buffer), or
    any C-contiguous array (treated as (size / N, N)).  ``out`` follows the same rule, must
    have the input's shape and may be the same array as an input (in place).
  rope: x (T, H, hd) C-contiguous; ``out`` C-contiguous or ``x`` itself (in place).
"""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int32_t, int64_t
from cython.parallel cimport prange
from goinfer._kernels.dispatch cimport GI_AVX2, GI_AVX512, gi_variant
from goinfer._kernels import _config as _cfg

cnp.import_array()

cdef extern from "ops.h" nogil:
    ctypedef struct gi_ops_ops:
        void (*rmsnorm)(const float *x, int64_t xs, const float *w, float *out, int64_t os,
                        int64_t m0, int64_t m1, int64_t D, double eps) noexcept nogil
        void (*swiglu)(const float *g, int64_t gs, const float *u, int64_t us, float *out,
                       int64_t os, int64_t m0, int64_t m1, int64_t c0, int64_t c1) noexcept nogil
        void (*gelu_tanh_mul)(const float *g, int64_t gs, const float *u, int64_t us, float *out,
                              int64_t os, int64_t m0, int64_t m1, int64_t c0,
                              int64_t c1) noexcept nogil
        void (*add)(const float *x, int64_t xs, const float *y, int64_t ys, float *out, int64_t os,
                    int64_t m0, int64_t m1, int64_t c0, int64_t c1) noexcept nogil
        void (*rope)(const float *x, float *out, const int32_t *pos, const double *cos_t,
                     const double *sin_t, int64_t t0, int64_t t1, int64_t H, int64_t hd,
                     int64_t half, int neox) noexcept nogil
        void (*exp_f32)(const float *x, float *y, int64_t n) noexcept nogil
    const gi_ops_ops gi_ops_ops_portable
    const gi_ops_ops gi_ops_ops_avx2
    const gi_ops_ops gi_ops_ops_avx512

# below this many elements per thread, extra threads cost more than they give
cdef int64_t _GRAIN = 32768


# The variant in use: the shared kernel library holds one dispatch state for every module.


cdef const gi_ops_ops *_table() except NULL:
    cdef int v = gi_variant()
    if v == GI_AVX512:
        return &gi_ops_ops_avx512
    if v == GI_AVX2:
        return &gi_ops_ops_avx2
    return &gi_ops_ops_portable


# ============================================================================ argument checks

cdef int _check_threads(object nthreads) except -1:
    if isinstance(nthreads, (int, np.integer)) and not isinstance(nthreads, bool):
        if 1 <= nthreads <= 1024:
            return <int>nthreads
    raise ValueError(f"nthreads must be a positive int, got {nthreads!r}")


cdef cnp.ndarray _array(object a, str name, int typenum, str tname):
    if not cnp.PyArray_Check(a):
        raise TypeError(f"{name} must be a numpy array of {tname}, got {type(a).__name__}")
    cdef cnp.ndarray arr = <cnp.ndarray>a
    if cnp.PyArray_TYPE(arr) != typenum:
        raise TypeError(f"{name} must have dtype {tname}, got {arr.dtype}")
    return arr


cdef class _Rows:
    """A float32 array seen as M rows of N contiguous floats with a row stride."""
    cdef float *p
    cdef int64_t M, N, stride


cdef _Rows _rows(object a, str name, bint writeable):
    cdef cnp.ndarray arr = _array(a, name, cnp.NPY_FLOAT32, "float32")
    cdef _Rows r = _Rows()
    cdef int nd = cnp.PyArray_NDIM(arr)
    cdef cnp.npy_intp *shape = cnp.PyArray_DIMS(arr)
    cdef cnp.npy_intp *strides = cnp.PyArray_STRIDES(arr)
    if writeable and not cnp.PyArray_ISWRITEABLE(arr):
        raise ValueError(f"{name} is read-only")
    if nd == 0:
        raise ValueError(f"{name} must have at least 1 dimension")
    r.N = shape[nd - 1]
    if nd == 2 and (shape[1] <= 1 or strides[1] == 4) and strides[0] % 4 == 0 and strides[0] >= 0:
        r.M = shape[0]
        r.stride = strides[0] // 4 if shape[0] > 1 else r.N
    elif cnp.PyArray_IS_C_CONTIGUOUS(arr):
        r.M = cnp.PyArray_SIZE(arr) // r.N if r.N > 0 else 0
        r.stride = r.N
    else:
        raise ValueError(f"{name} must be C-contiguous, or 2-D with a contiguous last axis "
                         f"(strides {(<object>arr).strides})")
    r.p = <float *>cnp.PyArray_DATA(arr)
    return r


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


cdef _Rows _out_rows(object out, object like):
    cdef _Rows r = _rows(out, "out", True)
    if not _same_shape(out, like):
        raise ValueError(f"out has shape {np.shape(out)}, expected {np.shape(like)}")
    return r


cdef inline int _nth(int nthreads, int64_t work) noexcept nogil:
    if _GRAIN <= 0:
        return nthreads
    cdef int64_t n = work // _GRAIN
    if n < 1:
        n = 1
    return <int>(nthreads if nthreads < n else n)


# ============================================================================ RMSNorm

def rmsnorm(x, w, eps, out=None, *, nthreads=1):
    """out = float32(x * r) * w, r = float32(1 / sqrt(mean(x^2) + eps)) per row (last axis).

    Bit-exact with goinfer._reference.rmsnorm.  x (M, D) (or any C-contiguous (..., D)),
    w (D,) float32."""
    cdef int nt = _check_threads(nthreads)
    cdef _Rows xr = _rows(x, "x", False)
    cdef cnp.ndarray wa = _array(w, "w", cnp.NPY_FLOAT32, "float32")
    if cnp.PyArray_NDIM(wa) != 1 or cnp.PyArray_DIMS(wa)[0] != xr.N:
        raise ValueError(f"w must have shape ({xr.N},), got {np.shape(wa)}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(wa):
        raise ValueError("w must be contiguous")
    if out is None:
        out = np.empty_like(x, order="C")
    cdef _Rows orow = _out_rows(out, x)
    cdef double e = float(eps)
    cdef const float *wp = <const float *>cnp.PyArray_DATA(wa)
    cdef const gi_ops_ops *ops = _table()
    cdef int64_t M = xr.M, D = xr.N, i
    cdef int n = _nth(nt, M * D)
    if n > M:
        n = <int>M
    if M == 0:
        return out
    with nogil:
        if n <= 1:
            ops.rmsnorm(xr.p, xr.stride, wp, orow.p, orow.stride, 0, M, D, e)
        else:
            for i in prange(n, num_threads=n, schedule='static'):
                ops.rmsnorm(xr.p, xr.stride, wp, orow.p, orow.stride,
                            M * i // n, M * (i + 1) // n, D, e)
    return out


# ============================================================================ elementwise (binary)

cdef int _KIND_SWIGLU = 0
cdef int _KIND_GELU = 1
cdef int _KIND_ADD = 2


cdef inline void _binary_call(const gi_ops_ops *ops, int kind, const float *a, int64_t as_,
                              const float *b, int64_t bs, float *o, int64_t os, int64_t m0,
                              int64_t m1, int64_t c0, int64_t c1) noexcept nogil:
    if kind == _KIND_SWIGLU:
        ops.swiglu(a, as_, b, bs, o, os, m0, m1, c0, c1)
    elif kind == _KIND_GELU:
        ops.gelu_tanh_mul(a, as_, b, bs, o, os, m0, m1, c0, c1)
    else:
        ops.add(a, as_, b, bs, o, os, m0, m1, c0, c1)


cdef object _binary(int kind, object a, object b, object out, object nthreads, str an, str bn):
    cdef int nt = _check_threads(nthreads)
    cdef _Rows ar = _rows(a, an, False)
    cdef _Rows br = _rows(b, bn, False)
    if not _same_shape(a, b):
        raise ValueError(f"{an} and {bn} must have the same shape, got {np.shape(a)} and "
                         f"{np.shape(b)}")
    if out is None:
        out = np.empty_like(a, order="C")
    cdef _Rows orow = _out_rows(out, a)
    cdef const gi_ops_ops *ops = _table()
    cdef int64_t M = ar.M, N = ar.N, i, c0, c1
    cdef int n = _nth(nt, M * N)
    if M == 0 or N == 0:
        return out
    with nogil:
        if n <= 1:
            _binary_call(ops, kind, ar.p, ar.stride, br.p, br.stride, orow.p, orow.stride,
                         0, M, 0, N)
        elif M >= n:  # split rows
            for i in prange(n, num_threads=n, schedule='static'):
                _binary_call(ops, kind, ar.p, ar.stride, br.p, br.stride, orow.p, orow.stride,
                             M * i // n, M * (i + 1) // n, 0, N)
        else:  # few long rows: split columns (at multiples of 16 floats)
            for i in prange(n, num_threads=n, schedule='static'):
                c0 = (N * i // n) & ~(<int64_t>15)
                c1 = N if i == n - 1 else (N * (i + 1) // n) & ~(<int64_t>15)
                _binary_call(ops, kind, ar.p, ar.stride, br.p, br.stride, orow.p, orow.stride,
                             0, M, c0, c1)
    return out


def swiglu(gate, up, out=None, *, nthreads=1):
    """out = silu(gate) * up, silu(g) = g / (1 + exp(-g)), in float32 with the kernel's own
    exp (one operation sequence per element).  gate/up may be strided column halves of one
    (M, 2F) buffer (rows strided, last axis contiguous)."""
    return _binary(_KIND_SWIGLU, gate, up, out, nthreads, "gate", "up")


def gelu_tanh_mul(gate, up, out=None, *, nthreads=1):
    """out = gelu_tanh(gate) * up (GeGLU), computed as g / (1 + exp(-2c(g + 0.044715 g^3)))
    (= 0.5 g (1 + tanh(c(g + 0.044715 g^3))), c = sqrt(2/pi)) in float32."""
    return _binary(_KIND_GELU, gate, up, out, nthreads, "gate", "up")


def add(x, y, out=None, *, nthreads=1):
    """out = x + y in float32 (residual add; bit-exact with numpy).  out may be x."""
    return _binary(_KIND_ADD, x, y, out, nthreads, "x", "y")


# ============================================================================ RoPE

def rope(x, pos, cos, sin, neox, out=None, *, nthreads=1):
    """Rotary embedding of x (T, H, hd) at positions pos (T,) int32; cos/sin (max_pos, n_rot/2)
    float64 from rope_tables.  neox=False: pairs (2i, 2i+1); True: (i, i + n_rot/2).  Dims past
    n_rot pass through.  In place when out is x.  Bit-exact with goinfer._reference.rope."""
    cdef int nt = _check_threads(nthreads)
    cdef cnp.ndarray xa = _array(x, "x", cnp.NPY_FLOAT32, "float32")
    cdef cnp.ndarray pa = _array(pos, "pos", cnp.NPY_INT32, "int32")
    cdef cnp.ndarray ca = _array(cos, "cos", cnp.NPY_FLOAT64, "float64")
    cdef cnp.ndarray sa = _array(sin, "sin", cnp.NPY_FLOAT64, "float64")
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
    cdef cnp.ndarray oa = _array(out, "out", cnp.NPY_FLOAT32, "float32")
    if not _same_shape(oa, xa) or not cnp.PyArray_IS_C_CONTIGUOUS(oa):
        raise ValueError(f"out must be a C-contiguous array of shape {np.shape(xa)}")
    if not cnp.PyArray_ISWRITEABLE(oa):
        raise ValueError("out is read-only")
    cdef const float *xp = <const float *>cnp.PyArray_DATA(xa)
    cdef float *op = <float *>cnp.PyArray_DATA(oa)
    cdef const double *cp = <const double *>cnp.PyArray_DATA(ca)
    cdef const double *sp = <const double *>cnp.PyArray_DATA(sa)
    cdef int nx = 1 if neox else 0
    cdef const gi_ops_ops *ops = _table()
    cdef int n = _nth(nt, T * H * hd)
    if n > T:
        n = <int>T
    if T == 0:
        return out
    with nogil:
        if n <= 1:
            ops.rope(xp, op, pp, cp, sp, 0, T, H, hd, half, nx)
        else:
            for i in prange(n, num_threads=n, schedule='static'):
                ops.rope(xp, op, pp, cp, sp, T * i // n, T * (i + 1) // n, H, hd, half, nx)
    return out


# ============================================================================ test hooks

def _variant_used():
    """Name of the variant whose table this module calls now (tests: dispatch follows
    _config.set_variant)."""
    cdef const gi_ops_ops *t = _table()
    if t == &gi_ops_ops_avx512:
        return _cfg.VARIANTS[GI_AVX512]
    if t == &gi_ops_ops_avx2:
        return _cfg.VARIANTS[GI_AVX2]
    return _cfg.VARIANTS[0]


def _set_grain(n):
    """Work per thread below which calls stay single-threaded (tests set 0 to force
    threads).  Returns the previous value."""
    global _GRAIN
    old = _GRAIN
    _GRAIN = n
    return old


def _exp_f32(x):
    """The kernel's float32 exp (current variant) of a 1-D float32 array (for tests)."""
    cdef cnp.ndarray xa = np.ascontiguousarray(x, dtype=np.float32).ravel()
    cdef cnp.ndarray ya = np.empty_like(xa)
    _table().exp_f32(<const float *>cnp.PyArray_DATA(xa), <float *>cnp.PyArray_DATA(ya),
                     xa.shape[0])
    return ya
