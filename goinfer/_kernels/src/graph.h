/* Graph replay: run a recorded list of kernel ops in ONE OpenMP parallel region.
 *
 * An op is a kernel call whose arguments were checked once (the Cython bind_* functions) and
 * stored in an args record.  Its work is cut into `nshares` shares, the same ranges / tiles /
 * work items the Python wrapper hands to its OpenMP threads, so every output element is
 * computed by exactly one thread with the same code and the result is bit-identical.
 *
 * gi_graph_run: one parallel region; thread tid runs shares tid, tid + nt, ... of each op in
 * order, and all threads meet at a barrier before every op whose `barrier` flag is set (the
 * capture clears it only where it is provably not needed: see goinfer/graph.py).
 */
#ifndef GI_GRAPH_H
#define GI_GRAPH_H
#include <stdint.h>

typedef void (*gi_share_fn)(const void *args, int64_t share);

typedef struct {
    gi_share_fn run;     /* computes one share of the op */
    const void *args;    /* the op's argument record (owned by its Python Op object) */
    int64_t nshares;     /* shares 0 .. nshares-1 (0: nothing to do) */
    int barrier;         /* 1: every thread waits for the previous ops before this one */
} gi_op;

/* Run ops[0..n) on up to nthreads threads.  Without OpenMP (or nthreads <= 1) the shares run
 * in order on the calling thread. */
void gi_graph_run(const gi_op *ops, int64_t n, int nthreads);

#endif
