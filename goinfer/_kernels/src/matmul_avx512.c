/* Matrix-multiply kernels, AVX-512 VNNI (the avx512 variant): activation quantization, the
 * int / float microkernels qtile and ftile, which matmul_impl.c instantiates and tiles, and the
 * decode GEMV of the 4-bit kinds (qv_q4).
 * Included by matmul_impl.c only (see matmul_impl.h for the contracts and the helpers).
 */
#if !defined(GI_MATMUL_IMPL_H) || !defined(GI_VARIANT_AVX512)
#error "matmul_avx512.c is part of matmul_impl.c's avx512 variant, not a translation unit of its own"
#endif
#include <immintrin.h>

/* ============================================================================ tile sizes */

#define UNIT 16          /* output rows per unit */
#define QV_RB 4          /* GEMV: at most units per microkernel (MR = 1): 4 row blocks, as many
                            streams (matmul_q reads gemv_streams() row blocks per call) */
/* GEMM tile: 2 units x 6 activation rows, so each broadcast activation word feeds two
   vpdpbusd (12 int32 + 12 float accumulators: 24 of the 32 zmm).  Against 1 x 12 (one
   broadcast per vpdpbusd) it took the 1B / 8B prefill GEMM from ~35-68% to ~65-85% of the
   nominal VNNI peak on a 2-core AMD EPYC Zen 5 (benchmarks/kernels_matmul.py, 2026-12-02);
   2 x 5 is about the same, 2 x 7 slower.  The whole-model figures: docs/benchmarks.md, "AMD
   EPYC Zen 5: goinfer avx512-vnni against llama.cpp built natively". */
#ifndef QG_RB
#define QG_RB 2          /* GEMM: units per microkernel (1 or 2) */
#endif
#ifndef QG_MR
#define QG_MR 6          /* GEMM: activation rows per microkernel */
#endif
#define FV_RB 4          /* float GEMV: units per microkernel */
#define FG_RB 2          /* float GEMM: units per microkernel */
#define FG_MR 12         /* float GEMM: activation rows per microkernel */
#define QG_MR_Q6K 4      /* q6_k GEMM: fewer rows (3 live vectors per output: H0 x sc0, H1, acc) */
#define MR_Q QG_MR       /* gi_matmul_ops.mr_q: activation rows per int GEMM tile */

/* int8 peak probe (matmul_impl.c): vpdpbusd zmm, 64 multiply-adds each */
#define PROBE_T __m512i
#define PROBE_SET1 _mm512_set1_epi32
#define PROBE_STEP(acc, a, b) _mm512_dpbusd_epi32((acc), (a), (b))
#define PROBE_LANE0 _mm512_cvtsi512_si32
#define PROBE_OPS 128
/* float32 FMA peak probe: vfmadd zmm, 16 lanes (2 operations each) */
#define FPROBE_T __m512
#define FPROBE_SET1 _mm512_set1_ps
#define FPROBE_STEP(acc, a, b) _mm512_fmadd_ps((acc), (a), (b))
#define FPROBE_LANE0 _mm512_cvtss_f32
#define F16PROBE_LOAD(p) _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(p)))
#define FPROBE_OPS 32


/* ============================================================================ activation quantization */

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


/* ============================================================================ int microkernel */

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

/* q6_k: -32 * (sum of qa over k 0..15 of a group): the offset of the low half's codes */
GI_INLINE int32_t q6_lowsum(const int8_t *ag) {
    const __m128i v = _mm_xor_si128(_mm_loadu_si128((const __m128i *)ag), _mm_set1_epi8((char)0x80));
    const __m128i s = _mm_sad_epu8(v, _mm_setzero_si128());         /* sums of qa + 128 per 8 bytes */
    return _mm_cvtsi128_si32(s) + _mm_extract_epi16(s, 4) - 16 * 128;
}

/* Int kinds, RB units of 16 rows x MR activation rows, the full K reduction.
   q6_k: the two 16-k halves of a group accumulate apart (H0, H1, exact int32 from vpdpbusd of
   the unsigned codes, started at -32 x the half's activation sum); isum = sc0*H0 + sc1*H1 is
   formed in float32 as fma(H1, sc1, H0*sc0): every value is an integer below 2^24 (|H| <=
   16*32*127, |sc| <= 128), so it is exact, and the fold is the contract's.
   Every int32 sum starts at FOLD_BIAS (plus its correction) and is read as a float less
   FOLD_BIAS_F (matmul_impl.h): on Emerald Rapids, 1B shapes, M = 512, one thread, AMX off,
   1.04-1.10x for q4_0, q4_1, q4_k and q8_0 against vcvtdq2ps, 1.01x for q6_k. */
GI_INLINE void qtile(const int KIND, const int RB, const int MR, const gi_weight *w,
                     const gi_qact *a, int64_t m, int64_t u, float *out, int64_t ldo) {
    const int64_t K = w->n_in, G = K / GI_GROUP;
    const int NL = LINES(KIND), QK = IS_QK(KIND);
    const int64_t rbs = G * NL * 64;                              /* bytes per row block */
    const uint8_t *wq = (const uint8_t *)w->qs + u * rbs;         /* (RB, G, NL, 16, 4) */
    /* d: (RB, G, 16); q6_k (RB, G/8, 16); q4_k, q5_k (RB, G/8, 2, 16) */
    const int64_t ds_ = KIND == GI_Q6_K ? G / 8 * 16 : QK ? G / 8 * 32 : G * 16;
    const uint16_t *wd = KIND == GI_MXFP4 ? 0 : w->d + u * ds_;
    const uint8_t *we = KIND == GI_MXFP4 ? w->e + u * G * 16 : 0; /* (RB, G, 16) */
    const uint16_t *wm = HAS_MIN(KIND) ? w->m + u * G * 16 : 0;  /* (RB, G, 16) */
    const int8_t *wsc = KIND == GI_Q6_K ? w->sc + u * G * 32 : 0; /* (RB, G, 16, 2) */
    const uint8_t *wk = QK ? w->ks + u * (G / 8) * 192 : 0;      /* (RB, G/8, 12, 16) */
    const int8_t *qa = a->qa + m * K;                             /* (MR, K) */
    const float *da = a->da + m * G, *sa = a->sa + m * G;         /* (MR, G) */
    const int32_t *as = a->asum + m * G;                          /* (MR, G) */
    const int64_t pf = MR == 1 ? gemv_prefetch(KIND) : 0;          /* GEMV prefetch distances, groups */
    const int64_t ff = MR == 1 ? gemv_prefetch_far(KIND) : 0;
    const __m512i nib = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
    const __m512i b4 = _mm512_set1_epi8(0x10), m3f = _mm512_set1_epi8(0x3F), m30 = _mm512_set1_epi8(0x30);
    const __m512 fbias = _mm512_set1_ps(FOLD_BIAS_F);
    /* mxfp4: code -> KV + 12 (0..24, unsigned for vpdpbusd), corrected by -12*asum */
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24,
                                                             12, 11, 10, 9, 8, 6, 4, 0));
    __m512 acc[MAXRB][MAXMR];
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) acc[r][i] = _mm512_setzero_ps();

    for (int64_t g0 = 0; g0 < G; g0 += 16) {
        /* ---- the integer correction of 16 groups at a time: cb[i][gg] = FOLD_BIAS plus -8*asum
           (q4_0), -16*asum (q5_0), -128*asum (q8_0), -12*asum (mxfp4) or -32 x the low half's sum
           (q6_k; cb1: the high half's) of row m+i, group g0+gg.  It is the initial value of the
           int32 accumulators (a load-only broadcast), so no subtraction is needed afterwards. */
        const int gn = (int)(G - g0 < 16 ? G - g0 : 16);
        int32_t cb[MAXMR][16], cb1[MAXMR][16];
        if (KIND == GI_Q4_0 || KIND == GI_Q5_0 || KIND == GI_Q8_0 || KIND == GI_MXFP4) {
            const __mmask16 gm = (__mmask16)((1u << gn) - 1u);
#pragma GCC unroll 16
            for (int i = 0; i < MR; i++) {
                __m512i v = _mm512_maskz_loadu_epi32(gm, as + i * G + g0);
                if (KIND == GI_MXFP4)
                    v = _mm512_mullo_epi32(v, _mm512_set1_epi32(-12));
                else
                    v = _mm512_sub_epi32(_mm512_setzero_si512(),
                                         _mm512_slli_epi32(v, KIND == GI_Q4_0 ? 3 : KIND == GI_Q5_0 ? 4 : 7));
                _mm512_storeu_si512(cb[i], _mm512_add_epi32(v, _mm512_set1_epi32(FOLD_BIAS)));
            }
        } else if (KIND == GI_Q6_K && w->q6lo) {  /* the GEMM's low sums of the block */
            const __mmask16 gm = (__mmask16)((1u << gn) - 1u);
            const __m512i bias = _mm512_set1_epi32(FOLD_BIAS);
#pragma GCC unroll 16
            for (int i = 0; i < MR; i++) {
                const __m512i lo = _mm512_maskz_loadu_epi32(gm, w->q6lo + (m + i - w->q6lo_m0) * G + g0);
                const __m512i all = _mm512_maskz_loadu_epi32(gm, as + i * G + g0);
                _mm512_storeu_si512(cb[i], _mm512_sub_epi32(bias, _mm512_slli_epi32(lo, 5)));
                _mm512_storeu_si512(cb1[i], _mm512_sub_epi32(bias, _mm512_slli_epi32(_mm512_sub_epi32(all, lo), 5)));
            }
        } else if (KIND == GI_Q6_K) {
#pragma GCC unroll 16
            for (int i = 0; i < MR; i++)
                for (int gg = 0; gg < gn; gg++) {
                    const int32_t lo = q6_lowsum(qa + i * K + (g0 + gg) * GI_GROUP);
                    cb[i][gg] = FOLD_BIAS - 32 * lo;
                    cb1[i][gg] = FOLD_BIAS - 32 * (as[i * G + g0 + gg] - lo);
                }
        }
        for (int gg = 0; gg < gn; gg++) {
            const int64_t g = g0 + gg;
            /* ---- exact int32 dot products of group g: 16 rows x MR activation rows per unit */
            __m512i is[MAXRB][MAXMR], is1[MAXRB][MAXMR];
#pragma GCC unroll 16
            for (int i = 0; i < MR; i++) {
                const int zero = HAS_MIN(KIND) || QK;
                __m512i c0 = _mm512_set1_epi32(zero ? FOLD_BIAS : cb[i][gg]);
#pragma GCC unroll 16
                for (int r = 0; r < RB; r++) is[r][i] = c0;
            }
            const uint8_t *lg = wq + g * NL * 64;
            const int8_t *ag = qa + g * GI_GROUP;
            /* GEMV streams the weight from memory: prefetch pf groups ahead (into L1) and ff
               (prefetcht2: the outer caches) in each unit's qs (and scale) streams */
#pragma GCC unroll 2
            for (int far = 0; far < 2 && MR == 1; far++) {
                const int64_t d = far ? ff : pf, gp = g + d;
                if (d <= 0) continue;
#pragma GCC unroll 16
                for (int r = 0; r < RB; r++) {
#pragma GCC unroll 8
                    for (int c = 0; c < NL; c++) prefetch_line(lg + r * rbs + d * NL * 64 + c * 64, far);
                    if (KIND == GI_MXFP4) prefetch_line(we + r * G * 16 + gp * 16, far);
                    else if (KIND == GI_Q6_K) prefetch_line(wsc + r * G * 32 + gp * 32, far);
                    else if (QK)  /* 192 + 64 bytes per 8 groups: one line in 3, one in 8 */
                        prefetch_line(wk + r * (G / 8) * 192 + gp * 24, far);
                    else prefetch_line(wd + r * G * 16 + gp * 16, far);
                    if (HAS_MIN(KIND)) prefetch_line(wm + r * G * 16 + gp * 16, far);
                    if (QK && (g & 7) == 0) prefetch_line(wd + r * ds_ + (gp >> 3) * 32, far);
                }
            }
            if (KIND == GI_Q6_K) {
#pragma GCC unroll 16
                for (int i = 0; i < MR; i++) {
                    __m512i c1 = _mm512_set1_epi32(cb1[i][gg]);
#pragma GCC unroll 16
                    for (int r = 0; r < RB; r++) is1[r][i] = c1;
                }
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    __m512i lo[MAXRB], hi[MAXRB];   /* codes of k = 4c+j and 16+4c+j */
#pragma GCC unroll 16
                    for (int r = 0; r < RB; r++) {
                        const __m512i x = _mm512_loadu_si512(lg + r * rbs + c * 64);
                        __m512i y = _mm512_loadu_si512(lg + r * rbs + (4 + (c >> 1)) * 64);
                        if (c & 1) y = _mm512_srli_epi16(y, 4);
                        lo[r] = _mm512_and_si512(x, m3f);
                        /* bits 0..3 from y's nibble, 4..5 from x's bits 6..7 (0xE4: C ? A : B) */
                        hi[r] = _mm512_ternarylogic_epi32(y, _mm512_and_si512(_mm512_srli_epi16(x, 2), m30), nib, 0xE4);
                    }
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++) {
                        __m512i bl = _mm512_set1_epi32(load_i32(ag + i * K + c * 4));
                        __m512i bh = _mm512_set1_epi32(load_i32(ag + i * K + 16 + c * 4));
#pragma GCC unroll 16
                        for (int r = 0; r < RB; r++) {
                            is[r][i] = _mm512_dpbusd_epi32(is[r][i], lo[r], bl);
                            is1[r][i] = _mm512_dpbusd_epi32(is1[r][i], hi[r], bh);
                        }
                    }
                }
            } else if (KIND != GI_Q8_0) {
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    __m512i lo[MAXRB], hi[MAXRB];   /* codes of k = c*4+j and 16+c*4+j, unpacked once */
#pragma GCC unroll 16
                    for (int r = 0; r < RB; r++) {
                        __m512i l = _mm512_loadu_si512(lg + r * rbs + c * 64);
                        lo[r] = _mm512_and_si512(l, nib);
                        hi[r] = _mm512_and_si512(_mm512_srli_epi16(l, 4), nib);
                        if (KIND == GI_MXFP4) {
                            lo[r] = _mm512_shuffle_epi8(lut, lo[r]);
                            hi[r] = _mm512_shuffle_epi8(lut, hi[r]);
                        }
                        if (IS_Q5(KIND)) {  /* bit 4: bit c (low half), 4 + c (high) of line 4 */
                            const __m512i h = _mm512_loadu_si512(lg + r * rbs + 4 * 64);
                            lo[r] = _mm512_or_si512(lo[r], _mm512_and_si512(_mm512_slli_epi16(h, 4 - c), b4));
                            hi[r] = _mm512_or_si512(hi[r], _mm512_and_si512(_mm512_srli_epi16(h, c), b4));
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
            __m512 dv[MAXRB], mv[MAXRB], s0[MAXRB], s1[MAXRB];
#pragma GCC unroll 16
            for (int r = 0; r < RB; r++) {
                if (QK && w->kdec) {  /* the GEMM's decoded scales */
                    const float *kf = w->kdec + ((u + r - w->kdec_u0) * G + g) * 32;
                    dv[r] = _mm512_loadu_ps(kf);
                    mv[r] = _mm512_loadu_ps(kf + 16);
                    continue;
                }
                if (QK) {
                    qk_scales16(wd + r * ds_ + (g >> 3) * 32, wk + r * (G / 8) * 192 + (g >> 3) * 192, (int)(g & 7),
                                &dv[r], &mv[r]);
                    continue;
                }
                dv[r] = KIND == GI_MXFP4 ? e8m0_half16(we + r * G * 16 + g * 16)
                        : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wd + r * ds_ + (KIND == GI_Q6_K ? g >> 3 : g) * 16)));
                if (HAS_MIN(KIND))
                    mv[r] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wm + r * G * 16 + g * 16)));
                if (KIND == GI_Q6_K) q6_scales16(wsc + r * G * 32 + g * 32, &s0[r], &s1[r]);
            }
#pragma GCC unroll 16
            for (int i = 0; i < MR; i++) {
                __m512 dai = _mm512_set1_ps(da[i * G + g]);
#pragma GCC unroll 16
                for (int r = 0; r < RB; r++) {
                    __m512 isf = _mm512_sub_ps(_mm512_castsi512_ps(is[r][i]), fbias);
                    if (KIND == GI_Q6_K)   /* exact: see above */
                        isf = _mm512_fmadd_ps(_mm512_sub_ps(_mm512_castsi512_ps(is1[r][i]), fbias), s1[r], _mm512_mul_ps(isf, s0[r]));
                    acc[r][i] = _mm512_fmadd_ps(isf, _mm512_mul_ps(dv[r], dai), acc[r][i]);
                    if (HAS_MIN(KIND) || QK)
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


/* ============================================================================ q4 GEMV (q4_0, q4_1, q4_k) */

/* The decode GEMV of the 4-bit kinds: qtile's work for RB row blocks (each read as its own
   stream) and one activation row, with the same bits, written for the stream (one pointer per
   operand and row block, the integer dot in two chains: q4_k reads 1.2-1.3x the bytes per second
   of qtile's GEMV when the weight is in cache on a Zen 4, q4_0 and q4_1 alike).  q4_k unpacks a
   super-block's 16 rows x 8 sub-blocks of 6-bit scales and mins from their 12 lines at once
   (three 512-bit loads, a few byte operations) into a small buffer and unrolls its 8 groups, so
   each group only converts its scales and mins; -(dmin*mn) is (-dmin)*mn (the product is exact).
   q4_k needs G % 8 == 0 (K a multiple of 256, as every q4_k weight). */

/* Group lg (4 lines x 64 bytes) x qa of the group (ag): the exact int32 dot of 16 rows */
GI_INLINE __m512i q4_dot16(const uint8_t *lg, const int8_t *ag) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    __m512i il = _mm512_setzero_si512(), ih = _mm512_setzero_si512();   /* k < 16, k >= 16 */
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512i x = _mm512_loadu_si512(lg + c * 64);
        il = _mm512_dpbusd_epi32(il, _mm512_and_si512(x, nib), _mm512_set1_epi32(load_i32(ag + c * 4)));
        ih = _mm512_dpbusd_epi32(ih, _mm512_and_si512(_mm512_srli_epi16(x, 4), nib),
                                 _mm512_set1_epi32(load_i32(ag + 16 + c * 4)));
    }
    return _mm512_add_epi32(il, ih);
}

GI_INLINE void qv_q4(const int KIND, const int RB, const gi_weight *w, const gi_qact *a, int64_t m,
                     int64_t rb, float *out, int64_t ldo) {
    const int64_t K = w->n_in, G = K / GI_GROUP, NS = G / 8;
    const uint8_t *wq = (const uint8_t *)w->qs + rb * G * 256;       /* RB x (G, 4, 16, 4) */
    const int8_t *qa = a->qa + m * K;                                 /* (K,) */
    const float *da = a->da + m * G, *sa = a->sa + m * G;             /* (G,) */
    const int32_t *as = a->asum + m * G;
    const int64_t pf = gemv_prefetch(KIND), ff = gemv_prefetch_far(KIND);   /* groups: near, far */
    __m512 acc[MAXRB];
#pragma GCC unroll 4
    for (int r = 0; r < RB; r++) acc[r] = _mm512_setzero_ps();
    if (KIND != GI_Q4_K) {
        const uint16_t *wd = w->d + rb * G * 16;                      /* RB x (G, 16) */
        const uint16_t *wm = KIND == GI_Q4_1 ? w->m + rb * G * 16 : 0;
        for (int64_t g = 0; g < G; g++) {
            const __m512 dag = _mm512_set1_ps(da[g]);
#pragma GCC unroll 4
            for (int r = 0; r < RB; r++) {  /* row block rb + r: its own stream */
                const uint8_t *lg = wq + (r * G + g) * 256;           /* (4, 16, 4) */
                const uint16_t *wdr = wd + r * G * 16, *wmr = KIND == GI_Q4_1 ? wm + r * G * 16 : 0;
                qv_q4_prefetch(KIND, lg, wdr, wmr, g, pf, ff);
                __m512i is = q4_dot16(lg, qa + g * GI_GROUP);
                if (KIND == GI_Q4_0) is = _mm512_sub_epi32(is, _mm512_set1_epi32(8 * as[g]));
                /* the contract's fold, as qtile's */
                const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wdr + g * 16)));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dv, dag), acc[r]);
                if (KIND == GI_Q4_1)
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wmr + g * 16))),
                                             _mm512_set1_ps(sa[g]), acc[r]);
            }
        }
    } else {
        const uint16_t *wd = w->d + rb * NS * 32;                     /* RB x (NS, 2, 16): d, dmin */
        const uint8_t *wk = w->ks + rb * NS * 192;                    /* RB x (NS, 12, 16) */
        const int64_t pfs = (pf + 7) / 8, ffs = (ff + 7) / 8;         /* super-blocks */
        const __m512i nib = _mm512_set1_epi8(0x0F), m6 = _mm512_set1_epi8(63), m30 = _mm512_set1_epi8(0x30);
        uint8_t scm[MAXRB][2][8][16] __attribute__((aligned(64)));    /* [rb][scale, min][sub-block][row] */
        for (int64_t sb = 0; sb < NS; sb++) {
            __m512 d[MAXRB], nd[MAXRB];
#pragma GCC unroll 4
            for (int r = 0; r < RB; r++) {
                const uint8_t *kp = wk + (r * NS + sb) * 192;
                const uint16_t *kd = wd + (r * NS + sb) * 32;
                qv_q4k_prefetch(kp, kd, pfs, ffs);
                /* GGUF's get_scale_min_k4 for 16 rows x 8 sub-blocks: lines 0..3 hold the scales
                   of sub-blocks 0..3 (bits 0..5), 4..7 their mins, 8..11 the low 4 bits of
                   sub-blocks 4..7's scale (low nibble) and min (high); bits 6..7 of lines 0..3
                   (4..7) are the top 2 bits of sub-blocks 4..7's scales (mins).  Each zmm holds
                   four lines.  (ternary logic 0xF8: A | (B & C)) */
                const __m512i l0 = _mm512_loadu_si512(kp), l4 = _mm512_loadu_si512(kp + 64), l8 = _mm512_loadu_si512(kp + 128);
                _mm512_store_si512(scm[r][0][0], _mm512_and_si512(l0, m6));
                _mm512_store_si512(scm[r][1][0], _mm512_and_si512(l4, m6));
                _mm512_store_si512(scm[r][0][4], _mm512_ternarylogic_epi32(_mm512_and_si512(l8, nib), _mm512_srli_epi16(l0, 2), m30, 0xF8));
                _mm512_store_si512(scm[r][1][4], _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(l8, 4), nib),
                                                                           _mm512_srli_epi16(l4, 2), m30, 0xF8));
                d[r] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)kd));
                nd[r] = _mm512_castsi512_ps(_mm512_xor_si512(   /* -dmin */
                    _mm512_castps_si512(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kd + 16)))), _mm512_set1_epi32((int)0x80000000u)));
            }
            __asm__("" ::: "memory");  /* the groups load scm back rather than hold it in registers */
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const int64_t g = sb * 8 + j;
                const __m512 dag = _mm512_set1_ps(da[g]), sag = _mm512_set1_ps(sa[g]);
#pragma GCC unroll 4
                for (int r = 0; r < RB; r++) {
                    const uint8_t *lg = wq + (r * G + g) * 256;       /* (4, 16, 4) */
                    qv_q4_prefetch(GI_Q4_K, lg, 0, 0, g, pf, ff);
                    const __m512i is = q4_dot16(lg, qa + g * GI_GROUP);
                    const __m512 ds = _mm512_mul_ps(d[r], _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)scm[r][0][j]))));
                    const __m512 dm = _mm512_mul_ps(nd[r], _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)scm[r][1][j]))));
                    /* the contract's fold, as qtile's */
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(ds, dag), acc[r]);
                    acc[r] = _mm512_fmadd_ps(dm, sag, acc[r]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RB; r++) store_unit(w, out, ldo, m, (rb + r) * 16, acc[r]);
}

#define QV_Q4 1   /* matmul_impl.c runs qv_q4 as the GEMV of q4_0, q4_1 and q4_k */


/* q6_k GEMM: the low-half sums of activation rows [m0, m1) into scratch, pointed to by w->q6lo
   (left NULL without scratch: the tiles then compute them) */
static void q6_lowsums(const gi_qact *a, int64_t K, int64_t m0, int64_t m1, gi_weight *w) {
    const int64_t G = K / GI_GROUP;
    int32_t *lo = (int32_t *)scratch_buffer((size_t)(m1 - m0) * (size_t)G * 4);
    w->q6lo = lo;
    w->q6lo_m0 = m0;
    if (!lo) return;
    for (int64_t m = m0; m < m1; m++)
        for (int64_t g = 0; g < G; g++) lo[(m - m0) * G + g] = q6_lowsum(a->qa + m * K + g * GI_GROUP);
}


/* q4_k / q5_k: the scales of units [u0, u1), groups [g0, g1) decoded to dst (u1-u0, g1-g0, 2,
   16) float32 (d*sc, then -(dmin*mn)): what qtile reads from w->kdec in the GEMM. */
static void qk_decode(const gi_weight *w, int64_t u0, int64_t u1, int64_t g0, int64_t g1, float *dst) {
    const int64_t G = w->n_in / GI_GROUP;
    for (int64_t u = u0; u < u1; u++)
        for (int64_t g = g0; g < g1; g++, dst += 32) {
            const int64_t sb = u * (G / 8) + g / 8;
            __m512 dv, mv;
            qk_scales16(w->d + sb * 32, w->ks + sb * 192, (int)(g & 7), &dv, &mv);
            _mm512_storeu_ps(dst, dv);
            _mm512_storeu_ps(dst + 16, mv);
        }
}


/* ============================================================================ float microkernel */

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
