# cython: language_level=3
"""C API of the graph executor (src/graph.h) and the Op record every bind_* function fills."""
from libc.stdint cimport int64_t

cdef extern from "graph.h" nogil:
    ctypedef void (*gi_share_fn)(const void *args, int64_t share, int tid) noexcept nogil
    ctypedef struct gi_op:
        gi_share_fn run
        const void *args
        int64_t nshares
        int barrier
    void gi_graph_run(const gi_op *ops, int64_t n, int nthreads, int64_t *claim)


cdef class Op:
    cdef gi_op op
    cdef void *mem
    cdef readonly str name
    cdef readonly object refs
    cdef void *alloc(self, size_t size) except NULL
