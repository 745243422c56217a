/* Graph replay: run a recorded list of kernel ops in ONE OpenMP parallel region.
 *
 * An op is a kernel call whose arguments were checked once (the Cython bind_* functions) and
 * stored in an args record.  Its work is cut into `nshares` shares: the same ranges / tiles /
 * work items the Python wrapper hands to its OpenMP threads.  A share computes the same output
 * elements with the same code whichever thread runs it, so results are bit-identical to the
 * Python path (tid only picks a per-thread scratch buffer, e.g. attention's).
 *
 * gi_graph_run: the threads of one parallel region claim shares op by op from a counter
 * (whoever is running takes the next share), and an op whose `barrier` flag is set starts only
 * when every share of every earlier op is done.  Nobody waits for a thread that is not
 * running: a descheduled thread simply claims nothing (on a busy machine one thread may run a
 * whole step).  The only wait for all threads is the end of the parallel region.
 */
#ifndef GI_GRAPH_H
#define GI_GRAPH_H
#include <stdint.h>

typedef void (*gi_share_fn)(const void *args, int64_t share, int tid);

typedef struct {
    gi_share_fn run;     /* computes one share of the op; tid = 0 .. nthreads-1 */
    const void *args;    /* the op's argument record (owned by its Python Op object) */
    int64_t nshares;     /* shares 0 .. nshares-1 (0: nothing to do) */
    int barrier;         /* 1: start only after every earlier op is complete */
} gi_op;

/* Run ops[0..n) on up to nthreads threads.  claim: n int64 of work space (zeroed here).
 * Without OpenMP (or nthreads <= 1) the shares run in order on the calling thread. */
void gi_graph_run(const gi_op *ops, int64_t n, int nthreads, int64_t *claim);

#endif
