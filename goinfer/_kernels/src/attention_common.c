/* State shared by every ISA variant of the attention kernels (attention.h): phase timers. */
#include <time.h>

#include "attention.h"

int gi_attn_timing = 0;
int64_t gi_attn_phase_ns[3] = {0, 0, 0};

int64_t gi_attn_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
