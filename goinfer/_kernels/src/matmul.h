/* Matrix-multiply kernels: activation quantization, int (q4_0/q4_1/q8_0/mxfp4/q6_k/q4_k/q5_k/q5_0/q5_1) and float
 * (f32/f16/bf16) matmul, embedding row lookup.  See docs/design/kernels.md for the layouts
 * and the exact per-element contracts; every variant computes the same bits.
 *
 * Each entry point works on a rectangular tile of the output (activation rows [m0, m1) x
 * row blocks [rb0, rb1)) so the Cython layer can split the work across OpenMP threads
 * without two threads ever writing the same output element.
 */
#ifndef GI_MATMUL_H
#define GI_MATMUL_H
#include "gi.h"

/* Weight kinds, in the order of goinfer.quant.KINDS. */
enum { GI_Q4_0 = 0, GI_Q4_1 = 1, GI_Q8_0 = 2, GI_MXFP4 = 3, GI_Q6_K = 4, GI_Q4_K = 5, GI_Q5_K = 6,
       GI_Q5_0 = 7, GI_Q5_1 = 8, GI_F32 = 9, GI_F16 = 10, GI_BF16 = 11, GI_N_KINDS = 12 };

/* A repacked weight (a view of goinfer.quant.QWeight's arrays; nothing is owned). */
typedef struct gi_weight {
    int kind;              /* GI_Q4_0 .. GI_BF16; kind < GI_F32: an int kind */
    int64_t n_out, n_in;   /* logical shape (n_out, n_in) */
    int64_t n_rb;          /* row blocks of 16 rows: ceil(n_out / 16) */
    const void *qs;        /* q4, mxfp4: uint8 (n_rb, G, 4, 16, 4); q8: int8 (n_rb, G, 8, 16, 4);
                              q6_k: uint8 (n_rb, G, 6, 16, 4) (4 nibble lines, 2 lines of top bits);
                              q4_k: as q4; q5_k, q5_0, q5_1: uint8 (n_rb, G, 5, 16, 4) (q4's + a
                              line of bit 4);
                              float kinds: (n_rb, K, 16) float32 / float16 bits / bf16 bits */
    const uint16_t *d;     /* q4_0, q4_1, q8_0, q5_0, q5_1: float16 bits (n_rb, G, 16); q6_k: (n_rb, G/8, 16);
                              q4_k, q5_k: d, dmin (n_rb, G/8, 2, 16); else NULL */
    const uint16_t *m;     /* q4_1, q5_1: float16 bits (n_rb, G, 16); else NULL */
    const uint8_t *e;      /* mxfp4: e8m0 exponents (n_rb, G, 16), scale 2^(e-128); else NULL */
    const int8_t *sc;      /* q6_k: scales per 16 k (n_rb, G, 16, 2); else NULL */
    const uint8_t *ks;     /* q4_k, q5_k: GGUF's 12 bytes of 6-bit scales and mins per row and
                              super-block (n_rb, G/8, 12, 16); else NULL */
    const float *kdec;     /* NULL from callers.  The GEMM's own copy points it at the scales of
                              q4_k / q5_k decoded once per cache chunk: (units from kdec_u0, G, 2,
                              unit rows) float32, d*sc then -(dmin*mn) */
    int64_t kdec_u0;
    const int32_t *q6lo;   /* NULL from callers.  The q6_k GEMM's own copy (AVX-512) points it at the
                              low-half sums of its activation block, rows from q6lo_m0: (rows, G)
                              int32, each the sum of qa over k 0..15 of a group */
    int64_t q6lo_m0;
} gi_weight;

/* Quantized activation rows (a view of goinfer.quant.QAct; rows are contiguous). */
typedef struct gi_qact {
    const int8_t *qa;      /* (M, K)  int8 in [-127, 127] */
    const float *da;       /* (M, G)  scale per group */
    const int32_t *asum;   /* (M, G)  sum of the group's qa */
    const float *sa;       /* (M, G)  da * asum */
    int64_t K;
} gi_qact;

typedef struct gi_matmul_ops {
    /* x (M, K) float32, rows [m0, m1) -> qa (M, K), da/asum/sa (M, K/32).  K % 32 == 0. */
    void (*quantize_act)(const float *x, int64_t K, int64_t m0, int64_t m1,
                         int8_t *qa, float *da, int32_t *asum, float *sa);
    /* Int weights x QAct: out[m, n] for m in [m0, m1), n in [16*rb0, min(16*rb1, n_out)).
       out row stride ldo floats. */
    void (*matmul_q)(const gi_weight *w, const gi_qact *a, int64_t m0, int64_t m1,
                     int64_t rb0, int64_t rb1, float *out, int64_t ldo);
    /* Float weights x float32 x (M, K) (row stride K): same tile convention. */
    void (*matmul_f)(const gi_weight *w, const float *x, int64_t m0, int64_t m1,
                     int64_t rb0, int64_t rb1, float *out, int64_t ldo);
    /* out (T, n_in) row t for t in [t0, t1) = dequantized row ids[t] (0 <= ids[t] < n_out). */
    void (*get_rows)(const gi_weight *w, const int64_t *ids, int64_t t0, int64_t t1, float *out);
    /* Activation rows per GEMM microkernel tile (int, float): a hint for splitting M. */
    int mr_q, mr_f;
    /* The int8 peak probe: reps rounds of 12 independent dot-product instructions of the kind
       the variant's GEMM is built on (AVX-512: vpdpbusd zmm, AVX2: vpmaddubsw ymm), nothing
       else; returns the int8 operations done (2 per multiply-add; portable: 0, no probe). */
    int64_t (*int8_probe)(int64_t reps);
    /* The float32 FMA peak probe: reps rounds of 12 independent fused multiply-adds on the
       variant's float vector (AVX-512: zmm, AVX2: ymm), nothing else; returns the float
       operations done (2 per lane; portable: 0, no probe). */
    int64_t (*fma_probe)(int64_t reps);
    /* The f16 attention mix probe: as fma_probe, with a vector converted from float16 (read
       from L1) for every 4 fused multiply-adds, the mix of the fast attention's QK and AV over
       an f16 cache for a GQA group of 4 (a key or value vector converted once, used by the 4
       query heads); returns the float operations of the multiply-adds alone (portable: 0). */
    int64_t (*f16_fma_probe)(int64_t reps);
} gi_matmul_ops;

extern const gi_matmul_ops gi_matmul_ops_portable, gi_matmul_ops_avx2, gi_matmul_ops_avx512;
extern const gi_matmul_ops gi_matmul_ops_avx2vnni; /* the avx2 variant with AVX-VNNI (dispatch.h) */

#endif
