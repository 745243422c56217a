/* One symbol per ISA variant naming the flags it was compiled with (a build sanity check). */
#include "gi.h"

const char *GI(gi_compiled_isa)(void) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    return "avx512f+bw+vl+dq+vnni";
#elif defined(__AVX2__) && defined(__FMA__)
    return "avx2+fma+f16c";
#else
    return "baseline";
#endif
}
