/* Grouping of routed rows by expert (see moe.h).  Compiled once, without ISA flags. */
#include "moe.h"

int gi_moe_group(const int32_t *ids, int64_t T, int k, int64_t E, int32_t *rows, int32_t *pos,
                 int64_t *offsets, int64_t *count) {
    const int64_t n = T * k;
    for (int64_t e = 0; e < E; e++) count[e] = 0;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= E) return -1;
        count[ids[i]]++;
    }
    offsets[0] = 0;
    for (int64_t e = 0; e < E; e++) {
        offsets[e + 1] = offsets[e] + count[e];
        count[e] = offsets[e]; /* next free place of expert e */
    }
    for (int64_t i = 0; i < n; i++) {
        const int64_t at = count[ids[i]]++;
        rows[at] = (int32_t)(i / k);
        pos[i] = (int32_t)at;
    }
    return 0;
}
