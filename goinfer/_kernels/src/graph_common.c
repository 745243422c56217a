/* The graph executor (graph.h): one OpenMP parallel region for a whole forward step, shares
 * claimed dynamically, ordering by a count of finished shares. */
#include <sched.h>
#include <string.h>
#include <time.h>
#include "graph.h"
#ifdef _OPENMP
#include <omp.h>
#endif

static inline int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Share s of op on thread tid; with a profile, its time added to *ran (may be shared). */
static inline void run_share(const gi_op *op, int64_t s, int tid, int64_t *ran) {
    if (!ran) {
        op->run(op->args, s, tid);
        return;
    }
    const int64_t t0 = now_ns();
    op->run(op->args, s, tid);
    __atomic_fetch_add(ran, now_ns() - t0, __ATOMIC_RELAXED);
}

static void run_serial(const gi_op *ops, int64_t n, int64_t *prof) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t s = 0; s < ops[i].nshares; s++) run_share(&ops[i], s, 0, prof ? &prof[i] : 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Wait until *done >= need.  First warm op w (ops[w].warm; w == n: none) a chunk at a time,
 * its chunks claimed from warmed[w], until its limit; then spin briefly (~10 us), then yield
 * the core at every check (the thread we wait for may need it on a busy machine; 200 rather
 * than 4000 spins measured 33 vs 38 ms/token for SmolLM2 with 2 threads beside two busy loops,
 * docs/benchmarks.md). */
static void wait_done(const int64_t *done, int64_t need, const gi_op *ops, int64_t n, int64_t w,
                      int64_t *warmed) {
    int spins = 0;
    while (__atomic_load_n(done, __ATOMIC_ACQUIRE) < need) {
        if (w < n) {
            const int64_t c = __atomic_fetch_add(&warmed[w], 1, __ATOMIC_RELAXED);
            if (!ops[w].warm(ops[w].args, c)) w = n;
        } else if (spins < 200) {
            spins++;
            cpu_relax();
        } else {
            sched_yield();
        }
    }
}

void gi_graph_run(const gi_op *ops, int64_t n, int nthreads, int64_t *work, int64_t *prof) {
    int64_t *claim = work, *warmed = work + n, *next_warm = work + 2 * n;
    memset(work, 0, 2 * (size_t)n * sizeof(int64_t));
#ifdef _OPENMP
    if (nthreads > 1) {
        int64_t done = 0; /* shares finished, over all ops */
        for (int64_t i = n - 1, w = n; i >= 0; i--) /* the first op at or after i with a warm */
            next_warm[i] = w = ops[i].warm ? i : w;
#pragma omp parallel num_threads(nthreads)
        {
            const int tid = omp_get_thread_num();
            int64_t before = 0; /* shares of ops[0..i) */
            for (int64_t i = 0; i < n; i++) {
                const int64_t ns = ops[i].nshares;
                if (ns <= 0) continue;
                if (ops[i].barrier) {
                    const int64_t t0 = prof ? now_ns() : 0;
                    wait_done(&done, before, ops, n, next_warm[i], warmed);
                    if (prof) __atomic_fetch_add(&prof[n + i], now_ns() - t0, __ATOMIC_RELAXED);
                }
                for (;;) {
                    const int64_t s = __atomic_fetch_add(&claim[i], 1, __ATOMIC_RELAXED);
                    if (s >= ns) break;
                    run_share(&ops[i], s, tid, prof ? &prof[i] : 0);
                    __atomic_fetch_add(&done, 1, __ATOMIC_RELEASE);
                }
                before += ns;
            }
        } /* the region's join: every claimed share has finished */
        return;
    }
#endif
    (void)nthreads;
    (void)claim;
    (void)warmed;
    (void)next_warm;
    run_serial(ops, n, prof);
}
