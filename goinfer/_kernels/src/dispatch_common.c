/* Runtime ISA dispatch (see dispatch.h).  Compiled once, without ISA flags. */
#include "dispatch.h"

static int g_variant = -1;

int gi_variant_supported(int v) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    switch (v) {
    case GI_PORTABLE: return 1;
    case GI_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
    case GI_AVX512:
        return gi_variant_supported(GI_AVX2) && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
    default: return 0;
    }
#else
    return v == GI_PORTABLE;
#endif
}

int gi_best_variant(void) {
    for (int v = GI_N_VARIANTS - 1; v > 0; v--)
        if (gi_variant_supported(v)) return v;
    return GI_PORTABLE;
}

int gi_variant(void) {
    if (g_variant < 0) g_variant = gi_best_variant();
    return g_variant;
}

int gi_set_variant(int v) {
    if (v < 0 || v >= GI_N_VARIANTS || !gi_variant_supported(v)) return -1;
    g_variant = v;
    return 0;
}

const char *gi_variant_name(int v) {
    switch (v) {
    case GI_PORTABLE: return "portable";
    case GI_AVX2: return "avx2";
    case GI_AVX512: return "avx512-vnni";
    default: return "unknown";
    }
}
