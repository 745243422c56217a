# cython: language_level=3, boundscheck=False, wraparound=False
"""Graph replay: bound kernel ops and the executor that runs them in one OpenMP region.

``bind_*`` functions of matmul / ops / attention check their arguments exactly as the Python
kernels do (the same code) and return an ``Op``: a C argument record plus the function that
computes one share of the work (one of the tiles / row ranges / work items the Python kernel
would hand to one OpenMP thread).  ``Graph(ops, nthreads).run()`` runs the ops in order in one
parallel region: running threads claim the shares, and an op whose ``barrier`` flag is set
starts once every earlier op is complete (goinfer/graph.py sets the flags; src/graph.h); a
thread waiting at a barrier prefetches the head of the next op that can be warmed (a matmul's
weight rows: matmul.pyx).  An Op holds references to every array its record points into.
"""
cimport numpy as cnp
import numpy as np
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memset

from goinfer._kernels.checks cimport check_threads

cnp.import_array()


cdef extern from "<stdlib.h>" nogil:
    void *aligned_alloc(size_t alignment, size_t size)


cdef class Op:
    """One bound kernel call (see the module doc)."""

    def __cinit__(self, str name, refs):
        self.name = name
        self.refs = refs
        self.mem = NULL
        memset(&self.op, 0, sizeof(gi_op))
        self.op.barrier = 1

    cdef void *alloc(self, size_t size) except NULL:
        """The op's argument record: size bytes, zeroed, freed with the Op (once per Op)."""
        if self.mem != NULL:
            raise RuntimeError("Op.alloc called twice")
        cdef size_t n = (size + 63) & ~(<size_t>63)
        self.mem = aligned_alloc(64, n if n else 64)
        if self.mem == NULL:
            raise MemoryError(f"op record of {size} bytes")
        memset(self.mem, 0, n)
        self.op.args = self.mem
        return self.mem

    def __dealloc__(self):
        if self.mem != NULL:
            free(self.mem)
            self.mem = NULL

    @property
    def nshares(self):
        """Pieces of work (at most one per thread; 0: nothing to do)."""
        return self.op.nshares

    @property
    def barrier(self):
        return bool(self.op.barrier)

    @barrier.setter
    def barrier(self, value):
        self.op.barrier = 1 if value else 0

    def __repr__(self):
        return f"Op({self.name}, shares={self.op.nshares}, barrier={bool(self.op.barrier)})"


cdef class Graph:
    """A list of bound ops run by gi_graph_run on nthreads threads (GIL released)."""

    cdef gi_op *ops
    cdef int64_t *work
    cdef int64_t *prof  # NULL unless profiling (start_profile)
    cdef int64_t runs   # runs since start_profile
    cdef int64_t n
    cdef int nthreads
    cdef readonly list op_list

    def __cinit__(self, ops, nthreads):
        self.nthreads = check_threads(nthreads)
        self.op_list = list(ops)
        self.n = len(self.op_list)
        self.ops = <gi_op *>malloc(sizeof(gi_op) * (self.n if self.n else 1))
        self.work = <int64_t *>calloc(GI_GRAPH_WORK(self.n if self.n else 1), sizeof(int64_t))
        self.prof = NULL
        self.runs = 0
        if self.ops == NULL or self.work == NULL:
            raise MemoryError("graph op array")
        cdef int64_t i
        cdef Op o
        for i in range(self.n):
            o = <Op?>self.op_list[i]
            if o.op.run == NULL or o.op.args == NULL:
                raise ValueError(f"op {i} ({o.name}) is not bound")
            self.ops[i] = o.op

    def __dealloc__(self):
        free(self.ops)
        free(self.work)
        free(self.prof)
        self.ops = NULL
        self.work = NULL
        self.prof = NULL

    def run(self):
        """Run every op once."""
        with nogil:
            gi_graph_run(self.ops, self.n, self.nthreads, self.work, self.prof)
        self.runs += 1

    # ------------------------------------------------------------------ profiling

    def start_profile(self):
        """Time every op from the next run on (two clock readings per share and per barrier),
        from zero; profile() reads the sums."""
        if self.prof == NULL:
            self.prof = <int64_t *>calloc(GI_GRAPH_PROF(self.n if self.n else 1), sizeof(int64_t))
            if self.prof == NULL:
                raise MemoryError("graph profile")
        else:
            memset(self.prof, 0, GI_GRAPH_PROF(self.n if self.n else 1) * sizeof(int64_t))
        self.runs = 0

    def stop_profile(self):
        """Stop timing (the sums are dropped)."""
        free(self.prof)
        self.prof = NULL

    def profile(self):
        """Since start_profile: {"runs": runs, "run_ns": (n,) int64, "wait_ns": (n,) int64}, per
        op the nanoseconds its shares ran and threads waited at its barrier (warming
        included), each summed over the threads; None when not profiling."""
        if self.prof == NULL:
            return None
        cdef int64_t i
        run = np.empty(self.n, np.int64)
        wait = np.empty(self.n, np.int64)
        for i in range(self.n):
            run[i] = self.prof[i]
            wait[i] = self.prof[self.n + i]
        return {"runs": self.runs, "run_ns": run, "wait_ns": wait}

    @property
    def threads(self):
        """The threads the graph runs on (1: the calling thread, no parallel region)."""
        return self.nthreads

    @property
    def warm_chunks(self):
        """Warm chunks claimed in the last run, over every op (each waiting thread's claim
        that found an op's limit included; 0 before the first run and with one thread)."""
        cdef int64_t i, total = 0
        for i in range(self.n):
            total += self.work[self.n + i]
        return total

    @property
    def n_barriers(self):
        cdef int64_t i, nb = 0
        for i in range(self.n):
            nb += self.ops[i].barrier
        return nb

    def __len__(self):
        return self.n
