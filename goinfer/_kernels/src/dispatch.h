/* Runtime ISA dispatch: which kernel variant runs.  Chosen at import from CPUID. */
#ifndef GI_DISPATCH_H
#define GI_DISPATCH_H

enum { GI_PORTABLE = 0, GI_AVX2 = 1, GI_AVX512 = 2, GI_N_VARIANTS = 3 };

int gi_variant_supported(int v);  /* 1 if this CPU (and OS) can run variant v */
int gi_best_variant(void);        /* the fastest supported variant */
int gi_variant(void);             /* the variant in use */
int gi_set_variant(int v);        /* 0 on success, -1 if unsupported */
const char *gi_variant_name(int v);

/* GEMV software prefetch distances, in groups of 32 k (0: none), read by the SIMD GEMV
   microkernels at each call.  GI_PF_NEAR: prefetcht0 (into L1), GOINFER_PREFETCH, 0..64;
   GI_PF_FAR: prefetcht2 (the outer caches, not L1), GOINFER_PREFETCH_FAR, 0..1024.  Each is
   the distance set for the kind (gi_set_gemv_prefetch, one kind or every kind), else its
   environment variable (read once, every kind), else the default of the variant and weight
   kind (GI_Q4_0 .. of matmul.h) on this CPU (dispatch_common.c). */
enum { GI_PF_NEAR = 0, GI_PF_FAR = 1 };
int gi_gemv_prefetch_for(int which, int v, int kind); /* the distance variant v's GEMV of kind uses */
int gi_gemv_prefetch(int which, int kind);    /* ... the variant in use's */
/* kind -1: every kind; groups -1: back to the default; 0 on success, -1 if outside */
int gi_set_gemv_prefetch(int which, int kind, int groups);
int gi_gemv_prefetch_setting(int which, int kind); /* the distance set for kind, -1 if none */

/* GEMV streams: the row blocks (16 output rows each, one after the other in the weight) a
   decode GEMV call reads at once, each front to back as its own stream, 1..GI_GEMV_STREAMS_MAX.
   The count set (gi_set_gemv_streams), else GOINFER_GEMV_STREAMS (read once), else the default
   of the variant on this CPU (dispatch_common.c).  The bits do not depend on it. */
enum { GI_GEMV_STREAMS_MAX = 4 };
int gi_gemv_streams_for(int v);
int gi_gemv_streams(void);              /* ... the variant in use's */
int gi_set_gemv_streams(int n);         /* n -1: back to the default; 0 on success, -1 if outside */
int gi_gemv_streams_setting(void);      /* the count set, -1 if none */

/* GEMV warm: the KB of a decode matmul's weight (the heads of its shares' rows, split evenly
   between them) that graph replay's threads prefetch while they wait at a barrier before it
   (src/graph.h), 0..GI_GEMV_WARM_MAX_KB, 0: none.  The KB set (gi_set_gemv_warm_kb), else
   GOINFER_GEMV_WARM (read once), else the default (dispatch_common.c); every variant alike.
   The bits do not depend on it. */
enum { GI_GEMV_WARM_MAX_KB = 16384 };
int gi_gemv_warm_kb(void);
int gi_set_gemv_warm_kb(int kb);        /* kb -1: back to the default; 0 on success, -1 if outside */
int gi_gemv_warm_kb_setting(void);      /* the KB set, -1 if none */

/* The switch of an optional kernel path (AVX-VNNI, AMX): *state is -1 until first read, then
   on where supported() unless the environment variable env is "0" (read once).  Setting it on
   where unsupported returns -1 (else 0). */
int gi_switch_enabled(int *state, const char *env, int (*supported)(void));
int gi_switch_set(int *state, int on, int (*supported)(void));

/* AVX-VNNI in the avx2 variant's int matmuls: a second avx2 matmul table,
   gi_matmul_ops_avx2vnni (matmul_impl.c compiled again with -mavxvnni; the same bits).
   Supported: built with it, and the CPU has AVX2 and AVX-VNNI (CPUID.(7,1):EAX bit 4: Intel
   from Alder Lake, AMD Zen 5).  Enabled: supported, and not turned off by GOINFER_AVXVNNI=0
   in the environment (read once) or gi_avxvnni_set(0). */
int gi_avxvnni_supported(void);
int gi_avxvnni_enabled(void);
int gi_avxvnni_set(int on);           /* 0 on success, -1 when turning on where unsupported */

#endif
