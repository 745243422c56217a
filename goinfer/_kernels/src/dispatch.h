/* Runtime ISA dispatch: which kernel variant runs.  Chosen at import from CPUID. */
#ifndef GI_DISPATCH_H
#define GI_DISPATCH_H

enum { GI_PORTABLE = 0, GI_AVX2 = 1, GI_AVX512 = 2, GI_N_VARIANTS = 3 };

int gi_variant_supported(int v);  /* 1 if this CPU (and OS) can run variant v */
int gi_best_variant(void);        /* the fastest supported variant */
int gi_variant(void);             /* the variant in use */
int gi_set_variant(int v);        /* 0 on success, -1 if unsupported */
const char *gi_variant_name(int v);

/* GEMV software prefetch distance, in groups of 32 k (0: none): read by the SIMD GEMV
   microkernels at each call.  Set from GOINFER_PREFETCH at first use, else by CPU (see
   dispatch_common.c). */
extern int gi_gemv_prefetch_groups;
int gi_gemv_prefetch(void);          /* the distance in use (decides it at first call) */
int gi_set_gemv_prefetch(int groups); /* 0 on success, -1 if groups is outside 0..64 */

#endif
