# cython: language_level=3
"""Argument checks every kernel module shares (cimport them; nothing here is Python-visible).

One rule per check, so every kernel accepts and rejects the same inputs with the same message,
which names the argument:
  check_threads(nthreads)                     an int or NumPy integer (not bool) in
                                              [1, MAX_THREADS] -> int; else ValueError
  typed(a, name, typenum, tname)              a numpy array of that dtype (native byte
                                              order); else TypeError
  carray(a, name, typenum, tname, ndim, d0..) typed, that shape (ANY: any size), C-contiguous
                                              and aligned; else ValueError
  carray_writeable(...)                       carray, and writeable
  rows_view(a, name, writeable)               float32 rows with a row stride (see rows_view)
The grain helpers serve the modules' thread-count thresholds and their _set_grain test hooks.
"""
cimport numpy as cnp
from libc.stdint cimport int64_t

cdef enum:
    MAX_THREADS = 1024  # the most OpenMP threads a kernel call takes
    ANY = -1            # carray: a dimension of any size


# ============================================================================ thread count

cdef inline int check_threads(object nthreads) except -1:
    """nthreads as a C int: an int or NumPy integer (not bool) in [1, MAX_THREADS]."""
    if isinstance(nthreads, (int, cnp.integer)) and not isinstance(nthreads, bool):
        if 1 <= nthreads <= MAX_THREADS:
            return <int>nthreads
    raise ValueError(f"nthreads must be an int in [1, {MAX_THREADS}], got {nthreads!r}")


cdef inline int grain_threads(int64_t grain, int nthreads, int64_t work) noexcept nogil:
    """Threads for `work` units at `grain` units per thread at least: 1 .. nthreads (grain <= 0:
    nthreads)."""
    if grain <= 0:
        return nthreads
    cdef int64_t n = work // grain
    if n < 1:
        n = 1
    return <int>(nthreads if nthreads < n else n)


cdef inline object swap_grain(int64_t *grain, object value):
    """*grain = value (an integer); returns the old value (the modules' _set_grain hooks)."""
    old = grain[0]
    grain[0] = value
    return old


# ============================================================================ arrays

cdef inline cnp.ndarray typed(object a, str name, int typenum, str tname):
    """a as an ndarray of dtype typenum in native byte order (tname: its name in messages), else
    TypeError."""
    if not cnp.PyArray_Check(a):
        raise TypeError(f"{name} must be a numpy array of {tname}, got {type(a).__name__}")
    cdef cnp.ndarray arr = <cnp.ndarray>a
    if cnp.PyArray_TYPE(arr) != typenum or not cnp.PyArray_ISNOTSWAPPED(arr):
        raise TypeError(f"{name} must have dtype {tname}, got {arr.dtype}")  # (">f4": swapped)
    return arr


cdef inline int check_writeable(cnp.ndarray arr, str name) except -1:
    if not cnp.PyArray_ISWRITEABLE(arr):
        raise ValueError(f"{name} is read-only")
    return 0


cdef inline cnp.ndarray carray(object a, str name, int typenum, str tname, int ndim,
                               int64_t d0=ANY, int64_t d1=ANY, int64_t d2=ANY, int64_t d3=ANY,
                               int64_t d4=ANY):
    """a as a C-contiguous, aligned ndarray of dtype typenum with ndim dimensions of sizes
    d0, d1, ... (ANY: any size; at most 5 dimensions), else TypeError / ValueError."""
    cdef cnp.ndarray arr = typed(a, name, typenum, tname)
    cdef int64_t want[5]
    want[0] = d0
    want[1] = d1
    want[2] = d2
    want[3] = d3
    want[4] = d4
    cdef cnp.npy_intp *dims = cnp.PyArray_DIMS(arr)
    cdef int i
    cdef bint bad = cnp.PyArray_NDIM(arr) != ndim, fixed = False
    for i in range(ndim):
        fixed = fixed or want[i] != ANY
        if not bad and want[i] != ANY and dims[i] != want[i]:
            bad = True
    if bad:
        got = (<object>arr).shape
        if not fixed:
            raise ValueError(f"{name} must have {ndim} dimensions, got shape {got}")
        sizes = ", ".join(["?" if want[i] == ANY else str(want[i]) for i in range(ndim)])
        raise ValueError(f"{name} must have shape ({sizes}{',' if ndim == 1 else ''}), got {got}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(arr) or not cnp.PyArray_ISALIGNED(arr):
        raise ValueError(f"{name} must be C-contiguous and aligned")
    return arr


cdef inline cnp.ndarray carray_writeable(object a, str name, int typenum, str tname, int ndim,
                                         int64_t d0=ANY, int64_t d1=ANY, int64_t d2=ANY,
                                         int64_t d3=ANY, int64_t d4=ANY):
    """carray, and writeable (an output)."""
    cdef cnp.ndarray arr = carray(a, name, typenum, tname, ndim, d0, d1, d2, d3, d4)
    check_writeable(arr, name)
    return arr


ctypedef struct f32_rows:
    float *p
    int64_t M, N, stride  # M rows of N floats, row m at p + m * stride


cdef inline f32_rows rows_view(object a, str name, bint writeable) except *:
    """A float32 array as rows: 2-D with a contiguous last axis and rows that do not overlap
    (e.g. gate = h[:, :F] of an (M, 2F) buffer; stride >= N), or any C-contiguous array with
    at least one dimension, seen as (size / N, N)."""
    cdef cnp.ndarray arr = typed(a, name, cnp.NPY_FLOAT32, "float32")
    cdef f32_rows r
    cdef int nd = cnp.PyArray_NDIM(arr)
    cdef cnp.npy_intp *shape = cnp.PyArray_DIMS(arr)
    cdef cnp.npy_intp *strides = cnp.PyArray_STRIDES(arr)
    if nd == 0:
        raise ValueError(f"{name} must have at least 1 dimension")
    r.N = shape[nd - 1]
    if nd == 2 and (shape[1] <= 1 or strides[1] == 4) and (
            shape[0] <= 1 or (strides[0] % 4 == 0 and strides[0] >= 4 * shape[1])):
        r.M = shape[0]
        r.stride = strides[0] // 4 if shape[0] > 1 else r.N
    elif cnp.PyArray_IS_C_CONTIGUOUS(arr):
        r.M = cnp.PyArray_SIZE(arr) // r.N if r.N > 0 else 0
        r.stride = r.N
    else:
        raise ValueError(f"{name} must be C-contiguous, or 2-D with a contiguous last axis and "
                         f"rows that do not overlap (strides {(<object>arr).strides})")
    if not cnp.PyArray_ISALIGNED(arr):
        raise ValueError(f"{name} must be aligned")
    if writeable:
        check_writeable(arr, name)
    r.p = <float *>cnp.PyArray_DATA(arr)
    return r
