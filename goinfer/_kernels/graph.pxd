# cython: language_level=3
"""C API of the graph executor (src/graph.h) and the Op record every bind_* function fills."""
from cython.parallel cimport prange, threadid
from libc.stdint cimport int64_t

cdef extern from "graph.h" nogil:
    ctypedef void (*gi_share_fn)(const void *args, int64_t share, int tid) noexcept nogil
    ctypedef int (*gi_warm_fn)(const void *args, int64_t chunk) noexcept nogil
    ctypedef struct gi_op:
        gi_share_fn run
        const void *args
        int64_t nshares
        int barrier
        gi_warm_fn warm
    int64_t GI_GRAPH_WORK(int64_t n)
    int64_t GI_GRAPH_PROF(int64_t n)
    void gi_warm_bytes(const void *p, int64_t n)
    void gi_graph_run(const gi_op *ops, int64_t n, int nthreads, int64_t *work, int64_t *prof)


cdef class Op:
    cdef gi_op op
    cdef void *mem
    cdef readonly str name
    cdef readonly object refs
    cdef void *alloc(self, size_t size) except NULL


# One share of a kernel's argument record (the type of gi_op.run): what a Python kernel call
# runs per OpenMP thread and what a bound Op runs per claimed share.
ctypedef void (*share_fn)(const void *args, int64_t share, int tid) noexcept nogil


cdef inline void run_shares(share_fn fn, const void *args, int64_t n) noexcept:
    """Shares 0 .. n-1 of a record: inline when n == 1, else one OpenMP thread each."""
    cdef int64_t t
    with nogil:
        if n == 1:
            fn(args, 0, 0)
        elif n > 1:
            for t in prange(n, num_threads=n, schedule='static'):
                fn(args, t, <int>t)


cdef inline void run_shares_dynamic(share_fn fn, const void *args, int64_t n, int nthreads) noexcept:
    """Shares 0 .. n-1 of a record on up to nthreads OpenMP threads, each taking the next share
    as it finishes one (a thread slowed by the machine takes fewer): inline when one thread."""
    cdef int64_t t
    cdef int nt = <int>(n if n < nthreads else nthreads)
    with nogil:
        if nt <= 1:
            for t in range(n):
                fn(args, t, 0)
        else:
            for t in prange(n, num_threads=nt, schedule='dynamic', chunksize=1):
                fn(args, t, <int>threadid())


cdef inline Op bound(str name, tuple refs, share_fn fn, size_t size, void **rec):
    """A new Op running fn over its own zeroed record of size bytes (*rec: where to fill it)."""
    cdef Op op = Op(name, refs)
    rec[0] = op.alloc(size)
    op.op.run = fn
    return op
