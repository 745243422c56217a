/* Matrix-multiply kernels, compiled once per ISA variant (portable, avx2, avx512).
 *
 * Contracts (docs/design/kernels.md), per output element (m, n):
 *   int kinds:   acc = 0; for g in order: isum = exact int32 dot of group g (minus 8*asum for
 *                q4_0); acc = fmaf((float)isum, d[n,g]*da[m,g], acc); q4_1 also
 *                acc = fmaf(mn[n,g], sa[m,g], acc).  mxfp4: the group's int values are
 *                KV[code] (twice the e2m1 values, -12..12) and d = 2^(e-128) exactly.
 *                q6_k: isum = sum_k sc[n,k/16]*(q-32)*qa, exact int32; the fold's d is the
 *                super-block's d[n,g/8]
 *   float kinds: acc = 0; for k in order: acc = fmaf(w[n,k], x[m,k], acc)
 * Every variant performs exactly this float operation sequence (vectorized across the 16
 * rows of a row block), so the variants, the GEMV and GEMM paths, any tiling and any thread
 * split give the same bits.  Only the order of the exact integer products differs.
 *
 * Layout reminders (goinfer/quant.py):
 *   q4 qs  (n_rb, G, 4, 16, 4) uint8: line c of group g holds rows 0..15 x k = c*4+j (low
 *          nibble) and k = 16+c*4+j (high nibble)
 *   q8 qs  (n_rb, G, 8, 16, 4) int8:  line c holds rows 0..15 x k = c*4+j
 *   mxfp4  qs as q4 (4-bit codes), e (n_rb, G, 16) uint8 e8m0 exponents
 *   q6_k   qs (n_rb, G, 6, 16, 4) uint8: line c (0..3) byte (r, j): code of k = 4c+j in bits
 *          0..5, top 2 bits of the code of k = 16+4c+j in bits 6..7; line 4+p: low 4 bits of
 *          the codes of k = 16+8p+j (low nibble) and 16+8p+4+j (high); d (n_rb, G/8, 16)
 *          float16 per 256 k; sc (n_rb, G, 16, 2) int8 per 16 k
 *   d, m   (n_rb, G, 16) float16
 *   float  (n_rb, K, 16)
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "matmul.h"

#if defined(GI_VARIANT_AVX512) || defined(GI_VARIANT_AVX2)
#include <immintrin.h>
#endif
#if defined(GI_VARIANT_AVX512)
#include "matmul_amx.h"
#endif

/* ============================================================================ helpers */

/* float16 bits -> float32, exact (NaNs are quieted, like F16C's vcvtph2ps). */
GI_INLINE float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu, mant = h & 0x3FFu, bits;
    float f;
    if (e == 0x1F) {
        bits = sign | 0x7F800000u | (mant << 13) | (mant ? 0x00400000u : 0u);
    } else if (e != 0) {
        bits = sign | ((e + 112u) << 23) | (mant << 13);
    } else {
        f = (float)mant * 0x1p-24f;  /* zero or subnormal: exact */
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    memcpy(&f, &bits, 4);
    return f;
}

GI_INLINE float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* MXFP4: the value of code c is KV[c] * 2^(e-128); KV is twice the e2m1 value (exact ints). */
static const int8_t KV_MXFP4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* e8m0 exponent -> 2^(e-128) as float32, exact for every e (e < 2: a subnormal); ggml's
   GGML_E8M0_TO_FP32_HALF, so e = 255 is 2^127, not NaN. */
GI_INLINE float e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

GI_INLINE int32_t load_i32(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Scalar quantization of one value once the group's inverse scale is known:
   v*inv clamped to [-127, 127], rint (half to even).  NaN -> 0: it arises as 0*inf when
   127/amax overflows (a group of tiny values), where NumPy's reference also gives 0.
   Clamping before rounding equals rounding before clamping (the bounds are integers). */
GI_INLINE int quant_one(float v, float inv) {
    float r = v * inv;
    if (r != r) return 0;
    if (r > 127.0f) r = 127.0f;
    if (r < -127.0f) r = -127.0f;
    return (int)rintf(r);
}

/* 64-byte lines per group of an int kind; scale (and min) bytes per group and row block. */
#define LINES(kind) ((kind) == GI_Q8_0 ? 8 : (kind) == GI_Q6_K ? 6 : 4)
#define SCALE_BYTES(kind) ((kind) == GI_MXFP4 ? 16 : (kind) == GI_Q4_1 ? 64 : (kind) == GI_Q6_K ? 36 : 32)

/* q6_k: code k (0..31) of row r in a group's 6 lines lg (plain C: portable, get_rows) */
GI_INLINE int q6_code(const uint8_t *lg, int r, int k) {
    const int c = (k >> 2) & 3, j = k & 3, x = lg[c * 64 + r * 4 + j];
    if (k < 16) return x & 63;
    return (lg[(4 + (c >> 1)) * 64 + r * 4 + j] >> (4 * (c & 1)) & 15) | (x >> 6) << 4;
}

/* Columns of row block/unit starting at row n0 that exist in the output (<= 0: none). */
GI_INLINE int64_t cols_left(const gi_weight *w, int64_t n0) { return w->n_out - n0; }


/* ============================================================================ activation quantization */

#if defined(GI_VARIANT_AVX512)

static void GI(quantize_act)(const float *x, int64_t K, int64_t m0, int64_t m1,
                             int8_t *qa, float *da, int32_t *asum, float *sa) {
    const int64_t G = K / GI_GROUP;
    for (int64_t m = m0; m < m1; m++) {
        for (int64_t g = 0; g < G; g++) {
            const float *xg = x + m * K + g * GI_GROUP;        /* (32,) */
            __m512 v0 = _mm512_loadu_ps(xg), v1 = _mm512_loadu_ps(xg + 16);
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            float d = amax / 127.0f;
            float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            __m512 vi = _mm512_set1_ps(inv);
            /* as quant_one: NaN -> 0, clamp, then cvtps_epi32 rounds half to even (MXCSR) */
            __m512 r0 = _mm512_mul_ps(v0, vi), r1 = _mm512_mul_ps(v1, vi);
            r0 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r0, r0, _CMP_ORD_Q), r0);
            r1 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r1, r1, _CMP_ORD_Q), r1);
            const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
            __m512i q0 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r0, lo), hi));
            __m512i q1 = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(r1, lo), hi));
            _mm_storeu_si128((__m128i *)(qa + m * K + g * GI_GROUP), _mm512_cvtepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(qa + m * K + g * GI_GROUP + 16), _mm512_cvtepi32_epi8(q1));
            int32_t s = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            da[m * G + g] = d;
            asum[m * G + g] = s;
            sa[m * G + g] = d * (float)s;
        }
    }
}

#elif defined(GI_VARIANT_AVX2)

static void GI(quantize_act)(const float *x, int64_t K, int64_t m0, int64_t m1,
                             int8_t *qa, float *da, int32_t *asum, float *sa) {
    const int64_t G = K / GI_GROUP;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t m = m0; m < m1; m++) {
        for (int64_t g = 0; g < G; g++) {
            const float *xg = x + m * K + g * GI_GROUP;        /* (32,) */
            __m256 v[4], mx;
            for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(xg + 8 * i);
            mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                               _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            float amax = _mm_cvtss_f32(m4);
            float d = amax / 127.0f;
            float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            __m256 vi = _mm256_set1_ps(inv);
            __m256i q[4];
            for (int i = 0; i < 4; i++) {  /* as quant_one: NaN -> 0, clamp, round half to even */
                __m256 r = _mm256_mul_ps(v[i], vi);
                r = _mm256_and_ps(r, _mm256_cmp_ps(r, r, _CMP_ORD_Q));
                q[i] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
            }
            /* int32 x 32 -> int8 x 32 in order (packs interleave 128-bit lanes; perm fixes it) */
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(qa + m * K + g * GI_GROUP), _mm256_permutevar8x32_epi32(p, perm));
            __m256i s8 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
            int32_t s = _mm_cvtsi128_si32(s4);
            da[m * G + g] = d;
            asum[m * G + g] = s;
            sa[m * G + g] = d * (float)s;
        }
    }
}

#else /* portable */

static void GI(quantize_act)(const float *x, int64_t K, int64_t m0, int64_t m1,
                             int8_t *qa, float *da, int32_t *asum, float *sa) {
    const int64_t G = K / GI_GROUP;
    for (int64_t m = m0; m < m1; m++) {
        for (int64_t g = 0; g < G; g++) {
            const float *xg = x + m * K + g * GI_GROUP;        /* (32,) */
            int8_t *qg = qa + m * K + g * GI_GROUP;
            float amax = 0.0f;
            for (int k = 0; k < GI_GROUP; k++) {
                float a = fabsf(xg[k]);
                amax = a > amax ? a : amax;
            }
            float d = amax / 127.0f;
            float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            int32_t s = 0;
            for (int k = 0; k < GI_GROUP; k++) {
                int q = quant_one(xg[k], inv);
                qg[k] = (int8_t)q;
                s += q;
            }
            da[m * G + g] = d;
            asum[m * G + g] = s;
            sa[m * G + g] = d * (float)s;
        }
    }
}

#endif


/* ============================================================================ int matmul: microkernels
 *
 * A microkernel computes the full K reduction for RB "units" of output rows x MR activation
 * rows and stores the results.  A unit is 16 rows (one row block, one zmm) on AVX-512 and 8
 * rows (half a row block, one ymm) on AVX2.  Kinds, RB and MR are compile-time constants at
 * each instantiation so the accumulators live in registers.  Register arrays are declared
 * with the constant sizes MAXRB x MAXMR (sized by the RB/MR parameters they would be VLAs,
 * which GCC keeps on the stack); after full unrolling only the used elements remain, in
 * registers.
 */
#define MAXRB 4
#define MAXMR 16

#if defined(GI_VARIANT_AVX512)

#define UNIT 16          /* output rows per unit */
#define QV_RB 4          /* GEMV: units per microkernel (MR = 1) */
/* GEMM tile: 2 units x 6 activation rows, so each broadcast activation word feeds two
   vpdpbusd (12 int32 + 12 float accumulators: 24 of the 32 zmm).  Against 1 x 12 (one
   broadcast per vpdpbusd) it took the 1B / 8B prefill GEMM from ~35-68% to ~65-85% of the
   nominal VNNI peak on a Zen 5 (benchmarks/kernels_matmul.py; docs/benchmarks.md, "Sixth
   session"); 2 x 5 is about the same, 2 x 7 slower. */
#ifndef QG_RB
#define QG_RB 2          /* GEMM: units per microkernel (1 or 2) */
#endif
#ifndef QG_MR
#define QG_MR 6          /* GEMM: activation rows per microkernel */
#endif
#ifndef PF_GROUPS
#define PF_GROUPS 8      /* GEMV software prefetch distance, in groups (2 KB of q4, 4 KB of q8) */
#endif

GI_INLINE void store_unit(const gi_weight *w, float *out, int64_t ldo, int64_t m, int64_t n0, __m512 v) {
    int64_t cnt = cols_left(w, n0);
    float *o = out + m * ldo + n0;
    if (cnt >= 16) _mm512_storeu_ps(o, v);
    else if (cnt > 0) _mm512_mask_storeu_ps(o, (__mmask16)((1u << cnt) - 1u), v);
}

/* 16 e8m0 exponents -> 2^(e-128) (e8m0_half, vectorized: the same bits) */
GI_INLINE __m512 e8m0_half16(const uint8_t *p) {
    const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    const __m512i big = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i small = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(1)), small, big));
}

GI_INLINE void qtile(const int KIND, const int RB, const int MR, const gi_weight *w,
                     const gi_qact *a, int64_t m, int64_t u, float *out, int64_t ldo) {
    const int64_t K = w->n_in, G = K / GI_GROUP;
    const int NL = LINES(KIND);
    const int64_t rbs = G * NL * 64;                              /* bytes per row block */
    const uint8_t *wq = (const uint8_t *)w->qs + u * rbs;         /* (RB, G, NL, 16, 4) */
    const uint16_t *wd = KIND == GI_MXFP4 ? 0 : w->d + u * G * 16; /* (RB, G, 16) */
    const uint8_t *we = KIND == GI_MXFP4 ? w->e + u * G * 16 : 0; /* (RB, G, 16) */
    const uint16_t *wm = KIND == GI_Q4_1 ? w->m + u * G * 16 : 0; /* (RB, G, 16) */
    const int8_t *qa = a->qa + m * K;                             /* (MR, K) */
    const float *da = a->da + m * G, *sa = a->sa + m * G;         /* (MR, G) */
    const int32_t *as = a->asum + m * G;                          /* (MR, G) */
    const __m512i nib = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
    /* mxfp4: code -> KV + 12 (0..24, unsigned for vpdpbusd), corrected by -12*asum */
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24,
                                                             12, 11, 10, 9, 8, 6, 4, 0));
    __m512 acc[MAXRB][MAXMR];
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) acc[r][i] = _mm512_setzero_ps();

    for (int64_t g0 = 0; g0 < G; g0 += 16) {
        /* ---- the integer correction of 16 groups at a time: cb[i][gg] = -8*asum (q4_0),
           -128*asum (q8_0) or -12*asum (mxfp4) of row m+i, group g0+gg.  It is the initial
           value of the int32 accumulators (a load-only broadcast), so no subtraction is
           needed afterwards. */
        const int gn = (int)(G - g0 < 16 ? G - g0 : 16);
        int32_t cb[MAXMR][16];
        if (KIND != GI_Q4_1) {
            const __mmask16 gm = (__mmask16)((1u << gn) - 1u);
#pragma GCC unroll 16
            for (int i = 0; i < MR; i++) {
                __m512i v = _mm512_maskz_loadu_epi32(gm, as + i * G + g0);
                if (KIND == GI_MXFP4)
                    v = _mm512_mullo_epi32(v, _mm512_set1_epi32(-12));
                else
                    v = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(v, KIND == GI_Q4_0 ? 3 : 7));
                _mm512_storeu_si512(cb[i], v);
            }
        }
        for (int gg = 0; gg < gn; gg++) {
            const int64_t g = g0 + gg;
            /* ---- exact int32 dot products of group g: 16 rows x MR activation rows per unit */
            __m512i is[MAXRB][MAXMR];
#pragma GCC unroll 16
            for (int i = 0; i < MR; i++) {
                __m512i c0 = KIND == GI_Q4_1 ? _mm512_setzero_si512() : _mm512_set1_epi32(cb[i][gg]);
#pragma GCC unroll 16
                for (int r = 0; r < RB; r++) is[r][i] = c0;
            }
            const uint8_t *lg = wq + g * NL * 64;
            const int8_t *ag = qa + g * GI_GROUP;
            if (MR == 1 && PF_GROUPS > 0) {
                /* GEMV streams the weight from memory: prefetch PF_GROUPS groups ahead in each
                   unit's qs (and scale) stream; harmless past the end (prefetches never fault) */
#pragma GCC unroll 16
                for (int r = 0; r < RB; r++) {
#pragma GCC unroll 8
                    for (int c = 0; c < NL; c++)
                        _mm_prefetch((const char *)(lg + r * rbs + PF_GROUPS * NL * 64 + c * 64), _MM_HINT_T0);
                    if (KIND == GI_MXFP4)
                        _mm_prefetch((const char *)(we + r * G * 16 + (g + PF_GROUPS) * 16), _MM_HINT_T0);
                    else
                        _mm_prefetch((const char *)(wd + r * G * 16 + (g + PF_GROUPS) * 16), _MM_HINT_T0);
                    if (KIND == GI_Q4_1)
                        _mm_prefetch((const char *)(wm + r * G * 16 + (g + PF_GROUPS) * 16), _MM_HINT_T0);
                }
            }
            if (KIND != GI_Q8_0) {
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    __m512i lo[MAXRB], hi[MAXRB];   /* nibbles of k = c*4+j and 16+c*4+j, unpacked once */
#pragma GCC unroll 16
                    for (int r = 0; r < RB; r++) {
                        __m512i l = _mm512_loadu_si512(lg + r * rbs + c * 64);
                        lo[r] = _mm512_and_si512(l, nib);
                        hi[r] = _mm512_and_si512(_mm512_srli_epi16(l, 4), nib);
                        if (KIND == GI_MXFP4) {
                            lo[r] = _mm512_shuffle_epi8(lut, lo[r]);
                            hi[r] = _mm512_shuffle_epi8(lut, hi[r]);
                        }
                    }
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++) {
                        __m512i bl = _mm512_set1_epi32(load_i32(ag + i * K + c * 4));
                        __m512i bh = _mm512_set1_epi32(load_i32(ag + i * K + 16 + c * 4));
#pragma GCC unroll 16
                        for (int r = 0; r < RB; r++) {
                            is[r][i] = _mm512_dpbusd_epi32(is[r][i], lo[r], bl);
                            is[r][i] = _mm512_dpbusd_epi32(is[r][i], hi[r], bh);
                        }
                    }
                }
            } else {
#pragma GCC unroll 8
                for (int c = 0; c < 8; c++) {
                    __m512i q[MAXRB];               /* q + 128 as unsigned bytes */
#pragma GCC unroll 16
                    for (int r = 0; r < RB; r++)
                        q[r] = _mm512_xor_si512(_mm512_loadu_si512(lg + r * rbs + c * 64), flip);
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++) {
                        __m512i b = _mm512_set1_epi32(load_i32(ag + i * K + c * 4));
#pragma GCC unroll 16
                        for (int r = 0; r < RB; r++) is[r][i] = _mm512_dpbusd_epi32(is[r][i], q[r], b);
                    }
                }
            }
            /* ---- fold into the float accumulators: the contract's fmaf sequence */
            __m512 dv[MAXRB], mv[MAXRB];
#pragma GCC unroll 16
            for (int r = 0; r < RB; r++) {
                dv[r] = KIND == GI_MXFP4 ? e8m0_half16(we + r * G * 16 + g * 16)
                                         : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wd + r * G * 16 + g * 16)));
                if (KIND == GI_Q4_1)
                    mv[r] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wm + r * G * 16 + g * 16)));
            }
#pragma GCC unroll 16
            for (int i = 0; i < MR; i++) {
                __m512 dai = _mm512_set1_ps(da[i * G + g]);
#pragma GCC unroll 16
                for (int r = 0; r < RB; r++) {
                    acc[r][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[r][i]), _mm512_mul_ps(dv[r], dai), acc[r][i]);
                    if (KIND == GI_Q4_1)
                        acc[r][i] = _mm512_fmadd_ps(mv[r], _mm512_set1_ps(sa[i * G + g]), acc[r][i]);
                }
            }
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) store_unit(w, out, ldo, m + i, (u + r) * UNIT, acc[r][i]);
}

#elif defined(GI_VARIANT_AVX2)

#define UNIT 8           /* output rows per unit: half a row block */
#define QV_RB 4
#define QG_RB 1
#ifndef QG_MR
#define QG_MR 4
#endif
#ifndef PF_GROUPS
#define PF_GROUPS 8      /* GEMV software prefetch distance, in groups (as AVX-512's) */
#endif

GI_INLINE void store_unit(const gi_weight *w, float *out, int64_t ldo, int64_t m, int64_t n0, __m256 v) {
    int64_t cnt = cols_left(w, n0);
    float *o = out + m * ldo + n0;
    if (cnt >= 8) {
        _mm256_storeu_ps(o, v);
    } else if (cnt > 0) {
        __m256i msk = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)cnt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(o, msk, v);
    }
}

/* 8 e8m0 exponents -> 2^(e-128) (e8m0_half, vectorized: the same bits) */
GI_INLINE __m256 e8m0_half8(const uint8_t *p) {
    const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
    const __m256i big = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i small = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(small, big, _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1))));
}

/* q6_k: the -32 offset's activation sums of a group, packed for vpmaddwd against the scales
   (x 32): low int16 = -sum(qa[0..15]), high int16 = -sum(qa[16..31]) (each |sum| <= 2032). */
GI_INLINE int32_t q6_negsums(const int8_t *ag, int32_t asum) {
    const __m128i v = _mm_xor_si128(_mm_loadu_si128((const __m128i *)ag), _mm_set1_epi8((char)0x80));
    const __m128i s = _mm_sad_epu8(v, _mm_setzero_si128());         /* sums of qa + 128 per 8 bytes */
    const int32_t lo = _mm_cvtsi128_si32(s) + _mm_extract_epi16(s, 4) - 16 * 128, hi = asum - lo;
    return (int32_t)(((uint32_t)(uint16_t)(-hi) << 16) | (uint16_t)(-lo));
}

/* q6_k, one group, RB units x MR activation rows: is = exact int32 sum_k sc*(q-32)*qa.
   Codes 0..63 (unsigned) x int8 activations by vpmaddubsw: a pair is at most 2*63*127 =
   16002, so two lines (the same sub-block of 16) add in int16 (<= 32004); vpmaddwd against
   the rows' sub-block scales (each in the 2 int16 lanes of its row) widens and scales them at
   once.  The offset: vpmaddwd of 32*sc (both sub-blocks of a row in its 2 lanes) with the
   broadcast pair (-sum qa[0..15], -sum qa[16..31]) gives -32*(sc0*lo + sc1*hi) per row. */
GI_INLINE void q6_group(const int RB, const int MR, const uint8_t *const *wq, const int8_t *const *ws, int64_t g,
                        const int8_t *ag, int64_t K, const int32_t *asg, int64_t G, __m256i is[MAXRB][MAXMR]) {
    const __m256i nib = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30), m3f = _mm256_set1_epi8(0x3F);
    const __m256i plo = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13));
    const __m256i phi = _mm256_broadcastsi128_si256(_mm_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15));
    __m256i slo[MAXRB], shi[MAXRB], t0[MAXRB], t1[MAXRB], pl[MAXRB][MAXMR], ph[MAXRB][MAXMR];
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) {
        const __m256i ns = _mm256_set1_epi32(q6_negsums(ag + i * K, asg[i * G]));
#pragma GCC unroll 16
        for (int r = 0; r < RB; r++) {
            const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(ws[r] + g * 32)));
            if (i == 0) {
                slo[r] = _mm256_shuffle_epi8(v, plo);
                shi[r] = _mm256_shuffle_epi8(v, phi);
            }
            is[r][i] = _mm256_madd_epi16(_mm256_slli_epi16(v, 5), ns);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++) {
        t0[r] = _mm256_loadu_si256((const __m256i *)(wq[r] + (g * 6 + 4) * 64));
        t1[r] = _mm256_loadu_si256((const __m256i *)(wq[r] + (g * 6 + 5) * 64));
    }
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        __m256i lo[MAXRB], hi[MAXRB];
#pragma GCC unroll 16
        for (int r = 0; r < RB; r++) {
            /* k = 4c+j: bits 0..5 of line c; k = 16+4c+j: a nibble of line 4 + c/2, and bits 6..7
               of line c to bits 4..5 (epi16 shifts: the masks drop what crosses bytes) */
            const __m256i x = _mm256_loadu_si256((const __m256i *)(wq[r] + (g * 6 + c) * 64));
            const __m256i y = c < 2 ? t0[r] : t1[r];
            lo[r] = _mm256_and_si256(x, m3f);
            hi[r] = _mm256_or_si256(_mm256_and_si256(c & 1 ? _mm256_srli_epi16(y, 4) : y, nib),
                                    _mm256_and_si256(_mm256_srli_epi16(x, 2), m30));
        }
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            const __m256i bl = _mm256_set1_epi32(load_i32(ag + i * K + c * 4));
            const __m256i bh = _mm256_set1_epi32(load_i32(ag + i * K + 16 + c * 4));
#pragma GCC unroll 16
            for (int r = 0; r < RB; r++) {
                const __m256i xl = _mm256_maddubs_epi16(lo[r], bl), xh = _mm256_maddubs_epi16(hi[r], bh);
                if (c & 1) {
                    is[r][i] = _mm256_add_epi32(is[r][i], _mm256_madd_epi16(_mm256_add_epi16(pl[r][i], xl), slo[r]));
                    is[r][i] = _mm256_add_epi32(is[r][i], _mm256_madd_epi16(_mm256_add_epi16(ph[r][i], xh), shi[r]));
                } else {
                    pl[r][i] = xl;
                    ph[r][i] = xh;
                }
            }
        }
    }
}

/* Unit u is half (u & 1) of row block u >> 1: bytes [32*h, 32*h+32) of each 64-byte line
   (rows 8h..8h+7), and d[.., 8h..8h+7]. */
GI_INLINE void qtile(const int KIND, const int RB, const int MR, const gi_weight *w,
                     const gi_qact *a, int64_t m, int64_t u, float *out, int64_t ldo) {
    const int64_t K = w->n_in, G = K / GI_GROUP;
    const int NL = LINES(KIND);
    const int64_t rbs = G * NL * 64;                      /* bytes per row block */
    const uint8_t *wq[MAXRB];                                /* (G, NL, [8 rows x 4]) per unit */
    const uint16_t *wd[MAXRB], *wm[MAXRB];                      /* (G, [8]) per unit */
    const uint8_t *we[MAXRB];                                   /* mxfp4: (G, [8]) per unit */
    const int8_t *ws[MAXRB];                                    /* q6_k: (G, [8 rows x 2]) per unit */
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++) {
        int64_t rb = (u + r) >> 1, h = (u + r) & 1;
        wq[r] = (const uint8_t *)w->qs + rb * rbs + h * 32;
        wd[r] = KIND == GI_MXFP4 ? 0 : KIND == GI_Q6_K ? w->d + rb * (G / 8) * 16 + h * 8 : w->d + rb * G * 16 + h * 8;
        ws[r] = KIND == GI_Q6_K ? w->sc + rb * G * 32 + h * 16 : 0;
        wm[r] = KIND == GI_Q4_1 ? w->m + rb * G * 16 + h * 8 : 0;
        we[r] = KIND == GI_MXFP4 ? w->e + rb * G * 16 + h * 8 : 0;
    }
    const int8_t *qa = a->qa + m * K;                     /* (MR, K) */
    const float *da = a->da + m * G, *sa = a->sa + m * G; /* (MR, G) */
    const int32_t *as = a->asum + m * G;
    const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    /* mxfp4: code -> KV + 12 (unsigned), corrected by -12*asum */
    const __m256i lutu = _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24,
                                                                   12, 11, 10, 9, 8, 6, 4, 0));
    __m256 acc[MAXRB][MAXMR];
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) acc[r][i] = _mm256_setzero_ps();

    for (int64_t g0 = 0; g0 < G; g0 += 16) {
        /* q4_0's integer correction 8*asum of 16 groups at a time, kept in memory so that
           the broadcasts below are plain loads */
        const int gn = (int)(G - g0 < 16 ? G - g0 : 16);
        int32_t cb[MAXMR][16];
        if (KIND == GI_Q4_0 || KIND == GI_MXFP4)
#pragma GCC unroll 16
            for (int i = 0; i < MR; i++)
                for (int gg = 0; gg < gn; gg++) cb[i][gg] = as[i * G + g0 + gg] * (KIND == GI_Q4_0 ? 8 : 12);
        for (int gg = 0; gg < gn; gg++) {
            const int64_t g = g0 + gg;
            __m256i is[MAXRB][MAXMR];
            const int8_t *ag = qa + g * GI_GROUP;
            if (MR == 1 && PF_GROUPS > 0) {
                /* GEMV streams the weight from memory: prefetch PF_GROUPS groups ahead.  Units
                   2j and 2j+1 read the two halves of the same lines (GEMV calls start at an even
                   unit), so the even ones prefetch for both; harmless past the end. */
#pragma GCC unroll 16
                for (int r = 0; r < RB; r += 2) {
                    const int64_t gp = g + PF_GROUPS;
#pragma GCC unroll 8
                    for (int c = 0; c < NL; c++) _mm_prefetch((const char *)(wq[r] + (gp * NL + c) * 64), _MM_HINT_T0);
                    if (KIND == GI_MXFP4) _mm_prefetch((const char *)(we[r] + gp * 16), _MM_HINT_T0);
                    else if (KIND == GI_Q6_K) _mm_prefetch((const char *)(ws[r] + gp * 32), _MM_HINT_T0);
                    else _mm_prefetch((const char *)(wd[r] + gp * 16), _MM_HINT_T0);
                    if (KIND == GI_Q4_1) _mm_prefetch((const char *)(wm[r] + gp * 16), _MM_HINT_T0);
                }
            }
            if (KIND == GI_Q6_K) {
                q6_group(RB, MR, wq, ws, g, ag, K, as + g, G, is);
            } else if (KIND == GI_MXFP4) {
                /* codes looked up as KV + 12 (0..24, unsigned) against int8 activations, the
                   -12*asum correction below.  An int16 lane of one maddubs sums 2 products
                   <= 24*127 (no saturation); the low and the high nibbles accumulate apart over
                   the 4 lines (each <= 4*6096 = 24384: no wrap) and meet in int32. */
                __m256i sl[MAXRB][MAXMR], sh[MAXRB][MAXMR];
#pragma GCC unroll 16
                for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++) sl[r][i] = sh[r][i] = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    __m256i lo[MAXRB], hi[MAXRB];
#pragma GCC unroll 16
                    for (int r = 0; r < RB; r++) {
                        __m256i l = _mm256_loadu_si256((const __m256i *)(wq[r] + (g * 4 + c) * 64));
                        lo[r] = _mm256_shuffle_epi8(lutu, _mm256_and_si256(l, nib));
                        hi[r] = _mm256_shuffle_epi8(lutu, _mm256_and_si256(_mm256_srli_epi16(l, 4), nib));
                    }
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++) {
                        __m256i bl = _mm256_set1_epi32(load_i32(ag + i * K + c * 4));
                        __m256i bh = _mm256_set1_epi32(load_i32(ag + i * K + 16 + c * 4));
#pragma GCC unroll 16
                        for (int r = 0; r < RB; r++) {
                            sl[r][i] = _mm256_add_epi16(sl[r][i], _mm256_maddubs_epi16(lo[r], bl));
                            sh[r][i] = _mm256_add_epi16(sh[r][i], _mm256_maddubs_epi16(hi[r], bh));
                        }
                    }
                }
#pragma GCC unroll 16
                for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++)
                        is[r][i] = _mm256_add_epi32(_mm256_madd_epi16(sl[r][i], ones), _mm256_madd_epi16(sh[r][i], ones));
            } else if (KIND != GI_Q8_0) {
                /* int16 partial sums: each lane sums 16 products |nib*qa| <= 15*128, so <= 30720:
                   no saturation in maddubs, no wrap in add_epi16 */
                __m256i s16[MAXRB][MAXMR];
#pragma GCC unroll 16
                for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++) s16[r][i] = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    __m256i lo[MAXRB], hi[MAXRB];
#pragma GCC unroll 16
                    for (int r = 0; r < RB; r++) {
                        __m256i l = _mm256_loadu_si256((const __m256i *)(wq[r] + (g * 4 + c) * 64));
                        lo[r] = _mm256_and_si256(l, nib);
                        hi[r] = _mm256_and_si256(_mm256_srli_epi16(l, 4), nib);
                    }
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++) {
                        __m256i bl = _mm256_set1_epi32(load_i32(ag + i * K + c * 4));
                        __m256i bh = _mm256_set1_epi32(load_i32(ag + i * K + 16 + c * 4));
#pragma GCC unroll 16
                        for (int r = 0; r < RB; r++) {
                            s16[r][i] = _mm256_add_epi16(s16[r][i], _mm256_maddubs_epi16(lo[r], bl));
                            s16[r][i] = _mm256_add_epi16(s16[r][i], _mm256_maddubs_epi16(hi[r], bh));
                        }
                    }
                }
#pragma GCC unroll 16
                for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++) is[r][i] = _mm256_madd_epi16(s16[r][i], ones);
            } else {
                /* sign trick: |q| (unsigned) x (qa * sign(q)); a 16-bit lane <= 2*128*127 */
#pragma GCC unroll 16
                for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++) is[r][i] = _mm256_setzero_si256();
#pragma GCC unroll 8
                for (int c = 0; c < 8; c++) {
                    __m256i q[MAXRB], aq[MAXRB];
#pragma GCC unroll 16
                    for (int r = 0; r < RB; r++) {
                        q[r] = _mm256_loadu_si256((const __m256i *)(wq[r] + (g * 8 + c) * 64));
                        aq[r] = _mm256_abs_epi8(q[r]);
                    }
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++) {
                        __m256i b = _mm256_set1_epi32(load_i32(ag + i * K + c * 4));
#pragma GCC unroll 16
                        for (int r = 0; r < RB; r++) {
                            __m256i p = _mm256_maddubs_epi16(aq[r], _mm256_sign_epi8(b, q[r]));
                            is[r][i] = _mm256_add_epi32(is[r][i], _mm256_madd_epi16(p, ones));
                        }
                    }
                }
            }
            __m256 dv[MAXRB], mv[MAXRB];
#pragma GCC unroll 16
            for (int r = 0; r < RB; r++) {
                dv[r] = KIND == GI_MXFP4 ? e8m0_half8(we[r] + g * 16)
                        : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wd[r] + (KIND == GI_Q6_K ? g >> 3 : g) * 16)));
                if (KIND == GI_Q4_1) mv[r] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wm[r] + g * 16)));
            }
#pragma GCC unroll 16
            for (int i = 0; i < MR; i++) {
                __m256 dai = _mm256_set1_ps(da[i * G + g]);
                __m256i corr = _mm256_setzero_si256();
                if (KIND == GI_Q4_0 || KIND == GI_MXFP4) corr = _mm256_set1_epi32(cb[i][gg]);   /* load-only broadcast */
#pragma GCC unroll 16
                for (int r = 0; r < RB; r++) {
                    __m256i s = KIND == GI_Q4_0 || KIND == GI_MXFP4 ? _mm256_sub_epi32(is[r][i], corr) : is[r][i];
                    acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dv[r], dai), acc[r][i]);
                    if (KIND == GI_Q4_1)
                        acc[r][i] = _mm256_fmadd_ps(mv[r], _mm256_set1_ps(sa[i * G + g]), acc[r][i]);
                }
            }
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) store_unit(w, out, ldo, m + i, (u + r) * UNIT, acc[r][i]);
}

/* ---------------------------------------------------------------- AVX2 GEMM microkernel
 *
 * q4_0 / q4_1 / q8_0 prefill (qgemm2, driven by gemm2 below): one row block (16 output rows,
 * two ymm halves) x MR activation rows over one block of groups [g0, g1).  The operands are
 * prepared once and reused:
 *   - the activation rows of a tile are packed into a panel, group by group (pack_panel: the
 *     MR rows' 32 qa bytes, then their 8*asum, da and sa), read by every row block of a chunk,
 *     so the kernel walks one pointer with constant offsets;
 *   - with at least UNP_MIN_TILES activation tiles, q4 weights are unpacked once per chunk and
 *     K block (unpack_q4: one nibble per byte), read by every tile, so the kernel does no
 *     unpacking (fewer tiles unpack in registers, UNP = 0; q8_0 is read as it is).
 * The int16 pair sums of the 2 x MR output vectors stay in registers for one group; the float
 * accumulators live in a small buffer in L1 (one load + fma + store per output vector and
 * group), so the 16 ymm registers go to the integer work: each weight vector is multiplied by
 * MR broadcast activations, each broadcast by 2 weight vectors.  Per 8 outputs and group: 8
 * vpmaddubsw + 8 vpaddw (q4) or 8 x (sign, maddubs, madd, add) (q8), then the contract's fold:
 * madd (int16 pairs -> int32), [q4_0: - 8*asum], cvt, d*da, fma [q4_1: fma(mn, sa)], the same
 * float sequence as qtile's in group order, so the bits are the same (GEMM == GEMV, any
 * tiling, any K blocking: a K block continues the accumulators the previous one stored).
 *
 * Bounds (vpmaddubsw saturates an int16 pair sum, vpaddw wraps): q4: a pair is at most
 * 2*15*127 = 3810 and a lane sums 8 pairs (k and k+16 of 4 lines), <= 30480 < 32767;
 * q8 (sign trick |q| x qa*sign(q)): a pair is at most 2*128*127 = 32512, widened at once.
 */
#ifndef QG2_MR
#define QG2_MR 4         /* AVX2 GEMM: activation rows per microkernel */
#endif
#ifndef KB_GROUPS
#define KB_GROUPS 64     /* AVX2 GEMM: groups per K block (panel 12 KB, unpacked row block 32 KB) */
#endif
/* An empty asm that "modifies" v: the value must exist in a register here, so the compiler
   keeps the accumulation order written (no reassociation into trees of temporaries, which
   spill with 16 registers).  No instruction is emitted. */
#define PIN(v) __asm__("" : "+x"(v))

/* Panel bytes per group for mr rows: qa (mr, 32) int8, cb (mr,) int32 (q4_0: 8*asum; q6_k:
   q6_negsums), da (mr,), sa (mr,) f32 */
#define PANEL_STRIDE(mr) ((mr) * 48)

/* Rows [m, m+mr), groups [g0, g1) of the activation -> panel ((g1-g0) x PANEL_STRIDE(mr) bytes). */
static void pack_panel(const gi_qact *a, int kind, int64_t m, int mr, int64_t g0, int64_t g1, uint8_t *panel) {
    const int64_t K = a->K, G = K / GI_GROUP;
    for (int i = 0; i < mr; i++) {
        const int8_t *qa = a->qa + (m + i) * K;
        const int32_t *as = a->asum + (m + i) * G;
        const float *da = a->da + (m + i) * G, *sa = a->sa + (m + i) * G;
        for (int64_t g = g0; g < g1; g++) {
            uint8_t *p = panel + (g - g0) * PANEL_STRIDE(mr);
            _mm256_storeu_si256((__m256i *)(p + i * 32), _mm256_loadu_si256((const __m256i *)(qa + g * GI_GROUP)));
            int32_t cb = kind == GI_Q6_K ? q6_negsums(qa + g * GI_GROUP, as[g]) : 8 * as[g];
            memcpy(p + mr * 32 + i * 4, &cb, 4);
            memcpy(p + mr * 36 + i * 4, da + g, 4);
            memcpy(p + mr * 40 + i * 4, sa + g, 4);
        }
    }
}

/* A q4 row block unpacked by unpack_q4: per group and line c, 64 bytes of low nibbles (16 rows
   x 4 k) then 64 bytes of high nibbles, one per byte: (groups, 4, 2, 16, 4). */
#define UNP_GROUP_BYTES 512

/* Row blocks [rb0, rb1), groups [g0, g1) of a q4 weight -> dst, row block after row block. */
static void unpack_q4(const gi_weight *w, int64_t rb0, int64_t rb1, int64_t g0, int64_t g1, uint8_t *dst) {
    const int64_t G = w->n_in / GI_GROUP;
    const __m256i nib = _mm256_set1_epi8(0x0F);
    for (int64_t rb = rb0; rb < rb1; rb++) {
        const uint8_t *src = (const uint8_t *)w->qs + (rb * G + g0) * 256;
        for (int64_t j = 0; j < (g1 - g0) * 4; j++, dst += 128) {          /* 64-byte lines */
            for (int h = 0; h < 2; h++) {
                __m256i l = _mm256_loadu_si256((const __m256i *)(src + j * 64 + h * 32));
                _mm256_store_si256((__m256i *)(dst + h * 32), _mm256_and_si256(l, nib));
                _mm256_store_si256((__m256i *)(dst + 64 + h * 32), _mm256_and_si256(_mm256_srli_epi16(l, 4), nib));
            }
        }
    }
}

/* q6_k lines c of group g (64 bytes at x, the 2 nibble lines at y) -> codes of k = 4c+j
   (lo) and k = 16+4c+j (hi), one per byte, for the 32 bytes at offset h*32 (rows 8h..8h+7). */
GI_INLINE void q6_unpack_line(const uint8_t *lg, int c, int h, __m256i *lo, __m256i *hi) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)(lg + c * 64 + h * 32));
    const __m256i y = _mm256_loadu_si256((const __m256i *)(lg + (4 + (c >> 1)) * 64 + h * 32));
    *lo = _mm256_and_si256(x, _mm256_set1_epi8(0x3F));
    *hi = _mm256_or_si256(_mm256_and_si256(c & 1 ? _mm256_srli_epi16(y, 4) : y, _mm256_set1_epi8(0x0F)),
                          _mm256_and_si256(_mm256_srli_epi16(x, 2), _mm256_set1_epi8(0x30)));
}

/* Row blocks [rb0, rb1), groups [g0, g1) of a q6_k weight -> dst as unpack_q4 lays q4 out
   (codes 0..63 one per byte: per group and line c, 64 bytes of k = 4c+j, then 64 of 16+4c+j). */
static void unpack_q6(const gi_weight *w, int64_t rb0, int64_t rb1, int64_t g0, int64_t g1, uint8_t *dst) {
    const int64_t G = w->n_in / GI_GROUP;
    for (int64_t rb = rb0; rb < rb1; rb++) {
        const uint8_t *src = (const uint8_t *)w->qs + (rb * G + g0) * 384;
        for (int64_t g = 0; g < g1 - g0; g++)
            for (int c = 0; c < 4; c++, dst += 128)
                for (int h = 0; h < 2; h++) {
                    __m256i lo, hi;
                    q6_unpack_line(src + g * 384, c, h, &lo, &hi);
                    _mm256_store_si256((__m256i *)(dst + h * 32), lo);
                    _mm256_store_si256((__m256i *)(dst + 64 + h * 32), hi);
                }
    }
}

/* The 8 outputs (m, n0 .. n0+7) stored so far (0 beyond n_out), as store_unit wrote them. */
GI_INLINE __m256 load_unit(const gi_weight *w, const float *out, int64_t ldo, int64_t m, int64_t n0) {
    int64_t cnt = cols_left(w, n0);
    const float *o = out + m * ldo + n0;
    if (cnt >= 8) return _mm256_loadu_ps(o);
    if (cnt <= 0) return _mm256_setzero_ps();
    __m256i msk = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)cnt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_maskload_ps(o, msk);
}

/* Row block rb x activation rows [m, m+MR), groups [g0, g1): panel (and uq, UNP) hold exactly
   those groups.  The accumulators start at 0 (g0 == 0), else at what out holds.  UNP = 0: q4
   nibbles are unpacked in registers from the weight itself (a single activation tile, where
   unpacking into uq first would not be reused). */
GI_INLINE void qgemm2(const int KIND, const int MR, const int UNP, const gi_weight *w, const uint8_t *uq,
                      const uint8_t *panel, int64_t m, int64_t rb, int64_t g0, int64_t g1, float *out, int64_t ldo) {
    const int64_t G = w->n_in / GI_GROUP;
    const int NL = LINES(KIND);
    const uint8_t *wq = (const uint8_t *)w->qs + (rb * G + g0) * NL * 64;     /* (groups, NL, 16, 4) */
    const uint16_t *wd = KIND == GI_Q6_K ? w->d + (rb * (G / 8) + g0 / 8) * 16   /* q6_k: (groups/8, 16) */
                                         : w->d + (rb * G + g0) * 16;            /* (groups, 16) */
    const uint16_t *wm = KIND == GI_Q4_1 ? w->m + (rb * G + g0) * 16 : 0;
    const __m256i ones = _mm256_set1_epi16(1);
    float accm[2][MAXMR][8] __attribute__((aligned(32)));                     /* (2, MR, 8) */
#pragma GCC unroll 2
    for (int r = 0; r < 2; r++)
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++)
            _mm256_store_ps(accm[r][i], g0 == 0 ? _mm256_setzero_ps() : load_unit(w, out, ldo, m + i, rb * 16 + r * 8));

    for (int64_t g = 0; g < g1 - g0; g++) {
        const uint8_t *pg = panel + g * PANEL_STRIDE(MR);
        const int8_t *ag = (const int8_t *)pg;                                /* (MR, 32) */
        const int32_t *cb = (const int32_t *)(pg + MR * 32);
        const float *da = (const float *)(pg + MR * 36), *sa = (const float *)(pg + MR * 40);
        __m256i s[2][MAXMR];                     /* q4: int16 pair sums; q8, q6_k: int32 sums */
        if (KIND == GI_Q6_K) {
            /* as q6_group: the codes (unpacked, or unpacked here) x qa by vpmaddubsw, two lines
               of one sub-block added in int16, vpmaddwd by the rows' sub-block scales; the sums
               start at the -32 offset's correction (cb: the panel's q6_negsums) */
            const uint8_t *ug = uq + g * UNP_GROUP_BYTES, *lg = wq + g * NL * 64;
            const int8_t *sg = w->sc + (rb * G + g0 + g) * 32;                /* (16, 2) */
            const __m256i plo = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13));
            const __m256i phi = _mm256_broadcastsi128_si256(_mm_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15));
            __m256i sv[2][2];                                                   /* [half][lo/hi sub-block] */
#pragma GCC unroll 2
            for (int r = 0; r < 2; r++) {
                const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(sg + r * 16)));
                sv[r][0] = _mm256_shuffle_epi8(v, plo);
                sv[r][1] = _mm256_shuffle_epi8(v, phi);
                const __m256i v32 = _mm256_slli_epi16(v, 5);
#pragma GCC unroll 16
                for (int i = 0; i < MR; i++) s[r][i] = _mm256_madd_epi16(v32, _mm256_set1_epi32(cb[i]));
            }
#pragma GCC unroll 2
            for (int hi = 0; hi < 2; hi++) {
#pragma GCC unroll 2
                for (int cp = 0; cp < 2; cp++) {                 /* lines c = 2cp, 2cp+1: one sub-block's int16 sums */
                    __m256i we[2], wo[2];                           /* [half] of lines 2cp, 2cp+1 */
                    if (UNP) {
#pragma GCC unroll 2
                        for (int r = 0; r < 2; r++) {
                            we[r] = _mm256_load_si256((const __m256i *)(ug + (2 * cp) * 128 + hi * 64 + r * 32));
                            wo[r] = _mm256_load_si256((const __m256i *)(ug + (2 * cp + 1) * 128 + hi * 64 + r * 32));
                        }
                    } else {
#pragma GCC unroll 2
                        for (int r = 0; r < 2; r++) {
                            __m256i l0, h0, l1, h1;
                            q6_unpack_line(lg, 2 * cp, r, &l0, &h0);
                            q6_unpack_line(lg, 2 * cp + 1, r, &l1, &h1);
                            we[r] = hi ? h0 : l0;
                            wo[r] = hi ? h1 : l1;
                        }
                    }
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++) {
                        const __m256i be = _mm256_set1_epi32(load_i32(ag + i * 32 + hi * 16 + 8 * cp));
                        const __m256i bo = _mm256_set1_epi32(load_i32(ag + i * 32 + hi * 16 + 8 * cp + 4));
#pragma GCC unroll 2
                        for (int r = 0; r < 2; r++) {
                            const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(we[r], be), _mm256_maddubs_epi16(wo[r], bo));
                            s[r][i] = _mm256_add_epi32(s[r][i], _mm256_madd_epi16(p, sv[r][hi]));
                            PIN(s[r][i]);
                        }
                    }
                }
            }
        } else if (KIND != GI_Q8_0) {
            const uint8_t *ug = uq + g * UNP_GROUP_BYTES, *lg = wq + g * NL * 64;
            const __m256i nib = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
#pragma GCC unroll 2
                for (int hi = 0; hi < 2; hi++) {              /* low nibbles: k = c*4+j; high: 16+c*4+j */
                    __m256i v0, v1;
                    if (UNP) {
                        v0 = _mm256_load_si256((const __m256i *)(ug + c * 128 + hi * 64));
                        v1 = _mm256_load_si256((const __m256i *)(ug + c * 128 + hi * 64 + 32));
                    } else {
                        v0 = _mm256_loadu_si256((const __m256i *)(lg + c * 64));
                        v1 = _mm256_loadu_si256((const __m256i *)(lg + c * 64 + 32));
                        if (hi) {
                            v0 = _mm256_srli_epi16(v0, 4);
                            v1 = _mm256_srli_epi16(v1, 4);
                        }
                        v0 = _mm256_and_si256(v0, nib);
                        v1 = _mm256_and_si256(v1, nib);
                    }
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++) {
                        const __m256i b = _mm256_set1_epi32(load_i32(ag + i * 32 + hi * 16 + c * 4));
                        const __m256i p0 = _mm256_maddubs_epi16(v0, b), p1 = _mm256_maddubs_epi16(v1, b);
                        s[0][i] = c + hi == 0 ? p0 : _mm256_add_epi16(s[0][i], p0);
                        s[1][i] = c + hi == 0 ? p1 : _mm256_add_epi16(s[1][i], p1);
                        PIN(s[0][i]);
                        PIN(s[1][i]);
                    }
                }
            }
#pragma GCC unroll 2
            for (int r = 0; r < 2; r++)
#pragma GCC unroll 16
                for (int i = 0; i < MR; i++) s[r][i] = _mm256_madd_epi16(s[r][i], ones);
        } else {
            const uint8_t *lg = wq + g * NL * 64;
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                __m256i q[2], aq[2];
#pragma GCC unroll 2
                for (int r = 0; r < 2; r++) {
                    q[r] = _mm256_loadu_si256((const __m256i *)(lg + c * 64 + r * 32));
                    aq[r] = _mm256_abs_epi8(q[r]);
                }
#pragma GCC unroll 16
                for (int i = 0; i < MR; i++) {
                    const __m256i b = _mm256_set1_epi32(load_i32(ag + i * 32 + c * 4));
#pragma GCC unroll 2
                    for (int r = 0; r < 2; r++) {
                        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aq[r], _mm256_sign_epi8(b, q[r])), ones);
                        s[r][i] = c == 0 ? p : _mm256_add_epi32(s[r][i], p);
                        PIN(s[r][i]);
                    }
                }
            }
        }
        /* ---- fold: the contract's fmaf sequence */
#pragma GCC unroll 2
        for (int r = 0; r < 2; r++) {
            const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128(
                (const __m128i *)(wd + (KIND == GI_Q6_K ? ((g0 + g) >> 3) - (g0 >> 3) : g) * 16 + r * 8)));
            __m256 mv = _mm256_setzero_ps();
            if (KIND == GI_Q4_1) mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wm + g * 16 + r * 8)));
#pragma GCC unroll 16
            for (int i = 0; i < MR; i++) {
                __m256i t = s[r][i];
                if (KIND == GI_Q4_0) t = _mm256_sub_epi32(t, _mm256_set1_epi32(cb[i]));
                __m256 acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(dv, _mm256_set1_ps(da[i])),
                                             _mm256_load_ps(accm[r][i]));
                if (KIND == GI_Q4_1) acc = _mm256_fmadd_ps(mv, _mm256_set1_ps(sa[i]), acc);
                _mm256_store_ps(accm[r][i], acc);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < 2; r++)
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) store_unit(w, out, ldo, m + i, rb * 16 + r * 8, _mm256_load_ps(accm[r][i]));
}

#endif


/* ============================================================================ float matmul: microkernels */

#if defined(GI_VARIANT_AVX512)

#define FV_RB 4
#define FG_RB 2
#define FG_MR 12

/* 16 weights (one k, 16 rows) of a float kind -> float32 */
GI_INLINE __m512 fload(const int KIND, const void *p) {
    if (KIND == GI_F32) return _mm512_loadu_ps(p);
    if (KIND == GI_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

GI_INLINE void ftile(const int KIND, const int RB, const int MR, const gi_weight *w,
                     const float *x, int64_t m, int64_t u, float *out, int64_t ldo) {
    const int64_t K = w->n_in;
    const int es = KIND == GI_F32 ? 4 : 2;
    const char *wq = (const char *)w->qs + u * K * 16 * es;   /* (RB, K, 16) */
    const float *xm = x + m * K;                              /* (MR, K) */
    __m512 acc[MAXRB][MAXMR];
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) acc[r][i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m512 wv[MAXRB];
#pragma GCC unroll 16
        for (int r = 0; r < RB; r++) wv[r] = fload(KIND, wq + (r * K + k) * 16 * es);
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            __m512 xb = _mm512_set1_ps(xm[i * K + k]);
#pragma GCC unroll 16
            for (int r = 0; r < RB; r++) acc[r][i] = _mm512_fmadd_ps(wv[r], xb, acc[r][i]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) store_unit(w, out, ldo, m + i, (u + r) * UNIT, acc[r][i]);
}

#elif defined(GI_VARIANT_AVX2)

#define FV_RB 4
#define FG_RB 2
#define FG_MR 6

/* 8 weights (one k, rows 8h..8h+7) of a float kind -> float32 */
GI_INLINE __m256 fload(const int KIND, const void *p) {
    if (KIND == GI_F32) return _mm256_loadu_ps(p);
    if (KIND == GI_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

GI_INLINE void ftile(const int KIND, const int RB, const int MR, const gi_weight *w,
                     const float *x, int64_t m, int64_t u, float *out, int64_t ldo) {
    const int64_t K = w->n_in;
    const int es = KIND == GI_F32 ? 4 : 2;
    const char *wq[MAXRB];                                       /* (K, [8 rows]) per unit, stride 16 */
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++)
        wq[r] = (const char *)w->qs + (((u + r) >> 1) * K * 16 + ((u + r) & 1) * 8) * es;
    const float *xm = x + m * K;                              /* (MR, K) */
    __m256 acc[MAXRB][MAXMR];
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) acc[r][i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        __m256 wv[MAXRB];
#pragma GCC unroll 16
        for (int r = 0; r < RB; r++) wv[r] = fload(KIND, wq[r] + k * 16 * es);
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            __m256 xb = _mm256_set1_ps(xm[i * K + k]);
#pragma GCC unroll 16
            for (int r = 0; r < RB; r++) acc[r][i] = _mm256_fmadd_ps(wv[r], xb, acc[r][i]);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) store_unit(w, out, ldo, m + i, (u + r) * UNIT, acc[r][i]);
}

#endif


/* ============================================================================ SIMD drivers: instantiation and tiling */

#if defined(GI_VARIANT_AVX512) || defined(GI_VARIANT_AVX2)

#define SEQ_1(X, A, B) X(A, B, 1)
#define SEQ_2(X, A, B) SEQ_1(X, A, B) X(A, B, 2)
#define SEQ_3(X, A, B) SEQ_2(X, A, B) X(A, B, 3)
#define SEQ_4(X, A, B) SEQ_3(X, A, B) X(A, B, 4)
#define SEQ_5(X, A, B) SEQ_4(X, A, B) X(A, B, 5)
#define SEQ_6(X, A, B) SEQ_5(X, A, B) X(A, B, 6)
#define SEQ_7(X, A, B) SEQ_6(X, A, B) X(A, B, 7)
#define SEQ_8(X, A, B) SEQ_7(X, A, B) X(A, B, 8)
#define SEQ_9(X, A, B) SEQ_8(X, A, B) X(A, B, 9)
#define SEQ_10(X, A, B) SEQ_9(X, A, B) X(A, B, 10)
#define SEQ_11(X, A, B) SEQ_10(X, A, B) X(A, B, 11)
#define SEQ_12(X, A, B) SEQ_11(X, A, B) X(A, B, 12)
#define SEQ_13(X, A, B) SEQ_12(X, A, B) X(A, B, 13)
#define SEQ_14(X, A, B) SEQ_13(X, A, B) X(A, B, 14)
#define SEQ_15(X, A, B) SEQ_14(X, A, B) X(A, B, 15)
#define SEQ_16(X, A, B) SEQ_15(X, A, B) X(A, B, 16)
#define SEQ(N) GI_CAT(SEQ_, N)

typedef void (*qtile_fn)(const gi_weight *, const gi_qact *, int64_t, int64_t, float *, int64_t);
typedef void (*ftile_fn)(const gi_weight *, const float *, int64_t, int64_t, float *, int64_t);

/* qv_K_RB: GEMV (MR = 1) over RB units; qg_K_RB_MR: GEMM tile.  K is the kind number. */
#define QV_DEF(K, MR, RB) static void qv_##K##_##RB(const gi_weight *w, const gi_qact *a, int64_t m, \
    int64_t u, float *o, int64_t ldo) { qtile(K, RB, MR, w, a, m, u, o, ldo); }
#define QV_PTR(K, MR, RB) qv_##K##_##RB,
#define QG_DEF(K, RB, MR) static void qg_##K##_##RB##_##MR(const gi_weight *w, const gi_qact *a, int64_t m, \
    int64_t u, float *o, int64_t ldo) { qtile(K, RB, MR, w, a, m, u, o, ldo); }
#define QG_PTR(K, RB, MR) qg_##K##_##RB##_##MR,
#define FV_DEF(K, MR, RB) static void fv_##K##_##RB(const gi_weight *w, const float *x, int64_t m, \
    int64_t u, float *o, int64_t ldo) { ftile(K, RB, MR, w, x, m, u, o, ldo); }
#define FV_PTR(K, MR, RB) fv_##K##_##RB,
#define FG_DEF(K, RB, MR) static void fg_##K##_##RB##_##MR(const gi_weight *w, const float *x, int64_t m, \
    int64_t u, float *o, int64_t ldo) { ftile(K, RB, MR, w, x, m, u, o, ldo); }
#define FG_PTR(K, RB, MR) fg_##K##_##RB##_##MR,

/* kinds 0..4 = q4_0, q4_1, q8_0, mxfp4, q6_k; 5..7 = f32, f16, bf16 (matmul.h).  q6_k has
   microkernels on AVX2 only: the avx512 variant hands it to the avx2 table (see matmul_q). */
_Static_assert(GI_MXFP4 == 3 && GI_Q6_K == 4 && GI_F32 == 5 && GI_BF16 == 7,
               "the instantiation lists below assume the kind numbers of matmul.h");
SEQ(QV_RB)(QV_DEF, 0, 1) SEQ(QV_RB)(QV_DEF, 1, 1) SEQ(QV_RB)(QV_DEF, 2, 1) SEQ(QV_RB)(QV_DEF, 3, 1)
/* the GEMM tiles of kind K: RB = 1 (and 2 when QG_RB == 2), MR = 1..QG_MR */
#if QG_RB == 1
#define QG_KIND(K) SEQ(QG_MR)(QG_DEF, K, 1)
#define QG_ROW(K) {{SEQ(QG_MR)(QG_PTR, K, 1)}},
#elif QG_RB == 2
#define QG_KIND(K) SEQ(QG_MR)(QG_DEF, K, 1) SEQ(QG_MR)(QG_DEF, K, 2)
#define QG_ROW(K) {{SEQ(QG_MR)(QG_PTR, K, 1)}, {SEQ(QG_MR)(QG_PTR, K, 2)}},
#else
#error "QG_RB must be 1 or 2"
#endif
QG_KIND(0) QG_KIND(1) QG_KIND(2) QG_KIND(3)
#if defined(GI_VARIANT_AVX2)
#define N_QKINDS 5
SEQ(QV_RB)(QV_DEF, 4, 1) QG_KIND(4)
#else
#define N_QKINDS 4
#endif
SEQ(FV_RB)(FV_DEF, 5, 1) SEQ(FV_RB)(FV_DEF, 6, 1) SEQ(FV_RB)(FV_DEF, 7, 1)
SEQ(FG_MR)(FG_DEF, 5, 1) SEQ(FG_MR)(FG_DEF, 6, 1) SEQ(FG_MR)(FG_DEF, 7, 1)
SEQ(FG_MR)(FG_DEF, 5, 2) SEQ(FG_MR)(FG_DEF, 6, 2) SEQ(FG_MR)(FG_DEF, 7, 2)

#if FG_RB != 2
#error "instantiation lists above assume FG_RB == 2"
#endif
#if QV_RB > MAXRB || FV_RB > MAXRB || QG_RB > MAXRB || QG_MR > MAXMR || FG_MR > MAXMR
#error "microkernel sizes exceed the register array bounds"
#endif

static const qtile_fn qv_tab[N_QKINDS][QV_RB] = {
    {SEQ(QV_RB)(QV_PTR, 0, 1)}, {SEQ(QV_RB)(QV_PTR, 1, 1)}, {SEQ(QV_RB)(QV_PTR, 2, 1)},
    {SEQ(QV_RB)(QV_PTR, 3, 1)},
#if defined(GI_VARIANT_AVX2)
    {SEQ(QV_RB)(QV_PTR, 4, 1)},
#endif
};
static const qtile_fn qg_tab[N_QKINDS][QG_RB][QG_MR] = {
    QG_ROW(0) QG_ROW(1) QG_ROW(2) QG_ROW(3)
#if defined(GI_VARIANT_AVX2)
    QG_ROW(4)
#endif
};
static const ftile_fn fv_tab[3][FV_RB] = {
    {SEQ(FV_RB)(FV_PTR, 5, 1)}, {SEQ(FV_RB)(FV_PTR, 6, 1)}, {SEQ(FV_RB)(FV_PTR, 7, 1)}};
static const ftile_fn fg_tab[3][FG_RB][FG_MR] = {
    {{SEQ(FG_MR)(FG_PTR, 5, 1)}, {SEQ(FG_MR)(FG_PTR, 5, 2)}},
    {{SEQ(FG_MR)(FG_PTR, 6, 1)}, {SEQ(FG_MR)(FG_PTR, 6, 2)}},
    {{SEQ(FG_MR)(FG_PTR, 7, 1)}, {SEQ(FG_MR)(FG_PTR, 7, 2)}}};

#define UPB (GI_ROWS / UNIT)       /* units per row block */
#ifndef L2_CHUNK
#define L2_CHUNK (512 * 1024)      /* GEMM: weight bytes per cache block */
#endif
#ifndef ACT_CHUNK
#define ACT_CHUNK (768 * 1024)     /* GEMM: activation bytes per cache block (both fit a 2 MB L2) */
#endif

GI_INLINE int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* GEMM tiling shared by the int and float paths.  Cache blocks: activation rows [m0, m1) in
   blocks of about ACT_CHUNK bytes, units [u0, u1) in chunks of about L2_CHUNK weight bytes
   (together they stay in L2); inside, the block's rows in nearly equal tiles of <= MR rows;
   inside a tile, the chunk's units RB at a time.  CALL(rb_count, mr, m, u) runs one
   microkernel.  (The order of tiles does not matter for the bits: each output element is
   computed entirely inside one microkernel call.) */
#define GEMM_LOOP(u0, u1, m0, m1, unit_bytes, row_bytes, RBn, MRn, CALL)                        \
    do {                                                                                        \
        int64_t chunk_ = L2_CHUNK / ((unit_bytes) > 0 ? (unit_bytes) : 1);                      \
        chunk_ = chunk_ < (RBn) ? (RBn) : chunk_ / (RBn) * (RBn);                               \
        int64_t mblk_ = ACT_CHUNK / ((row_bytes) > 0 ? (row_bytes) : 1);                        \
        mblk_ = mblk_ < (MRn) ? (MRn) : mblk_ / (MRn) * (MRn);                                  \
        for (int64_t mb0_ = (m0); mb0_ < (m1); mb0_ += mblk_) {                                 \
            const int64_t mb1_ = min64(mb0_ + mblk_, (m1));                                     \
            const int64_t M_ = mb1_ - mb0_, nt_ = (M_ + (MRn) - 1) / (MRn);                     \
            for (int64_t c0_ = (u0); c0_ < (u1); c0_ += chunk_) {                               \
                const int64_t c1_ = min64(c0_ + chunk_, (u1));                                  \
                for (int64_t t_ = 0; t_ < nt_; t_++) {                                          \
                    const int64_t ma_ = mb0_ + t_ * M_ / nt_, mb_ = mb0_ + (t_ + 1) * M_ / nt_; \
                    for (int64_t uu_ = c0_; uu_ < c1_; uu_ += (RBn)) {                          \
                        const int rbn_ = (int)min64((RBn), c1_ - uu_);                          \
                        const int mrn_ = (int)(mb_ - ma_);                                      \
                        CALL(rbn_, mrn_, ma_, uu_);                                             \
                    }                                                                           \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
    } while (0)

#if defined(GI_VARIANT_AVX2)
/* q2_K_MR: the AVX2 GEMM microkernel (qgemm2) of kind K over MR activation rows */
typedef void (*q2_fn)(const gi_weight *, const uint8_t *, const uint8_t *, int64_t, int64_t, int64_t, int64_t,
                      float *, int64_t);
#define Q2_DEF(K, UNP, MR) static void q2_##K##_##UNP##_##MR(const gi_weight *w, const uint8_t *uq, \
    const uint8_t *p, int64_t m, int64_t rb, int64_t g0, int64_t g1, float *o, int64_t ldo) { \
    qgemm2(K, MR, UNP, w, uq, p, m, rb, g0, g1, o, ldo); }
#define Q2_PTR(K, UNP, MR) q2_##K##_##UNP##_##MR,
SEQ(QG2_MR)(Q2_DEF, GI_Q4_0, 1) SEQ(QG2_MR)(Q2_DEF, GI_Q4_1, 1) SEQ(QG2_MR)(Q2_DEF, GI_Q6_K, 1)
SEQ(QG2_MR)(Q2_DEF, GI_Q4_0, 0) SEQ(QG2_MR)(Q2_DEF, GI_Q4_1, 0) SEQ(QG2_MR)(Q2_DEF, GI_Q8_0, 0)
SEQ(QG2_MR)(Q2_DEF, GI_Q6_K, 0)
#if QG2_MR > MAXMR
#error "QG2_MR exceeds the register array bounds"
#endif
/* [unpacked][kind][rows - 1] */
static const q2_fn q2_tab[2][GI_Q6_K + 1][QG2_MR] = {
    {[GI_Q4_0] = {SEQ(QG2_MR)(Q2_PTR, GI_Q4_0, 0)}, [GI_Q4_1] = {SEQ(QG2_MR)(Q2_PTR, GI_Q4_1, 0)},
     [GI_Q8_0] = {SEQ(QG2_MR)(Q2_PTR, GI_Q8_0, 0)}, [GI_Q6_K] = {SEQ(QG2_MR)(Q2_PTR, GI_Q6_K, 0)}},
    {[GI_Q4_0] = {SEQ(QG2_MR)(Q2_PTR, GI_Q4_0, 1)}, [GI_Q4_1] = {SEQ(QG2_MR)(Q2_PTR, GI_Q4_1, 1)},
     [GI_Q6_K] = {SEQ(QG2_MR)(Q2_PTR, GI_Q6_K, 1)}}};

/* Each thread's scratch (an activation panel, then the unpacked q4 weights of a chunk), grown
   as needed and kept for the thread's life: at most ~530 KB. */
static __thread uint8_t *t_scratch;
static __thread size_t t_scratch_cap;

static uint8_t *scratch_buffer(size_t n) {
    if (n > t_scratch_cap) {
        size_t cap = (n + 4095) & ~(size_t)4095;
        uint8_t *p = aligned_alloc(64, cap);
        if (!p) return NULL;
        free(t_scratch);
        t_scratch = p;
        t_scratch_cap = cap;
    }
    return t_scratch;
}
#ifndef UNP_MIN_TILES
#define UNP_MIN_TILES 8            /* AVX2 q4 GEMM: unpack when at least this many tiles reuse it */
#endif
#ifndef UNP_CHUNK
#define UNP_CHUNK (512 * 1024)     /* AVX2 q4 GEMM: unpacked weight bytes per chunk (in L2) */
#endif

/* The q4_0 / q4_1 / q8_0 GEMM of AVX2, blocked for the caches:
     for each chunk of row blocks (~UNP_CHUNK unpacked bytes per K block, in L2):
       for each K block of KB_GROUPS groups:
         unpack the chunk's q4 weights of the block once
         for each tile of <= QG2_MR activation rows (nearly equal tiles):
           pack its panel of the block once (L1), then run every row block of the chunk.
   An output element is computed by one microkernel call per K block, in group order, the
   accumulators carried through out between K blocks (the tail row block's missing columns are
   neither stored nor loaded), so its bits do not depend on the blocking.  Returns 0 (nothing
   done) if the scratch cannot be allocated. */
static int gemm2(const gi_weight *w, const gi_qact *a, int64_t m0, int64_t m1, int64_t rb0, int64_t rb1,
                 float *out, int64_t ldo) {
    const int kind = w->kind;
    const int64_t G = w->n_in / GI_GROUP, M = m1 - m0, nt = (M + QG2_MR - 1) / QG2_MR;
    const int unp = kind != GI_Q8_0 && nt >= UNP_MIN_TILES;
    const int64_t kb = G < KB_GROUPS ? G : KB_GROUPS;
    if (kb == 0) return 0;                               /* K = 0: the general path writes zeros */
    /* row blocks per chunk: the q4 unpacked bytes of one K block, or q8_0's bytes, ~UNP_CHUNK */
    int64_t chunk = UNP_CHUNK / (kb * (unp ? UNP_GROUP_BYTES : LINES(kind) * 64 + 32));
    chunk = chunk < 1 ? 1 : chunk;
    const size_t panel_bytes = ((size_t)kb * PANEL_STRIDE(QG2_MR) + 63) & ~(size_t)63;
    uint8_t *panel = scratch_buffer(panel_bytes + (unp ? (size_t)chunk * kb * UNP_GROUP_BYTES : 0));
    if (!panel) return 0;
    uint8_t *uq = panel + panel_bytes;
    for (int64_t c0 = rb0; c0 < rb1; c0 += chunk) {
        const int64_t c1 = min64(c0 + chunk, rb1);
        for (int64_t g0 = 0; g0 < G; g0 += kb) {
            const int64_t g1 = min64(g0 + kb, G);
            if (unp && kind == GI_Q6_K) unpack_q6(w, c0, c1, g0, g1, uq);
            else if (unp) unpack_q4(w, c0, c1, g0, g1, uq);
            for (int64_t t = 0; t < nt; t++) {
                const int64_t ma = m0 + t * M / nt, mr = m0 + (t + 1) * M / nt - ma;
                pack_panel(a, kind, ma, (int)mr, g0, g1, panel);
                for (int64_t rb = c0; rb < c1; rb++)
                    q2_tab[unp][kind][mr - 1](w, uq + (rb - c0) * (g1 - g0) * UNP_GROUP_BYTES, panel, ma, rb, g0, g1,
                                              out, ldo);
            }
        }
    }
    return 1;
}
#endif

static void GI(matmul_q)(const gi_weight *w, const gi_qact *a, int64_t m0, int64_t m1,
                         int64_t rb0, int64_t rb1, float *out, int64_t ldo) {
    const int kind = w->kind;
    const int64_t u0 = rb0 * UPB, u1 = rb1 * UPB;
    if (m1 - m0 <= 0 || u1 <= u0) return;
#if defined(GI_VARIANT_AVX512)
    if (kind == GI_Q6_K) {
        /* no AVX-512 q6_k microkernels (not testable on the AVX2 machine they were written on):
           the AVX2 ones, which every AVX-512 CPU runs, give the contract's bits.  The layout
           build of this variant converts Q6_K to q8_0 instead (goinfer/gguf.py). */
        gi_matmul_ops_avx2.matmul_q(w, a, m0, m1, rb0, rb1, out, ldo);
        return;
    }
#endif
    if (m1 - m0 == 1) {
        /* GEMV (decode): stream the weights once, QV_RB units at a time */
        for (int64_t u = u0; u < u1; u += QV_RB)
            qv_tab[kind][min64(QV_RB, u1 - u) - 1](w, a, m0, u, out, ldo);
        return;
    }
#if defined(GI_VARIANT_AVX512)
    /* AMX (matmul_amx.c) takes whole tiles of 16 rows when enabled; the rest runs below */
    if (m1 - m0 >= 16 && gi_amx_enabled()) {
        m0 += gi_matmul_q_amx(w, a, m0, m1, rb0, rb1, out, ldo);
        if (m0 >= m1) return;
    }
#endif
    const int64_t ub = (w->n_in / GI_GROUP) * (LINES(kind) * 64 + SCALE_BYTES(kind)) / UPB;
#if defined(GI_VARIANT_AVX2)
    if ((kind == GI_Q4_0 || kind == GI_Q4_1 || kind == GI_Q8_0 || kind == GI_Q6_K) &&
        gemm2(w, a, m0, m1, rb0, rb1, out, ldo))
        return;
#endif
#define QCALL(rbn, mrn, m, u) qg_tab[kind][(rbn) - 1][(mrn) - 1](w, a, (m), (u), out, ldo)
    GEMM_LOOP(u0, u1, m0, m1, ub, w->n_in, QG_RB, QG_MR, QCALL);
#undef QCALL
}

static void GI(matmul_f)(const gi_weight *w, const float *x, int64_t m0, int64_t m1,
                         int64_t rb0, int64_t rb1, float *out, int64_t ldo) {
    const int kind = w->kind - GI_F32;
    const int64_t u0 = rb0 * UPB, u1 = rb1 * UPB;
    if (m1 - m0 <= 0 || u1 <= u0) return;
    if (m1 - m0 == 1) {
        for (int64_t u = u0; u < u1; u += FV_RB)
            fv_tab[kind][min64(FV_RB, u1 - u) - 1](w, x, m0, u, out, ldo);
        return;
    }
    const int64_t ub = w->n_in * 16 * (w->kind == GI_F32 ? 4 : 2) / UPB;
#define FCALL(rbn, mrn, m, u) fg_tab[kind][(rbn) - 1][(mrn) - 1](w, x, (m), (u), out, ldo)
    GEMM_LOOP(u0, u1, m0, m1, ub, w->n_in * 4, FG_RB, FG_MR, FCALL);
#undef FCALL
}


/* ============================================================================ portable: plain C */

#else

#define QG_MR 4
#define FG_MR 4

static void GI(matmul_q)(const gi_weight *w, const gi_qact *a, int64_t m0, int64_t m1,
                         int64_t rb0, int64_t rb1, float *out, int64_t ldo) {
    const int kind = w->kind;
    const int64_t K = w->n_in, G = K / GI_GROUP;
    const int NL = LINES(kind);
    for (int64_t rb = rb0; rb < rb1; rb++) {
        const uint8_t *wq = (const uint8_t *)w->qs + rb * G * NL * 64;   /* (G, NL, 16, 4) */
        const uint16_t *wd = kind == GI_MXFP4 ? 0 : kind == GI_Q6_K ? w->d + rb * (G / 8) * 16
                                                                    : w->d + rb * G * 16;  /* (G or G/8, 16) */
        const uint16_t *wm = kind == GI_Q4_1 ? w->m + rb * G * 16 : 0;
        const uint8_t *we = kind == GI_MXFP4 ? w->e + rb * G * 16 : 0;   /* (G, 16) */
        const int64_t cnt = cols_left(w, rb * GI_ROWS) < GI_ROWS ? cols_left(w, rb * GI_ROWS) : GI_ROWS;
        for (int64_t m = m0; m < m1; m++) {
            float acc[GI_ROWS] = {0};
            for (int64_t g = 0; g < G; g++) {
                const int8_t *ag = a->qa + m * K + g * GI_GROUP;      /* (32,) */
                const uint8_t *lg = wq + g * NL * 64;
                int32_t is[GI_ROWS] = {0};
                if (kind == GI_Q6_K) {
                    const int8_t *sg = w->sc + (rb * G + g) * 32;                  /* (16, 2) */
                    for (int r = 0; r < GI_ROWS; r++) {
                        int32_t h[2] = {0, 0};
                        for (int k = 0; k < GI_GROUP; k++) h[k >> 4] += (q6_code(lg, r, k) - 32) * ag[k];
                        is[r] = sg[2 * r] * h[0] + sg[2 * r + 1] * h[1];
                    }
                } else if (kind == GI_MXFP4) {
                    for (int c = 0; c < 4; c++)
                        for (int r = 0; r < GI_ROWS; r++)
                            for (int j = 0; j < 4; j++) {
                                int b = lg[c * 64 + r * 4 + j];
                                is[r] += KV_MXFP4[b & 15] * ag[c * 4 + j] + KV_MXFP4[b >> 4] * ag[16 + c * 4 + j];
                            }
                } else if (kind != GI_Q8_0) {
                    for (int c = 0; c < 4; c++)
                        for (int r = 0; r < GI_ROWS; r++)
                            for (int j = 0; j < 4; j++) {
                                int b = lg[c * 64 + r * 4 + j];
                                is[r] += (b & 15) * ag[c * 4 + j] + (b >> 4) * ag[16 + c * 4 + j];
                            }
                } else {
                    for (int c = 0; c < 8; c++)
                        for (int r = 0; r < GI_ROWS; r++)
                            for (int j = 0; j < 4; j++)
                                is[r] += (int8_t)lg[c * 64 + r * 4 + j] * ag[c * 4 + j];
                }
                const float dam = a->da[m * G + g];
                const int32_t corr = kind == GI_Q4_0 ? 8 * a->asum[m * G + g] : 0;
                for (int r = 0; r < GI_ROWS; r++) {
                    float dd = (kind == GI_MXFP4 ? e8m0_half(we[g * 16 + r])
                                : f16_to_f32(wd[(kind == GI_Q6_K ? g >> 3 : g) * 16 + r])) * dam;
                    acc[r] = fmaf((float)(is[r] - corr), dd, acc[r]);
                    if (kind == GI_Q4_1) acc[r] = fmaf(f16_to_f32(wm[g * 16 + r]), a->sa[m * G + g], acc[r]);
                }
            }
            for (int64_t r = 0; r < cnt; r++) out[m * ldo + rb * GI_ROWS + r] = acc[r];
        }
    }
}

static void GI(matmul_f)(const gi_weight *w, const float *x, int64_t m0, int64_t m1,
                         int64_t rb0, int64_t rb1, float *out, int64_t ldo) {
    const int kind = w->kind;
    const int64_t K = w->n_in;
    for (int64_t rb = rb0; rb < rb1; rb++) {
        const int64_t cnt = cols_left(w, rb * GI_ROWS) < GI_ROWS ? cols_left(w, rb * GI_ROWS) : GI_ROWS;
        for (int64_t m = m0; m < m1; m++) {
            const float *xm = x + m * K;
            float acc[GI_ROWS] = {0};
            for (int64_t k = 0; k < K; k++) {
                float wv[GI_ROWS];
                const int64_t off = (rb * K + k) * GI_ROWS;                /* (16,) */
                if (kind == GI_F32) memcpy(wv, (const float *)w->qs + off, sizeof wv);
                else if (kind == GI_F16)
                    for (int r = 0; r < GI_ROWS; r++) wv[r] = f16_to_f32(((const uint16_t *)w->qs)[off + r]);
                else
                    for (int r = 0; r < GI_ROWS; r++) wv[r] = bf16_to_f32(((const uint16_t *)w->qs)[off + r]);
                for (int r = 0; r < GI_ROWS; r++) acc[r] = fmaf(wv[r], xm[k], acc[r]);
            }
            for (int64_t r = 0; r < cnt; r++) out[m * ldo + rb * GI_ROWS + r] = acc[r];
        }
    }
}

#endif


/* ============================================================================ get_rows (all variants: plain C) */

/* Dequantized value = the reference's float32 expression: q4_0 (nib-8)*d, q4_1 nib*d + m
   (two roundings), q8_0 q*d, mxfp4 KV[code]*2^(e-128) (exact), floats converted exactly. */
static void GI(get_rows)(const gi_weight *w, const int64_t *ids, int64_t t0, int64_t t1, float *out) {
    const int64_t K = w->n_in;
    const int kind = w->kind;
    for (int64_t t = t0; t < t1; t++) {
        const int64_t n = ids[t], rb = n / GI_ROWS, r = n % GI_ROWS;
        float *o = out + t * K;                                             /* (K,) */
        if (kind >= GI_F32) {
            for (int64_t k = 0; k < K; k++) {
                const int64_t off = (rb * K + k) * GI_ROWS + r;
                if (kind == GI_F32) o[k] = ((const float *)w->qs)[off];
                else if (kind == GI_F16) o[k] = f16_to_f32(((const uint16_t *)w->qs)[off]);
                else o[k] = bf16_to_f32(((const uint16_t *)w->qs)[off]);
            }
            continue;
        }
        const int64_t G = K / GI_GROUP;
        const int NL = LINES(kind);
        const uint8_t *wq = (const uint8_t *)w->qs + rb * G * NL * 64;     /* (G, NL, 16, 4) */
        for (int64_t g = 0; g < G; g++) {
            float *og = o + g * GI_GROUP;
            if (kind == GI_Q6_K) {  /* (d * sc) * (q - 32): both products exact in float32 */
                const float d = f16_to_f32(w->d[(rb * (G / 8) + g / 8) * GI_ROWS + r]);
                const int8_t *sg = w->sc + ((rb * G + g) * GI_ROWS + r) * 2;
                const float d0 = d * (float)sg[0], d1 = d * (float)sg[1];
                for (int k = 0; k < GI_GROUP; k++)
                    og[k] = (float)(q6_code(wq + g * NL * 64, (int)r, k) - 32) * (k < 16 ? d0 : d1);
                continue;
            }
            const float d = kind == GI_MXFP4 ? e8m0_half(w->e[(rb * G + g) * GI_ROWS + r])
                                             : f16_to_f32(w->d[(rb * G + g) * GI_ROWS + r]);
            const uint8_t *lg = wq + g * NL * 64 + r * 4;
            if (kind == GI_MXFP4) {
                for (int c = 0; c < 4; c++)
                    for (int j = 0; j < 4; j++) {
                        int b = lg[c * 64 + j];
                        og[c * 4 + j] = (float)KV_MXFP4[b & 15] * d;
                        og[16 + c * 4 + j] = (float)KV_MXFP4[b >> 4] * d;
                    }
            } else if (kind == GI_Q8_0) {
                for (int c = 0; c < 8; c++)
                    for (int j = 0; j < 4; j++) og[c * 4 + j] = (float)(int8_t)lg[c * 64 + j] * d;
            } else if (kind == GI_Q4_0) {
                for (int c = 0; c < 4; c++)
                    for (int j = 0; j < 4; j++) {
                        int b = lg[c * 64 + j];
                        og[c * 4 + j] = (float)((b & 15) - 8) * d;
                        og[16 + c * 4 + j] = (float)((b >> 4) - 8) * d;
                    }
            } else {
                const float mn = f16_to_f32(w->m[(rb * G + g) * GI_ROWS + r]);
                for (int c = 0; c < 4; c++)
                    for (int j = 0; j < 4; j++) {
                        int b = lg[c * 64 + j];
                        float lo = (float)(b & 15) * d, hi = (float)(b >> 4) * d;
                        og[c * 4 + j] = lo + mn;
                        og[16 + c * 4 + j] = hi + mn;
                    }
            }
        }
    }
}


/* ============================================================================ table */

#if defined(GI_VARIANT_AVX2)
#define MR_Q QG2_MR
#else
#define MR_Q QG_MR
#endif
const gi_matmul_ops GI(gi_matmul_ops) = {
    GI(quantize_act), GI(matmul_q), GI(matmul_f), GI(get_rows), MR_Q, FG_MR,
};
