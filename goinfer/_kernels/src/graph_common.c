/* The graph executor (graph.h): one OpenMP parallel region for a whole forward step. */
#include "graph.h"
#ifdef _OPENMP
#include <omp.h>
#endif

static void run_serial(const gi_op *ops, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t s = 0; s < ops[i].nshares; s++) ops[i].run(ops[i].args, s);
}

void gi_graph_run(const gi_op *ops, int64_t n, int nthreads) {
#ifdef _OPENMP
    if (nthreads > 1) {
#pragma omp parallel num_threads(nthreads)
        {
            /* the team may be smaller than asked for: shares are striped over the real team */
            const int64_t tid = omp_get_thread_num(), nt = omp_get_num_threads();
            for (int64_t i = 0; i < n; i++) {
                if (ops[i].barrier) {
#pragma omp barrier
                }
                for (int64_t s = tid; s < ops[i].nshares; s += nt) ops[i].run(ops[i].args, s);
            }
        }
        return;
    }
#endif
    (void)nthreads;
    run_serial(ops, n);
}
