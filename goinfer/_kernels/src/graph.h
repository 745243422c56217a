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
 *
 * Warming: a thread that waits at a barrier is idle while memory may be too (the one running
 * thread computes a norm, a RoPE, a quantization).  It spends the wait prefetching what the next
 * op with a `warm` function reads first (a matmul: the heads of its shares' weight rows, into
 * its cache), a chunk at a time, checking the barrier between chunks, until that op's warm
 * function says its limit is reached.  Prefetches change no result.
 */
#ifndef GI_GRAPH_H
#define GI_GRAPH_H
#include <stdint.h>

typedef void (*gi_share_fn)(const void *args, int64_t share, int tid);

/* Prefetches chunk `chunk` (0, 1, ...) of what the op reads first; returns 0, doing nothing,
   once chunk is past the op's warm limit.  Chunks may come from several threads at once. */
typedef int (*gi_warm_fn)(const void *args, int64_t chunk);

typedef struct {
    gi_share_fn run;     /* computes one share of the op; tid = 0 .. nthreads-1 */
    const void *args;    /* the op's argument record (owned by its Python Op object) */
    int64_t nshares;     /* shares 0 .. nshares-1 (0: nothing to do) */
    int barrier;         /* 1: start only after every earlier op is complete */
    gi_warm_fn warm;     /* NULL, or what a thread waiting at a barrier before it prefetches */
} gi_op;

/* Prefetch the cache lines of [p, p + n) into the outer caches (prefetcht1 on x86: L2, not L1): a
   hint, it reads nothing into the program and changes no result. */
static inline void gi_warm_bytes(const void *p, int64_t n) {
    const char *c = (const char *)((uintptr_t)p & ~(uintptr_t)63), *end = (const char *)p + n;
    for (; c < end; c += 64) __builtin_prefetch(c, 0, 2);
}

/* Run ops[0..n) on up to nthreads threads.  work: GI_GRAPH_WORK(n) int64 of work space (set
 * here; after the run work[n .. 2n) holds each op's warm chunks claimed, the last one of each
 * thread that found the limit included).  Without OpenMP (or nthreads <= 1) the shares run in
 * order on the calling thread (nothing waits, nothing is warmed).  prof: NULL, or
 * GI_GRAPH_PROF(n) int64 the run adds nanoseconds to (CLOCK_MONOTONIC, two readings per share
 * and per barrier): prof[i] the time op i's shares ran, summed over the threads, prof[n + i]
 * the time threads waited at op i's barrier (warming included), summed over the threads. */
#define GI_GRAPH_WORK(n) (3 * (n))
#define GI_GRAPH_PROF(n) (2 * (n))
void gi_graph_run(const gi_op *ops, int64_t n, int nthreads, int64_t *work, int64_t *prof);

#endif
