/* Runtime ISA dispatch (see dispatch.h).  Compiled once, without ISA flags. */
#include "dispatch.h"
#include "matmul.h"

#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

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


/* ============================================================================ GEMV prefetch distances */

/* per distance and kind: 0 when none is set (the default applies), else the distance set + 1 */
static int g_prefetch_set[2][GI_N_KINDS];
static int g_prefetch_env[2] = {-2, -2};  /* -2: the variable not read yet; -1: absent or invalid */
static const char *const PREFETCH_ENV[2] = {"GOINFER_PREFETCH", "GOINFER_PREFETCH_FAR"};
static const int PREFETCH_MAX[2] = {64, 1024};
static int g_amd_family = -1;    /* -1: not probed yet; else the AMD family (0: not AMD) */

static int amd_family(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_is("amd")) {
        unsigned a, b, c, d;
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
        return (int)(((a >> 8) & 15) + (((a >> 8) & 15) == 15 ? (a >> 20) & 255 : 0));
    }
#endif
    return 0;
}

/* amd_family(), probed once (idempotent: racing first callers get the same answer) */
static int cpu_amd_family(void) {
    int fam = __atomic_load_n(&g_amd_family, __ATOMIC_ACQUIRE);
    if (fam < 0) {
        fam = amd_family();
        __atomic_store_n(&g_amd_family, fam, __ATOMIC_RELEASE);
    }
    return fam;
}

/* The near default. AMD family 19h (Zen 3, Zen 4): 16 groups, except none for q4_k (both
   variants) and for q8_0 and mxfp4 on avx512, and 12 for q4_0 on avx2. Where the default is none,
   the hardware prefetchers alone keep the GEMV (q4_k's unrolls the 8 groups of a super-block)
   near the bandwidth and the software prefetches only cost load slots, while the others' streams
   pause while they compute. Graph-replayed cold GEMVs of a 2048 x 11008 weight, 2 threads, on a
   Zen 4 whose read bandwidth switched between about 35 and 56 GB/s (benchmarks/kernels_matmul.py
   --set gemv-kinds --prefetch-sweep; medians over the rounds in the fast phase), avx512 none ->
   16 groups: q4_0 39.8 -> 43.7 GB/s, q4_1 35.2 -> 46.6, q5_0 40.4 -> 48.1, q5_1 32.4 -> 47.8,
   q5_k 43.9 -> 44.9, q6_k 39.3 -> 46.5, against q4_k 51.5 -> 48.1, q8_0 48.6 -> 47.6 and mxfp4
   45.8 -> 45.8; avx2 8 -> 16 groups: 2-16% faster for every kind but q4_k, which read 50.1 GB/s
   with none, 45.5 with 8 and 47.8 with 16; in the slower phase the settings read alike within a
   few percent (docs/benchmarks.md, "Decode GEMV of the 4-bit kinds"). A whole model tells more
   for q4_0 on avx2: decoding after 4,096 tokens, a step's attention took longer after GEMVs 16
   groups ahead (the 3B shape's 16.0 ms per token after 8 groups, 20.2 after 16, every kernel
   timed), so that the Q4_0 shape files of 1B, 3B and 8B decoded there 1.02-1.10x as fast with 8
   groups and 1.03-1.07x with 12, while after 64 tokens 8 was 0.97-0.98x of 16 and 12 1.02x (the
   settings interleaved in one process, 40 rounds; benchmarks/decode_prefetch.py); on avx512 16
   stayed the fastest for q4_0 after 4,096 tokens (8: 0.97x, 12: 0.98x). AMD family 1Ah (Zen 5):
   16 groups (avx512) and 32 (avx2), 4 and 8 KB of q4 ahead: with 8 a Zen 5 decoded the 1B shape
   after 64 tokens at 81-85 (Q4_K_M) and 89-94 tok/s (Q4_0) on avx512 against 86-90 and 93-100
   with 16, and at 76-80 and 88-91 on avx2 against 83-90 and 92-101 with 32 (48 and 64 alike); its
   8 had taken the AVX2 GEMV from 19-31 to 26-40 GB/s against none. Elsewhere 8: an Intel Xeon of
   the Emerald Rapids class (family 6 model 207, avx512) decoded the 1B shape Q4_K_M after 64
   tokens alike with 8, 16 and 24 (medians of 5 alternating runs 26.5, 25.9 and 26.2 tok/s) and at
   21.6-23.4 with none. */
static int default_prefetch(int variant, int kind) {
    const int fam = cpu_amd_family();
    if (fam == 0x19) {
        if (kind == GI_Q4_K || (variant == GI_AVX512 && (kind == GI_Q8_0 || kind == GI_MXFP4))) return 0;
        return variant == GI_AVX2 && kind == GI_Q4_0 ? 12 : 16;
    }
    if (fam == 0x1A) return variant == GI_AVX512 ? 16 : 32;
    return 8;
}

/* The far default: prefetcht2, 128 groups (32 KB of q4, 48 of q6_k) ahead; none on AMD, where
   it was not measured.  One core of the 2-core Emerald Rapids Xeon (family 6 model 207) reads
   about 12 GB/s alone, half of what both read at once, so the GEMV reaches the bandwidth only
   if each core's stream never pauses while it computes: with the near prefetch (8 groups,
   into L1) and the hardware prefetchers, its decode matmuls read 18-21 GB/s of ~25.  With the
   far one added, the Llama-3.2-1B-shape Q4_K_M file decoded after 64 tokens at 27.3-30.2 tok/s
   on avx512 against 19.9-25.9 without it (alternating runs; 64, 256 and 512 groups:
   26.2-28.1), and at 23.7-27.3 on avx2 against 20.9-24.2; the near one still counts beside it
   (27.9-28.5 with it, 24.9-26.7 without); docs/benchmarks.md, "Decode GEMV of the 4-bit
   kinds". */
static int default_far(void) { return cpu_amd_family() ? 0 : 128; }

/* The environment variable name as a decimal integer in lo..hi (nothing else in it), else -1;
   read once: *cache holds -2 until then, the result after. */
static int env_once(int *cache, const char *name, int lo, int hi) {
    int v = __atomic_load_n(cache, __ATOMIC_ACQUIRE);
    if (v == -2) {
        const char *e = getenv(name);
        char *end = 0;
        const long x = e && *e ? strtol(e, &end, 10) : -1;
        v = (x >= lo && x <= hi && end && *end == 0) ? (int)x : -1;
        __atomic_store_n(cache, v, __ATOMIC_RELEASE);
    }
    return v;
}

int gi_gemv_prefetch_for(int which, int variant, int kind) {
    if (variant == GI_PORTABLE || (which != GI_PF_NEAR && which != GI_PF_FAR))
        return 0;  /* the portable variant's plain-C GEMV issues no prefetches */
    const int set = kind >= 0 && kind < GI_N_KINDS
                        ? __atomic_load_n(&g_prefetch_set[which][kind], __ATOMIC_ACQUIRE)
                        : 0;
    if (set > 0) return set - 1;
    const int env =
        env_once(&g_prefetch_env[which], PREFETCH_ENV[which], 0, PREFETCH_MAX[which]);
    if (env >= 0) return env;
    return which == GI_PF_NEAR ? default_prefetch(variant, kind) : default_far();
}

int gi_gemv_prefetch(int which, int kind) { return gi_gemv_prefetch_for(which, gi_variant(), kind); }

int gi_set_gemv_prefetch(int which, int kind, int groups) {
    if ((which != GI_PF_NEAR && which != GI_PF_FAR) || kind < -1 || kind >= GI_N_KINDS ||
        groups < -1 || groups > PREFETCH_MAX[which])
        return -1;
    for (int k = kind < 0 ? 0 : kind; k < (kind < 0 ? GI_N_KINDS : kind + 1); k++)
        __atomic_store_n(&g_prefetch_set[which][k], groups + 1, __ATOMIC_RELEASE);
    return 0;
}

int gi_gemv_prefetch_setting(int which, int kind) {
    if ((which != GI_PF_NEAR && which != GI_PF_FAR) || kind < 0 || kind >= GI_N_KINDS) return -1;
    return __atomic_load_n(&g_prefetch_set[which][kind], __ATOMIC_ACQUIRE) - 1;
}


/* ============================================================================ GEMV streams */

static int g_streams_set;               /* 0: none set (the default applies), else the count + 1 */
static int g_streams_env = -2;          /* -2: the variable not read yet; -1: absent or invalid */

/* The default.  AMD: 1, each thread reads its rows front to back as one sequential stream: on a
   Zen 4 that decoded 15-30% faster than two (avx2) or four (avx512) row blocks per call, as many
   streams 16 KB or more apart.  Elsewhere (Intel) 4 on both variants: a core of a 2-core
   Sapphire Rapids class Xeon (family 6 model 167) reads fastest with several misses in flight,
   which separate streams give it (docs/benchmarks.md, "GEMV streams"). */
static int default_streams(int variant) {
    (void)variant;
    return cpu_amd_family() ? 1 : 4;
}

int gi_gemv_streams_for(int variant) {
    if (variant == GI_PORTABLE) return 1;
    const int set = __atomic_load_n(&g_streams_set, __ATOMIC_ACQUIRE);
    if (set > 0) return set - 1;
    const int env = env_once(&g_streams_env, "GOINFER_GEMV_STREAMS", 1, GI_GEMV_STREAMS_MAX);
    return env >= 1 ? env : default_streams(variant);
}

int gi_gemv_streams(void) { return gi_gemv_streams_for(gi_variant()); }

int gi_set_gemv_streams(int n) {
    if (n != -1 && (n < 1 || n > GI_GEMV_STREAMS_MAX)) return -1;
    __atomic_store_n(&g_streams_set, n + 1, __ATOMIC_RELEASE);
    return 0;
}

int gi_gemv_streams_setting(void) { return __atomic_load_n(&g_streams_set, __ATOMIC_ACQUIRE) - 1; }


/* ============================================================================ GEMV warm */

static int g_warm_set;                  /* 0: none set (the default applies), else the KB + 1 */
static int g_warm_env = -2;             /* -2: the variable not read yet; -1: absent or invalid */

/* The default: 512 KB, split between the matmul's shares (a quarter of a 2 MB L2, half of a
   1 MB one).  On a Sapphire Rapids class Xeon (family 6 model 167, 2 threads) it decoded the 1B
   and 3B shapes 1.007-1.037x and SmolLM2-135M and Gemma 3 270M 1.02-1.09x as fast as none, the
   8B shape alike (docs/benchmarks.md, "GEMV warm"); 256 KB and 1 MB read alike in a first
   sweep. */
enum { DEFAULT_WARM_KB = 512 };

int gi_gemv_warm_kb(void) {
    const int set = __atomic_load_n(&g_warm_set, __ATOMIC_ACQUIRE);
    if (set > 0) return set - 1;
    const int env = env_once(&g_warm_env, "GOINFER_GEMV_WARM", 0, GI_GEMV_WARM_MAX_KB);
    return env >= 0 ? env : DEFAULT_WARM_KB;
}

int gi_set_gemv_warm_kb(int kb) {
    if (kb != -1 && (kb < 0 || kb > GI_GEMV_WARM_MAX_KB)) return -1;
    __atomic_store_n(&g_warm_set, kb + 1, __ATOMIC_RELEASE);
    return 0;
}

int gi_gemv_warm_kb_setting(void) { return __atomic_load_n(&g_warm_set, __ATOMIC_ACQUIRE) - 1; }


/* ============================================================================ AVX-VNNI (avx2 variant) */

extern const int gi_avxvnni_built;  /* matmul_impl.c's avx2vnni object: 1 if built with -mavxvnni */
static int g_avxvnni_on = -1;       /* -1: not decided yet */

int gi_avxvnni_supported(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a = 0, b = 0, c = 0, d = 0;
    return gi_avxvnni_built && gi_variant_supported(GI_AVX2) && __get_cpuid_count(7, 1, &a, &b, &c, &d) &&
           (a >> 4 & 1);
#else
    return 0;
#endif
}

int gi_avxvnni_enabled(void) {
    return gi_switch_enabled(&g_avxvnni_on, "GOINFER_AVXVNNI", gi_avxvnni_supported);
}

int gi_avxvnni_set(int on) { return gi_switch_set(&g_avxvnni_on, on, gi_avxvnni_supported); }


/* ============================================================================ optional kernel paths */

int gi_switch_enabled(int *state, const char *env, int (*supported)(void)) {
    int on = __atomic_load_n(state, __ATOMIC_ACQUIRE);
    if (on < 0) {
        const char *e = getenv(env);
        on = supported() && !(e && strcmp(e, "0") == 0);
        __atomic_store_n(state, on, __ATOMIC_RELEASE);
    }
    return on;
}

int gi_switch_set(int *state, int on, int (*supported)(void)) {
    if (on && !supported()) return -1;
    __atomic_store_n(state, on ? 1 : 0, __ATOMIC_RELEASE);
    return 0;
}
