/* Matrix-multiply kernels, AVX2 + FMA + F16C (the avx2 variant): activation quantization, the
 * int / float microkernels qtile and ftile, which matmul_impl.c instantiates and tiles, the
 * decode GEMV of the 4-bit kinds (qv_q4) and the int GEMM of prefill (qgemm2 driven by gemm2,
 * blocked for the caches).
 * Included by matmul_impl.c only (see matmul_impl.h for the contracts and the helpers).
 */
#if !defined(GI_MATMUL_IMPL_H) || !defined(GI_VARIANT_AVX2)
#error "matmul_avx2.c is part of matmul_impl.c's avx2 variant, not a translation unit of its own"
#endif
#include <immintrin.h>

/* ============================================================================ AVX-VNNI
 * This file is compiled twice for the avx2 variant: as it is, and with -mavxvnni (the variant's
 * second matmul table, gi_matmul_ops_avx2vnni, chosen at run time where the CPU has AVX-VNNI:
 * Intel from Alder Lake, AMD Zen 5; dispatch.h).  There vpdpbusd multiplies unsigned by
 * signed bytes and adds each int32 lane's four products to it, exactly (no int16 step, no
 * saturation), where plain AVX2 needs vpmaddubsw + vpaddw and a vpmaddwd by ones to widen.
 * The 4-, 5- and 8-bit kinds' integer sums take it, and q6_k's GEMM as the avx512 one does
 * (each sub-block's sum apart, scaled in float32, exactly: qgemm2); q6_k's GEMV has its own
 * kernel there (qv_q6), without it qtile's q6_group (vpmaddubsw pair sums, which vpmaddwd
 * multiplies by the sub-block scales).  Integer sums are exact either way and the float fold
 * is the same, so both tables give the same bits. */
#if defined(__AVXVNNI__)
#define VNNI 1
#define DPBUSD(acc, u, s) _mm256_dpbusd_avx_epi32((acc), (u), (s))
#else
#define VNNI 0
#endif

/* ============================================================================ tile sizes */

#define UNIT 8           /* output rows per unit: half a row block */
#define QV_RB 4          /* GEMV: at most units per microkernel (MR = 1): 2 row blocks, as many
                            streams (matmul_q reads gemv_streams() row blocks per call) */
#define QG_RB 1
#ifndef QG_MR
#define QG_MR 4
#endif
#define FV_RB 4          /* float GEMV: units per microkernel */
#define FG_RB 2          /* float GEMM: units per microkernel */
#define FG_MR 6          /* float GEMM: activation rows per microkernel */
#define MR_Q QG2_MR      /* gi_matmul_ops.mr_q: activation rows per int GEMM tile (gemm2's) */

/* int8 peak probe (matmul_impl.c): vpmaddubsw ymm, 32 multiply-adds each */
#define PROBE_T __m256i
#define PROBE_SET1 _mm256_set1_epi32
#define PROBE_STEP(acc, a, b) _mm256_maddubs_epi16((acc), (b))
#define PROBE_LANE0 _mm256_cvtsi256_si32
#define PROBE_OPS 64
/* float32 FMA peak probe: vfmadd ymm, 8 lanes (2 operations each) */
#define FPROBE_T __m256
#define FPROBE_SET1 _mm256_set1_ps
#define FPROBE_STEP(acc, a, b) _mm256_fmadd_ps((acc), (a), (b))
#define FPROBE_LANE0 _mm256_cvtss_f32
#define F16PROBE_LOAD(p) _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(p)))
#define FPROBE_OPS 16


/* An empty asm that "modifies" v: the value must exist in a register here, so the compiler
   keeps the accumulation order written (no reassociation into trees of temporaries, which
   spill with 16 registers).  No instruction is emitted. */
#define PIN(v) __asm__("" : "+x"(v))


/* ============================================================================ activation quantization */

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


/* ============================================================================ int microkernel */

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

/* q4_k / q5_k: d*sc and -(dmin*mn) of group g (sub-block s = g % 8) for the 8 rows of a unit,
   from the super-block's d, dmin (kd: d at kd[0..7], dmin at kd[16..23], float16) and packed
   scales (kp: 12 lines of stride 16, this unit's 8 bytes each), as GGUF's get_scale_min_k4.
   Both products exact. */
GI_INLINE void qk_scales8(const uint16_t *kd, const uint8_t *kp, int s, __m256 *dv, __m256 *mv) {
    const __m128i m6 = _mm_set1_epi8(63), m4 = _mm_set1_epi8(15), m30 = _mm_set1_epi8(0x30);
    __m128i sc, mn;
    if (s < 4) {
        sc = _mm_and_si128(_mm_loadl_epi64((const __m128i *)(kp + s * 16)), m6);
        mn = _mm_and_si128(_mm_loadl_epi64((const __m128i *)(kp + (s + 4) * 16)), m6);
    } else {  /* low 4 bits from line s+4, top 2 from bits 6..7 of lines s-4 (sc) and s (mn) */
        const __m128i h = _mm_loadl_epi64((const __m128i *)(kp + (s + 4) * 16));
        sc = _mm_or_si128(_mm_and_si128(h, m4),
                          _mm_and_si128(_mm_srli_epi16(_mm_loadl_epi64((const __m128i *)(kp + (s - 4) * 16)), 2), m30));
        mn = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(h, 4), m4),
                          _mm_and_si128(_mm_srli_epi16(_mm_loadl_epi64((const __m128i *)(kp + s * 16)), 2), m30));
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)kd));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kd + 16)));
    *dv = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)));
    *mv = _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn))),
                        _mm256_set1_ps(-0.0f));  /* -(dmin*mn), as C's unary minus */
}

/* qk_scales8 for both halves of a row block at once (the GEMV's unit pairs): the byte work
   is done once for 16 rows (kd, kp: the row block's, as for half 0). */
GI_INLINE void qk_scales8x2(const uint16_t *kd, const uint8_t *kp, int s, __m256 dv[2], __m256 mv[2]) {
    const __m128i m6 = _mm_set1_epi8(63), m4 = _mm_set1_epi8(15), m30 = _mm_set1_epi8(0x30);
    __m128i sc, mn;
    if (s < 4) {
        sc = _mm_and_si128(_mm_loadu_si128((const __m128i *)(kp + s * 16)), m6);
        mn = _mm_and_si128(_mm_loadu_si128((const __m128i *)(kp + (s + 4) * 16)), m6);
    } else {
        const __m128i h = _mm_loadu_si128((const __m128i *)(kp + (s + 4) * 16));
        sc = _mm_or_si128(_mm_and_si128(h, m4),
                          _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(kp + (s - 4) * 16)), 2), m30));
        mn = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(h, 4), m4),
                          _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(kp + s * 16)), 2), m30));
    }
    const __m256 neg = _mm256_set1_ps(-0.0f);
    for (int h = 0; h < 2; h++) {
        const __m128i sch = h ? _mm_srli_si128(sc, 8) : sc, mnh = h ? _mm_srli_si128(mn, 8) : mn;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kd + 8 * h)));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kd + 16 + 8 * h)));
        dv[h] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sch)));
        mv[h] = _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mnh))), neg);
    }
}

/* q4_k / q5_k: the scales of units [u0, u1) (half row blocks), groups [g0, g1) decoded to dst
   (u1-u0, g1-g0, 2, 8) float32 (d*sc, then -(dmin*mn)): what qtile reads from w->kdec in the
   GEMM, and qgemm2 from its chunk's decoded scales. */
static void qk_decode(const gi_weight *w, int64_t u0, int64_t u1, int64_t g0, int64_t g1, float *dst) {
    const int64_t G = w->n_in / GI_GROUP;
    for (int64_t u = u0; u < u1; u++)
        for (int64_t g = g0; g < g1; g++, dst += 16) {
            const int64_t sb = (u >> 1) * (G / 8) + g / 8, h = u & 1;
            __m256 dv, mv;
            qk_scales8(w->d + sb * 32 + h * 8, w->ks + sb * 192 + h * 8, (int)(g & 7), &dv, &mv);
            _mm256_storeu_ps(dst, dv);
            _mm256_storeu_ps(dst + 8, mv);
        }
}

/* q6_k (the AVX-VNNI GEMM): the sub-block scales of units [u0, u1), groups [g0, g1) as
   float32, each unit's (g1 - g0, 2, 8) in turn: per group the 8 rows' scales of its low 16 k,
   then of its high 16 (the layout of qk_decode) */
static void q6_decode(const gi_weight *w, int64_t u0, int64_t u1, int64_t g0, int64_t g1, float *dst) {
    const int64_t G = w->n_in / GI_GROUP;
    const __m128i eo = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    for (int64_t u = u0; u < u1; u++)
        for (int64_t g = g0; g < g1; g++, dst += 16) {
            const __m128i v = _mm_shuffle_epi8(
                _mm_loadu_si128((const __m128i *)(w->sc + ((u >> 1) * G + g) * 32 + (u & 1) * 16)), eo);
            _mm256_storeu_ps(dst, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)));
            _mm256_storeu_ps(dst + 8, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v, 8))));
        }
}

/* Unit u is half (u & 1) of row block u >> 1: bytes [32*h, 32*h+32) of each 64-byte line
   (rows 8h..8h+7), and d[.., 8h..8h+7]. */
GI_INLINE void qtile(const int KIND, const int RB, const int MR, const gi_weight *w,
                     const gi_qact *a, int64_t m, int64_t u, float *out, int64_t ldo) {
    const int64_t K = w->n_in, G = K / GI_GROUP;
    const int NL = LINES(KIND), QK = IS_QK(KIND);
    const int64_t rbs = G * NL * 64;                      /* bytes per row block */
    const uint8_t *wq[MAXRB];                                /* (G, NL, [8 rows x 4]) per unit */
    const uint16_t *wd[MAXRB], *wm[MAXRB];                      /* (G, [8]) per unit; q6_k (G/8, [8]); qk (G/8, 2, [8]) */
    const uint8_t *we[MAXRB];                                   /* mxfp4: (G, [8]) per unit */
    const int8_t *ws[MAXRB];                                    /* q6_k: (G, [8 rows x 2]) per unit */
    const uint8_t *wk[MAXRB];                                   /* q4_k, q5_k: (G/8, 12, [8]) per unit */
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++) {
        int64_t rb = (u + r) >> 1, h = (u + r) & 1;
        wq[r] = (const uint8_t *)w->qs + rb * rbs + h * 32;
        wd[r] = KIND == GI_MXFP4 ? 0 : KIND == GI_Q6_K ? w->d + rb * (G / 8) * 16 + h * 8
                : QK ? w->d + rb * (G / 8) * 32 + h * 8 : w->d + rb * G * 16 + h * 8;
        wk[r] = QK ? w->ks + rb * (G / 8) * 192 + h * 8 : 0;
        ws[r] = KIND == GI_Q6_K ? w->sc + rb * G * 32 + h * 16 : 0;
        wm[r] = HAS_MIN(KIND) ? w->m + rb * G * 16 + h * 8 : 0;
        we[r] = KIND == GI_MXFP4 ? w->e + rb * G * 16 + h * 8 : 0;
    }
    const int8_t *qa = a->qa + m * K;                     /* (MR, K) */
    const float *da = a->da + m * G, *sa = a->sa + m * G; /* (MR, G) */
    const int32_t *as = a->asum + m * G;
    const int64_t pf = MR == 1 ? gemv_prefetch(KIND) : 0;     /* GEMV prefetch distances, groups */
    const int64_t ff = MR == 1 ? gemv_prefetch_far(KIND) : 0;
    const __m256i nib = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), b4 = _mm256_set1_epi8(0x10);
    /* mxfp4: code -> KV + 12 (unsigned), corrected by -12*asum */
    const __m256i lutu = _mm256_broadcastsi128_si256(_mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24,
                                                                   12, 11, 10, 9, 8, 6, 4, 0));
    __m256 acc[MAXRB][MAXMR];
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) acc[r][i] = _mm256_setzero_ps();

    for (int64_t g0 = 0; g0 < G; g0 += 16) {
        /* the integer correction of 16 groups at a time (q4_0 8*asum, q5_0 16*asum, mxfp4
           12*asum), kept in memory so that the broadcasts below are plain loads */
        const int gn = (int)(G - g0 < 16 ? G - g0 : 16);
        const int OFF = KIND == GI_MXFP4 ? 12 : CODE_OFF(KIND);
        int32_t cb[MAXMR][16];
        if (OFF)
#pragma GCC unroll 16
            for (int i = 0; i < MR; i++)
                for (int gg = 0; gg < gn; gg++) cb[i][gg] = as[i * G + g0 + gg] * OFF;
        for (int gg = 0; gg < gn; gg++) {
            const int64_t g = g0 + gg;
            __m256i is[MAXRB][MAXMR];
            const int8_t *ag = qa + g * GI_GROUP;
            /* GEMV streams the weight from memory: prefetch pf groups ahead (into L1) and ff
               (prefetcht2: the outer caches).  Units 2j and 2j+1 read the two halves of the
               same lines (GEMV calls start at an even unit), so the even ones prefetch for both. */
#pragma GCC unroll 2
            for (int far = 0; far < 2 && MR == 1; far++) {
                const int64_t d = far ? ff : pf, gp = g + d;
                if (d <= 0) continue;
#pragma GCC unroll 16
                for (int r = 0; r < RB; r += 2) {
#pragma GCC unroll 8
                    for (int c = 0; c < NL; c++) prefetch_line(wq[r] + (gp * NL + c) * 64, far);
                    if (KIND == GI_MXFP4) prefetch_line(we[r] + gp * 16, far);
                    else if (KIND == GI_Q6_K) prefetch_line(ws[r] + gp * 32, far);
                    else if (QK) prefetch_line(wk[r] + gp * 24, far);
                    else prefetch_line(wd[r] + gp * 16, far);
                    if (QK && (g & 7) == 0) prefetch_line(wd[r] + (gp >> 3) * 32, far);
                    if (HAS_MIN(KIND)) prefetch_line(wm[r] + gp * 16, far);
                }
            }
            if (KIND == GI_Q6_K) {
                q6_group(RB, MR, wq, ws, g, ag, K, as + g, G, is);
            } else if (KIND == GI_MXFP4 || IS_Q5(KIND)) {
                /* mxfp4: codes looked up as KV + 12 (0..24, unsigned) against int8 activations,
                   the -12*asum correction below; q5_k, q5_0, q5_1: the 5-bit codes (0..31).  An int16 lane of
                   one maddubs sums 2 products <= 31*127 (no saturation); the low and the high
                   halves accumulate apart over the 4 lines (each <= 4*7874 = 31496: no wrap)
                   and meet in int32. */
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
                        __m256i l = _mm256_loadu_si256((const __m256i *)(wq[r] + (g * NL + c) * 64));
                        lo[r] = _mm256_and_si256(l, nib);
                        hi[r] = _mm256_and_si256(_mm256_srli_epi16(l, 4), nib);
                        if (KIND == GI_MXFP4) {
                            lo[r] = _mm256_shuffle_epi8(lutu, lo[r]);
                            hi[r] = _mm256_shuffle_epi8(lutu, hi[r]);
                        } else {  /* q5: bit 4 is bit c (low half), 4 + c (high) of line 4 */
                            const __m256i h = _mm256_loadu_si256((const __m256i *)(wq[r] + (g * NL + 4) * 64));
                            lo[r] = _mm256_or_si256(lo[r], _mm256_and_si256(_mm256_slli_epi16(h, 4 - c), b4));
                            hi[r] = _mm256_or_si256(hi[r], _mm256_and_si256(_mm256_srli_epi16(h, c), b4));
                        }
                    }
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++) {
                        __m256i bl = _mm256_set1_epi32(load_i32(ag + i * K + c * 4));
                        __m256i bh = _mm256_set1_epi32(load_i32(ag + i * K + 16 + c * 4));
#pragma GCC unroll 16
                        for (int r = 0; r < RB; r++) {
#if VNNI
                            sl[r][i] = DPBUSD(sl[r][i], lo[r], bl);  /* int32 sums */
                            sh[r][i] = DPBUSD(sh[r][i], hi[r], bh);
#else
                            sl[r][i] = _mm256_add_epi16(sl[r][i], _mm256_maddubs_epi16(lo[r], bl));
                            sh[r][i] = _mm256_add_epi16(sh[r][i], _mm256_maddubs_epi16(hi[r], bh));
#endif
                        }
                    }
                }
#pragma GCC unroll 16
                for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++)
#if VNNI
                        is[r][i] = _mm256_add_epi32(sl[r][i], sh[r][i]);
#else
                        is[r][i] = _mm256_add_epi32(_mm256_madd_epi16(sl[r][i], ones), _mm256_madd_epi16(sh[r][i], ones));
#endif
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
#if VNNI
                            s16[r][i] = DPBUSD(DPBUSD(s16[r][i], lo[r], bl), hi[r], bh);  /* int32 */
#else
                            s16[r][i] = _mm256_add_epi16(s16[r][i], _mm256_maddubs_epi16(lo[r], bl));
                            s16[r][i] = _mm256_add_epi16(s16[r][i], _mm256_maddubs_epi16(hi[r], bh));
#endif
                        }
                    }
                }
#pragma GCC unroll 16
                for (int r = 0; r < RB; r++)
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++) is[r][i] = VNNI ? s16[r][i] : _mm256_madd_epi16(s16[r][i], ones);
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
#if VNNI
                            is[r][i] = DPBUSD(is[r][i], aq[r], _mm256_sign_epi8(b, q[r]));
#else
                            __m256i p = _mm256_maddubs_epi16(aq[r], _mm256_sign_epi8(b, q[r]));
                            is[r][i] = _mm256_add_epi32(is[r][i], _mm256_madd_epi16(p, ones));
#endif
                        }
                    }
                }
            }
            __m256 dv[MAXRB], mv[MAXRB];
#pragma GCC unroll 16
            for (int r = 0; r < RB; r++) {
                if (QK && w->kdec) {  /* the GEMM's decoded scales */
                    const float *kf = w->kdec + ((u + r - w->kdec_u0) * G + g) * 16;
                    dv[r] = _mm256_loadu_ps(kf);
                    mv[r] = _mm256_loadu_ps(kf + 8);
                    continue;
                }
                if (QK && RB % 2 == 0 && (u & 1) == 0) {  /* unit pairs = row blocks (the GEMV) */
                    if ((r & 1) == 0) qk_scales8x2(wd[r] + (g >> 3) * 32, wk[r] + (g >> 3) * 192, (int)(g & 7), &dv[r], &mv[r]);
                    continue;
                }
                if (QK) {
                    qk_scales8(wd[r] + (g >> 3) * 32, wk[r] + (g >> 3) * 192, (int)(g & 7), &dv[r], &mv[r]);
                    continue;
                }
                dv[r] = KIND == GI_MXFP4 ? e8m0_half8(we[r] + g * 16)
                        : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wd[r] + (KIND == GI_Q6_K ? g >> 3 : g) * 16)));
                if (HAS_MIN(KIND)) mv[r] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wm[r] + g * 16)));
            }
#pragma GCC unroll 16
            for (int i = 0; i < MR; i++) {
                __m256 dai = _mm256_set1_ps(da[i * G + g]);
                __m256i corr = _mm256_setzero_si256();
                if (OFF) corr = _mm256_set1_epi32(cb[i][gg]);   /* load-only broadcast */
#pragma GCC unroll 16
                for (int r = 0; r < RB; r++) {
                    __m256i s = OFF ? _mm256_sub_epi32(is[r][i], corr) : is[r][i];
                    acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dv[r], dai), acc[r][i]);
                    if (HAS_MIN(KIND) || QK)
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


/* ============================================================================ q4 GEMV (q4_0, q4_1, q4_k) */

/* The decode GEMV of the 4-bit kinds: qtile's work for RB row blocks (each read as its own
   stream) and one activation row, with the same bits, written for the stream (one pointer per
   operand and row block, no spills at RB = 1: q4_k reads 1.1-1.3x the bytes per second of qtile's
   GEMV when the weight is in cache on a Zen 4, q4_0 and q4_1 alike).  q4_k unpacks a
   super-block's 16 rows x 8 sub-blocks of 6-bit scales and mins from their 12 lines at once (a
   few 256-bit byte operations) into a small buffer and unrolls its 8 groups, so each group only
   converts its scales and mins; -(dmin*mn) is (-dmin)*mn (the product is exact).  q4_k needs
   G % 8 == 0 (K a multiple of 256, as every q4_k weight). */

/* Group lg (4 lines x 64 bytes) x qa of the group (ag): int16 pair sums of rows 0..7 (*s0) and
   8..15 (*s1), each lane <= 8 pairs of 2*15*127 (no wrap); with VNNI the rows' int32 sums.
   With VNNI the high nibbles are masked in place (16 x their value) and their sums shifted
   back once per group (exact), and the low and high nibbles add in chains of their own (4
   dependent vpdpbusd each rather than 8); vpmaddubsw's int16 pairs would saturate at 16x, so
   without VNNI each nibble is shifted down. */
GI_INLINE void q4_dot16(const uint8_t *lg, const int8_t *ag, __m256i *s0, __m256i *s1) {
    const __m256i nib = _mm256_set1_epi8(0x0F);
    __m256i l0 = _mm256_setzero_si256(), l1 = _mm256_setzero_si256();   /* rows 0..7, 8..15 */
#if VNNI
    __m256i h0 = _mm256_setzero_si256(), h1 = _mm256_setzero_si256();   /* 16 x the high nibbles' */
#endif
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(lg + c * 64));
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)(lg + c * 64 + 32));
        const __m256i bl = _mm256_set1_epi32(load_i32(ag + c * 4));
        const __m256i bh = _mm256_set1_epi32(load_i32(ag + 16 + c * 4));
#if VNNI
        l0 = DPBUSD(l0, _mm256_and_si256(x0, nib), bl);
        l1 = DPBUSD(l1, _mm256_and_si256(x1, nib), bl);
        h0 = DPBUSD(h0, _mm256_andnot_si256(nib, x0), bh);
        h1 = DPBUSD(h1, _mm256_andnot_si256(nib, x1), bh);
        PIN(h0);
        PIN(h1);
#else
        l0 = _mm256_add_epi16(l0, _mm256_maddubs_epi16(_mm256_and_si256(x0, nib), bl));
        l1 = _mm256_add_epi16(l1, _mm256_maddubs_epi16(_mm256_and_si256(x1, nib), bl));
        l0 = _mm256_add_epi16(l0, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(x0, 4), nib), bh));
        l1 = _mm256_add_epi16(l1, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(x1, 4), nib), bh));
#endif
        PIN(l0);
        PIN(l1);
    }
#if VNNI
    l0 = _mm256_add_epi32(l0, _mm256_srai_epi32(h0, 4));   /* h0, h1: multiples of 16 */
    l1 = _mm256_add_epi32(l1, _mm256_srai_epi32(h1, 4));
#endif
    *s0 = l0;
    *s1 = l1;
}

/* q4_dot16's sums of a row half as int32 */
GI_INLINE __m256i q4_widen(__m256i s) { return VNNI ? s : _mm256_madd_epi16(s, _mm256_set1_epi16(1)); }

GI_INLINE void qv_q4(const int KIND, const int RB, const gi_weight *w, const gi_qact *a, int64_t m,
                     int64_t rb, float *out, int64_t ldo) {
    const int64_t K = w->n_in, G = K / GI_GROUP, NS = G / 8;
    const uint8_t *wq = (const uint8_t *)w->qs + rb * G * 256;       /* RB x (G, 4, 16, 4) */
    const int8_t *qa = a->qa + m * K;                                 /* (K,) */
    const float *da = a->da + m * G, *sa = a->sa + m * G;             /* (G,) */
    const int32_t *as = a->asum + m * G;
    const int64_t pf = gemv_prefetch(KIND), ff = gemv_prefetch_far(KIND);   /* groups: near, far */
    __m256 acc0[MAXRB], acc1[MAXRB];                                  /* rows 0..7, 8..15 */
#pragma GCC unroll 4
    for (int r = 0; r < RB; r++) acc0[r] = acc1[r] = _mm256_setzero_ps();
    if (KIND != GI_Q4_K) {
        const uint16_t *wd = w->d + rb * G * 16;                      /* RB x (G, 16) */
        const uint16_t *wm = KIND == GI_Q4_1 ? w->m + rb * G * 16 : 0;
        for (int64_t g = 0; g < G; g++) {
            const __m256 dag = _mm256_set1_ps(da[g]);
#pragma GCC unroll 4
            for (int r = 0; r < RB; r++) {  /* row block rb + r: its own stream */
                const uint8_t *lg = wq + (r * G + g) * 256;           /* (4, 16, 4) */
                const uint16_t *wdr = wd + r * G * 16, *wmr = KIND == GI_Q4_1 ? wm + r * G * 16 : 0;
                qv_q4_prefetch(KIND, lg, wdr, wmr, g, pf, ff);
                __m256i s0, s1;
                q4_dot16(lg, qa + g * GI_GROUP, &s0, &s1);
                __m256i i0 = q4_widen(s0), i1 = q4_widen(s1);
                if (KIND == GI_Q4_0) {
                    const __m256i corr = _mm256_set1_epi32(8 * as[g]);
                    i0 = _mm256_sub_epi32(i0, corr);
                    i1 = _mm256_sub_epi32(i1, corr);
                }
                /* the contract's fold, as qtile's */
                acc0[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i0), _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wdr + g * 16))), dag), acc0[r]);
                acc1[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i1), _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wdr + g * 16 + 8))), dag), acc1[r]);
                if (KIND == GI_Q4_1) {
                    const __m256 sag = _mm256_set1_ps(sa[g]);
                    acc0[r] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wmr + g * 16))), sag, acc0[r]);
                    acc1[r] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wmr + g * 16 + 8))), sag, acc1[r]);
                }
            }
        }
    } else {
        const uint16_t *wd = w->d + rb * NS * 32;                     /* RB x (NS, 2, 16): d, dmin */
        const uint8_t *wk = w->ks + rb * NS * 192;                    /* RB x (NS, 12, 16) */
        const int64_t pfs = (pf + 7) / 8, ffs = (ff + 7) / 8;         /* super-blocks */
        const __m256i nib = _mm256_set1_epi8(0x0F), m6 = _mm256_set1_epi8(63), m30 = _mm256_set1_epi8(0x30);
        const __m256 neg = _mm256_set1_ps(-0.0f);
        uint8_t scm[MAXRB][2][8][16] __attribute__((aligned(32)));    /* [rb][scale, min][sub-block][row] */
        float dn[MAXRB][4][8] __attribute__((aligned(32)));           /* [rb][d rows 0..7, 8..15, -dmin ...] */
        for (int64_t sb = 0; sb < NS; sb++) {
#pragma GCC unroll 4
            for (int r = 0; r < RB; r++) {
                const uint8_t *kp = wk + (r * NS + sb) * 192;
                const uint16_t *kd = wd + (r * NS + sb) * 32;
                qv_q4k_prefetch(kp, kd, pfs, ffs);
                /* GGUF's get_scale_min_k4 for 16 rows x 8 sub-blocks: lines 0..3 hold the scales
                   of sub-blocks 0..3 (bits 0..5), 4..7 their mins, 8..11 the low 4 bits of
                   sub-blocks 4..7's scale (low nibble) and min (high); bits 6..7 of lines 0..3
                   (4..7) are the top 2 bits of sub-blocks 4..7's scales (mins).  Each ymm holds
                   two lines. */
                const __m256i l01 = _mm256_loadu_si256((const __m256i *)kp), l23 = _mm256_loadu_si256((const __m256i *)(kp + 32));
                const __m256i l45 = _mm256_loadu_si256((const __m256i *)(kp + 64)), l67 = _mm256_loadu_si256((const __m256i *)(kp + 96));
                const __m256i l89 = _mm256_loadu_si256((const __m256i *)(kp + 128)), lab = _mm256_loadu_si256((const __m256i *)(kp + 160));
                _mm256_store_si256((__m256i *)scm[r][0][0], _mm256_and_si256(l01, m6));
                _mm256_store_si256((__m256i *)scm[r][0][2], _mm256_and_si256(l23, m6));
                _mm256_store_si256((__m256i *)scm[r][1][0], _mm256_and_si256(l45, m6));
                _mm256_store_si256((__m256i *)scm[r][1][2], _mm256_and_si256(l67, m6));
                _mm256_store_si256((__m256i *)scm[r][0][4], _mm256_or_si256(_mm256_and_si256(l89, nib),
                                                                            _mm256_and_si256(_mm256_srli_epi16(l01, 2), m30)));
                _mm256_store_si256((__m256i *)scm[r][0][6], _mm256_or_si256(_mm256_and_si256(lab, nib),
                                                                            _mm256_and_si256(_mm256_srli_epi16(l23, 2), m30)));
                _mm256_store_si256((__m256i *)scm[r][1][4], _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l89, 4), nib),
                                                                            _mm256_and_si256(_mm256_srli_epi16(l45, 2), m30)));
                _mm256_store_si256((__m256i *)scm[r][1][6], _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lab, 4), nib),
                                                                            _mm256_and_si256(_mm256_srli_epi16(l67, 2), m30)));
                if (RB > 1) {  /* d, -dmin in memory too: more than one row block's spill */
                    _mm256_store_ps(dn[r][0], _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)kd)));
                    _mm256_store_ps(dn[r][1], _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kd + 8))));
                    _mm256_store_ps(dn[r][2], _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kd + 16))), neg));
                    _mm256_store_ps(dn[r][3], _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kd + 24))), neg));
                }
            }
            __asm__("" ::: "memory");  /* the groups load scm back (held in registers, it spills) */
            const uint16_t *kd0 = wd + sb * 32;
            const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)kd0));
            const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kd0 + 8)));
            const __m256 n0 = _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kd0 + 16))), neg);
            const __m256 n1 = _mm256_xor_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kd0 + 24))), neg);
#pragma GCC unroll 8
            for (int j = 0; j < 8; j++) {
                const int64_t g = sb * 8 + j;
                const __m256 dag = _mm256_set1_ps(da[g]), sag = _mm256_set1_ps(sa[g]);
#pragma GCC unroll 4
                for (int r = 0; r < RB; r++) {
                    const uint8_t *lg = wq + (r * G + g) * 256;       /* (4, 16, 4) */
                    qv_q4_prefetch(GI_Q4_K, lg, 0, 0, g, pf, ff);
                    __m256i s0, s1;
                    q4_dot16(lg, qa + g * GI_GROUP, &s0, &s1);
#define SCM(t, h) _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(scm[r][t][j] + 8 * (h)))))
                    const __m256 rd0 = RB > 1 ? _mm256_load_ps(dn[r][0]) : d0, rd1 = RB > 1 ? _mm256_load_ps(dn[r][1]) : d1;
                    const __m256 rn0 = RB > 1 ? _mm256_load_ps(dn[r][2]) : n0, rn1 = RB > 1 ? _mm256_load_ps(dn[r][3]) : n1;
                    const __m256 ds0 = _mm256_mul_ps(rd0, SCM(0, 0)), ds1 = _mm256_mul_ps(rd1, SCM(0, 1));
                    const __m256 dm0 = _mm256_mul_ps(rn0, SCM(1, 0)), dm1 = _mm256_mul_ps(rn1, SCM(1, 1));
#undef SCM
                    /* the contract's fold, as qtile's */
                    acc0[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_widen(s0)), _mm256_mul_ps(ds0, dag), acc0[r]);
                    acc1[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_widen(s1)), _mm256_mul_ps(ds1, dag), acc1[r]);
                    acc0[r] = _mm256_fmadd_ps(dm0, sag, acc0[r]);
                    acc1[r] = _mm256_fmadd_ps(dm1, sag, acc1[r]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RB; r++) {
        store_unit(w, out, ldo, m, (rb + r) * 16, acc0[r]);
        store_unit(w, out, ldo, m, (rb + r) * 16 + 8, acc1[r]);
    }
}

#define QV_Q4 1   /* matmul_impl.c runs qv_q4 as the GEMV of q4_0, q4_1 and q4_k */


/* ============================================================================ q6_k GEMV with AVX-VNNI (qv_q6) */

#if VNNI
/* The decode GEMV of q6_k where the CPU has AVX-VNNI (RB row blocks per call, each read as its
   own stream): qtile's q6_group sums (vpmaddubsw pairs scaled by vpmaddwd) cost ~30% more
   operations per byte.  Per group and row half, four exact
   int32 vpdpbusd sums of the codes' bit fields against the activations: L (the low sub-block:
   bits 0..5 of lines 0..3), and the high sub-block's codes in three parts, H (the low nibbles of
   line 4 + c/2 for even c), N (its high nibbles for odd c, masked in place: 16x) and T (bits
   6..7 of lines 0..3, masked in place: 64x), which meet as H + N/16 + T/4 (exact shifts).  L and
   H start at the -32 offset's -32*sum(qa) of their half of the group (ns: once per call, for
   every row block).  isum = fma(H, sc1, L*sc0) in float32, exact (|L*sc0|, |H*sc1| < 2^23,
   integers), as the GEMM forms it; then the contract's fold.  The same bits as qtile's. */
GI_INLINE void qv_q6(const int RB, const gi_weight *w, const gi_qact *a, int64_t m, int64_t rb,
                     const int32_t *ns, float *out, int64_t ldo) {
    const int64_t K = w->n_in, G = K / GI_GROUP;
    const uint8_t *wq = (const uint8_t *)w->qs + rb * G * 384;      /* RB x (G, 6, 16, 4) */
    const int8_t *ws = w->sc + rb * G * 32;                          /* RB x (G, 16 rows x 2) */
    const uint16_t *wd = w->d + rb * (G / 8) * 16;                   /* RB x (G/8, 16) */
    const int8_t *qa = a->qa + m * K;                                /* (K,) */
    const float *da = a->da + m * G;                                 /* (G,) */
    const int64_t pf = gemv_prefetch(GI_Q6_K), ff = gemv_prefetch_far(GI_Q6_K);    /* groups: near, far */
    const __m256i m3f = _mm256_set1_epi8(0x3F), mc0 = _mm256_set1_epi8((char)0xC0);
    const __m256i nlo = _mm256_set1_epi8(0x0F), nhi = _mm256_set1_epi8((char)0xF0);
    __m256 acc[MAXRB][2];                                            /* rows 0..7, 8..15 */
#pragma GCC unroll 4
    for (int r = 0; r < RB; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < G; g++) {
        const int8_t *ag = qa + g * GI_GROUP;
        const __m256 dag = _mm256_set1_ps(da[g]);
#pragma GCC unroll 4
        for (int r = 0; r < RB; r++) {  /* row block rb + r: its own stream */
            const uint8_t *lg = wq + (r * G + g) * 384;              /* (6, 16, 4) */
            const int8_t *wsr = ws + r * G * 32;
            const uint16_t *wdr = wd + r * (G / 8) * 16;
#pragma GCC unroll 2
            for (int far = 0; far < 2; far++) {
                const int64_t d = far ? ff : pf;
                if (d <= 0) continue;
#pragma GCC unroll 6
                for (int c = 0; c < 6; c++) prefetch_line(lg + d * 384 + c * 64, far);
                prefetch_line(wsr + (g + d) * 32, far);
                if ((g & 7) == 0) prefetch_line(wdr + ((g + d) >> 3) * 16, far);
            }
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256i L = _mm256_set1_epi32(ns[2 * g]), H = _mm256_set1_epi32(ns[2 * g + 1]);
                __m256i N = _mm256_setzero_si256(), T = _mm256_setzero_si256();
#pragma GCC unroll 4
                for (int c = 0; c < 4; c++) {
                    const __m256i x = _mm256_loadu_si256((const __m256i *)(lg + c * 64 + h * 32));
                    const __m256i y = _mm256_loadu_si256((const __m256i *)(lg + (4 + (c >> 1)) * 64 + h * 32));
                    const __m256i bl = _mm256_set1_epi32(load_i32(ag + c * 4));
                    const __m256i bh = _mm256_set1_epi32(load_i32(ag + 16 + c * 4));
                    L = DPBUSD(L, _mm256_and_si256(x, m3f), bl);
                    T = DPBUSD(T, _mm256_and_si256(x, mc0), bh);
                    if (c & 1) N = DPBUSD(N, _mm256_and_si256(y, nhi), bh);
                    else H = DPBUSD(H, _mm256_and_si256(y, nlo), bh);
                }
                H = _mm256_add_epi32(H, _mm256_add_epi32(_mm256_srai_epi32(N, 4), _mm256_srai_epi32(T, 2)));
                const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wsr + g * 32 + h * 16)));
                const __m256 s0 = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 16), 16));
                const __m256 s1 = _mm256_cvtepi32_ps(_mm256_srai_epi32(v, 16));
                const __m256 isf = _mm256_fmadd_ps(_mm256_cvtepi32_ps(H), s1, _mm256_mul_ps(_mm256_cvtepi32_ps(L), s0));
                const __m256 dv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wdr + (g >> 3) * 16 + h * 8)));
                /* the contract's fold, as qtile's */
                acc[r][h] = _mm256_fmadd_ps(isf, _mm256_mul_ps(dv, dag), acc[r][h]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RB; r++) {
        store_unit(w, out, ldo, m, (rb + r) * 16, acc[r][0]);
        store_unit(w, out, ldo, m, (rb + r) * 16 + 8, acc[r][1]);
    }
}

/* ns (2G,): -32 x the sums of qa[0..15] and qa[16..31] of each group of activation row m */
static void q6_offsets(const gi_qact *a, int64_t K, int64_t m, int32_t *ns) {
    const int64_t G = K / GI_GROUP;
    const int8_t *qa = a->qa + m * K;
    for (int64_t g = 0; g < G; g++) {
        const int32_t p = q6_negsums(qa + g * GI_GROUP, a->asum[m * G + g]);   /* (-lo, -hi) int16 */
        ns[2 * g] = 32 * (int32_t)(int16_t)(p & 0xFFFF);
        ns[2 * g + 1] = 32 * (int32_t)(int16_t)((uint32_t)p >> 16);
    }
}

#define QV_Q6 1   /* matmul_impl.c runs qv_q6 as the GEMV of q6_k */
#endif


/* ============================================================================ float microkernel */

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


/* ============================================================================ int GEMM of prefill (qgemm2, gemm2)
 *
 * The prefill of every int kind but mxfp4 (qgemm2, driven by gemm2 below): one row block (16 output rows,
 * two ymm halves) x MR activation rows over one block of groups [g0, g1).  The operands are
 * prepared once and reused:
 *   - the activation rows of a tile are packed into a panel, group by group (pack_panel: the
 *     MR rows' 32 qa bytes, then their offset sums, da and sa), read by every row block of a chunk,
 *     so the kernel walks one pointer with constant offsets;
 *   - with at least UNP_MIN_TILES activation tiles, 4-, 5- and 6-bit codes are unpacked once per chunk and
 *     K block (unpack_codes: one code per byte), read by every tile, so the kernel does no
 *     unpacking (fewer tiles unpack in registers, UNP = 0; q8_0 is read as it is).
 * The int16 pair sums of the 2 x MR output vectors stay in registers for one group; the float
 * accumulators live in a small buffer in L1 (one load + fma + store per output vector and
 * group), so the 16 ymm registers go to the integer work: each weight vector is multiplied by
 * MR broadcast activations, each broadcast by 2 weight vectors.  Per 8 outputs and group: 8
 * vpmaddubsw + 8 vpaddw (q4), 8 maddubs + 4 x (add, madd, add) (q5, q6_k: by pairs of lines)
 * or 8 x (sign, maddubs, madd, add) (q8), then the contract's fold: madd (int16 pairs ->
 * int32), [q4_0, q5_0: - 8*asum, 16*asum], cvt (or a subtraction: FOLD_BIAS), d*da, fma
 * [q4_1, q5_1, k-quants: fma(mn, sa)], the same float sequence as qtile's in group order, so
 * the bits are the same (GEMM == GEMV, any tiling, any K blocking: a K block continues the
 * accumulators the previous one stored).
 *
 * Bounds (vpmaddubsw saturates an int16 pair sum, vpaddw wraps): q4: a pair is at most
 * 2*15*127 = 3810 and a lane sums 8 pairs (k and k+16 of 4 lines), <= 30480 < 32767;
 * q5 (q6_k): 2*31*127 = 7874 (2*63*127 = 16002) and a lane sums 2 (1) pairs before widening;
 * q8 (sign trick |q| x qa*sign(q)): a pair is at most 2*128*127 = 32512, widened at once.
 */
#ifndef QG2_MR
#define QG2_MR 4         /* AVX2 GEMM: activation rows per microkernel */
#endif
#ifndef KB_GROUPS
#define KB_GROUPS 64     /* AVX2 GEMM: groups per K block (panel 12 KB, unpacked row block 32 KB) */
#endif

/* Panel bytes per group for mr rows: qa (mr, 32) int8, cb (mr,) int32 (q4_0: 8*asum; q5_0:
   16*asum; q6_k: q6_negsums; a BIASED kind: FOLD_BIAS minus that; q6_k with AVX-VNNI: its low
   sub-block's start FOLD_BIAS - 32*lo), da (mr,), sa (mr,) f32, then (q6_k with AVX-VNNI) the
   high sub-block's start (mr,) int32 */
#define PANEL_STRIDE(mr) ((mr) * 48)

/* FOLD_BIAS (matmul_impl.h) for the kinds whose int32 sums start from a value anyway (every
   kind with AVX-VNNI, q5 by vpmaddwd without): they start at FOLD_BIAS - cb, and with AVX-VNNI
   q6_k's sub-block sums (H below) at FOLD_BIAS.  Measured on Emerald Rapids with AVX-VNNI, 1B
   shapes, M = 512, one thread: q4_0 1.07-1.10x, q4_k 1.01-1.07x, q8_0 1.00x. */
#define BIASED(kind) ((VNNI && (kind) != GI_Q6_K) || IS_Q5(kind))

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
            int32_t cb = kind == GI_Q6_K ? q6_negsums(qa + g * GI_GROUP, as[g]) : CODE_OFF(kind) * as[g];
            if (BIASED(kind)) cb = FOLD_BIAS - cb;
            if (VNNI && kind == GI_Q6_K) {  /* the two sub-blocks' starts (q6_negsums: -lo, -hi) */
                const int32_t c1 = FOLD_BIAS + 32 * (int32_t)(int16_t)((uint32_t)cb >> 16);
                cb = FOLD_BIAS + 32 * (int32_t)(int16_t)(uint32_t)cb;
                memcpy(p + mr * 44 + i * 4, &c1, 4);
            }
            memcpy(p + mr * 32 + i * 4, &cb, 4);
            memcpy(p + mr * 36 + i * 4, da + g, 4);
            memcpy(p + mr * 40 + i * 4, sa + g, 4);
        }
    }
}

/* A row block of codes unpacked by unpack_codes: per group and line c, 64 bytes of the codes of
   k = 4c+j (16 rows x 4 k), then 64 bytes of k = 16+4c+j, one code per byte: (groups, 4, 2, 16, 4). */
#define UNP_GROUP_BYTES 512

/* q6_k lines c of group g (64 bytes at x, the 2 nibble lines at y) -> codes of k = 4c+j
   (lo) and k = 16+4c+j (hi), one per byte, for the 32 bytes at offset h*32 (rows 8h..8h+7). */
GI_INLINE void q6_unpack_line(const uint8_t *lg, int c, int h, __m256i *lo, __m256i *hi) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)(lg + c * 64 + h * 32));
    const __m256i y = _mm256_loadu_si256((const __m256i *)(lg + (4 + (c >> 1)) * 64 + h * 32));
    *lo = _mm256_and_si256(x, _mm256_set1_epi8(0x3F));
    *hi = _mm256_or_si256(_mm256_and_si256(c & 1 ? _mm256_srli_epi16(y, 4) : y, _mm256_set1_epi8(0x0F)),
                          _mm256_and_si256(_mm256_srli_epi16(x, 2), _mm256_set1_epi8(0x30)));
}

/* q5 (q5_0, q5_1, q5_k) likewise: the nibbles of line c, bit 4 from line 4 (bit c for k = 4c+j,
   bit 4+c for 16+4c+j; epi16 shifts: the mask drops what crosses bytes), codes 0..31. */
GI_INLINE void q5_unpack_line(const uint8_t *lg, int c, int h, __m256i *lo, __m256i *hi) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)(lg + c * 64 + h * 32));
    const __m256i y = _mm256_loadu_si256((const __m256i *)(lg + 4 * 64 + h * 32));
    const __m256i nib = _mm256_set1_epi8(0x0F), b4 = _mm256_set1_epi8(0x10);
    *lo = _mm256_or_si256(_mm256_and_si256(x, nib), _mm256_and_si256(_mm256_slli_epi16(y, 4 - c), b4));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(x, 4), nib), _mm256_and_si256(_mm256_srli_epi16(y, c), b4));
}

/* q4 (q4_0, q4_1, q4_k) likewise: the nibbles of line c, codes 0..15. */
GI_INLINE void q4_unpack_line(const uint8_t *lg, int c, int h, __m256i *lo, __m256i *hi) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)(lg + c * 64 + h * 32));
    const __m256i nib = _mm256_set1_epi8(0x0F);
    *lo = _mm256_and_si256(x, nib);
    *hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), nib);
}

/* Row blocks [rb0, rb1), groups [g0, g1) of a q4, q5 or q6_k weight -> dst, row block after row
   block, in the layout of UNP_GROUP_BYTES. */
static void unpack_codes(const gi_weight *w, int64_t rb0, int64_t rb1, int64_t g0, int64_t g1, uint8_t *dst) {
    const int kind = w->kind;                       /* (read once: the byte stores may alias w) */
    const int64_t G = w->n_in / GI_GROUP, gb = LINES(kind) * 64;       /* bytes per group */
    for (int64_t rb = rb0; rb < rb1; rb++) {
        const uint8_t *src = (const uint8_t *)w->qs + (rb * G + g0) * gb;
        for (int64_t g = 0; g < g1 - g0; g++)
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++, dst += 128)
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    __m256i lo, hi;
                    if (kind == GI_Q6_K) q6_unpack_line(src + g * gb, c, h, &lo, &hi);
                    else if (IS_Q5(kind)) q5_unpack_line(src + g * gb, c, h, &lo, &hi);
                    else q4_unpack_line(src + g * gb, c, h, &lo, &hi);
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
                      const float *ksd, const uint8_t *panel, int64_t m, int64_t rb, int64_t g0, int64_t g1,
                      float *out, int64_t ldo) {
    const int64_t G = w->n_in / GI_GROUP;
    const int NL = LINES(KIND);
    const uint8_t *wq = (const uint8_t *)w->qs + (rb * G + g0) * NL * 64;     /* (groups, NL, 16, 4) */
    const uint16_t *wd = KIND == GI_Q6_K ? w->d + (rb * (G / 8) + g0 / 8) * 16   /* q6_k: (groups/8, 16) */
                         : IS_QK(KIND) ? 0 : w->d + (rb * G + g0) * 16;          /* (groups, 16) */
    const uint16_t *wm = HAS_MIN(KIND) ? w->m + (rb * G + g0) * 16 : 0;
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
        __m256i s[2][MAXMR];                     /* q4: int16 pair sums; q8, q5, q6_k: int32 sums */
        if (KIND == GI_Q6_K || IS_Q5(KIND)) {
            /* q6_k as q6_group: the codes (unpacked, or unpacked here) x qa by vpmaddubsw, two
               lines of one sub-block added in int16, vpmaddwd by the rows' sub-block scales;
               the sums start at the -32 offset's correction (cb: the panel's q6_negsums).
               q5: the same with scales of 1, from 0 (a pair is at most 2*31*127, so 8 pairs
               would overflow int16; two lines add to <= 15748).  With VNNI both sum by vpdpbusd
               in int32 (sv unused), q6_k per sub-block as below */
            const uint8_t *ug = uq + g * UNP_GROUP_BYTES, *lg = wq + g * NL * 64;
            const __m256i plo = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13));
            const __m256i phi = _mm256_broadcastsi128_si256(_mm_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15));
            __m256i sv[2][2];                                                   /* [half][lo/hi sub-block] */
            /* q6_k with VNNI (as the avx512 GEMM): per sub-block, H = the exact int32 vpdpbusd
               of the codes started at -32 x the sub-block's activation sum, so |H| <= 16*32*127
               < 2^16 (started at FOLD_BIAS, the panel's starts, read as a float less
               1.5*2^23); then isum = fma(H1, sc1, H0*sc0) in float32, exact (every partial
               result an integer below 2^24): scf the rows' scales as floats (q6_decode's, per
               chunk), hf H0*sc0 meanwhile */
            float hf[2][MAXMR][8] __attribute__((aligned(32)));
#pragma GCC unroll 2
            for (int r = 0; r < 2; r++) {
                if (VNNI && KIND == GI_Q6_K) continue;  /* its sums start per sub-block, below */
                if (KIND == GI_Q6_K) {
                    const int8_t *sg = w->sc + (rb * G + g0 + g) * 32;            /* (16, 2) */
                    const __m256i v = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(sg + r * 16)));
                    sv[r][0] = _mm256_shuffle_epi8(v, plo);
                    sv[r][1] = _mm256_shuffle_epi8(v, phi);
                    const __m256i v32 = _mm256_slli_epi16(v, 5);
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++) s[r][i] = _mm256_madd_epi16(v32, _mm256_set1_epi32(cb[i]));
                } else {
                    sv[r][0] = sv[r][1] = ones;
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++) s[r][i] = _mm256_set1_epi32(cb[i]);   /* BIASED */
                }
            }
#pragma GCC unroll 2
            for (int hi = 0; hi < 2; hi++) {
                if (VNNI && KIND == GI_Q6_K)  /* H of sub-block hi starts at -32 x its activation sum */
#pragma GCC unroll 16
                    for (int i = 0; i < MR; i++) {
                        const __m256i h0 = _mm256_set1_epi32((hi ? (const int32_t *)(pg + MR * 44) : cb)[i]);
#pragma GCC unroll 2
                        for (int r = 0; r < 2; r++) s[r][i] = h0;
                    }
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
                            if (KIND == GI_Q6_K) {
                                q6_unpack_line(lg, 2 * cp, r, &l0, &h0);
                                q6_unpack_line(lg, 2 * cp + 1, r, &l1, &h1);
                            } else {
                                q5_unpack_line(lg, 2 * cp, r, &l0, &h0);
                                q5_unpack_line(lg, 2 * cp + 1, r, &l1, &h1);
                            }
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
#if VNNI
                            s[r][i] = DPBUSD(DPBUSD(s[r][i], we[r], be), wo[r], bo);  /* q5: scales of 1 */
#else
                            const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(we[r], be), _mm256_maddubs_epi16(wo[r], bo));
                            s[r][i] = _mm256_add_epi32(s[r][i], _mm256_madd_epi16(p, sv[r][hi]));
#endif
                            PIN(s[r][i]);
                        }
                    }
                }
                if (VNNI && KIND == GI_Q6_K)  /* hf = H0*sc0, then s = the float isum's bits */
#pragma GCC unroll 2
                    for (int r = 0; r < 2; r++) {
                        const float *scf = ksd + (r * (g1 - g0) + g) * 16;        /* (2, 8) */
#pragma GCC unroll 16
                        for (int i = 0; i < MR; i++) {
                            const __m256 h = _mm256_sub_ps(_mm256_castsi256_ps(s[r][i]), _mm256_set1_ps(FOLD_BIAS_F));
                            if (hi == 0)
                                _mm256_store_ps(hf[r][i], _mm256_mul_ps(h, _mm256_loadu_ps(scf)));
                            else
                                s[r][i] = _mm256_castps_si256(_mm256_fmadd_ps(h, _mm256_loadu_ps(scf + 8),
                                                                              _mm256_load_ps(hf[r][i])));
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
#if VNNI
                        const __m256i z = _mm256_set1_epi32(cb[i]);  /* int32 sums, BIASED */
                        s[0][i] = DPBUSD(c + hi == 0 ? z : s[0][i], v0, b);
                        s[1][i] = DPBUSD(c + hi == 0 ? z : s[1][i], v1, b);
#else
                        const __m256i p0 = _mm256_maddubs_epi16(v0, b), p1 = _mm256_maddubs_epi16(v1, b);
                        s[0][i] = c + hi == 0 ? p0 : _mm256_add_epi16(s[0][i], p0);
                        s[1][i] = c + hi == 0 ? p1 : _mm256_add_epi16(s[1][i], p1);
#endif
                        PIN(s[0][i]);
                        PIN(s[1][i]);
                    }
                }
            }
#if !VNNI
#pragma GCC unroll 2
            for (int r = 0; r < 2; r++)
#pragma GCC unroll 16
                for (int i = 0; i < MR; i++) s[r][i] = _mm256_madd_epi16(s[r][i], ones);
#endif
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
#if VNNI
                        s[r][i] = DPBUSD(c == 0 ? _mm256_set1_epi32(cb[i]) : s[r][i], aq[r], _mm256_sign_epi8(b, q[r]));  /* BIASED */
#else
                        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aq[r], _mm256_sign_epi8(b, q[r])), ones);
                        s[r][i] = c == 0 ? p : _mm256_add_epi32(s[r][i], p);
#endif
                        PIN(s[r][i]);
                    }
                }
            }
        }
        /* ---- fold: the contract's fmaf sequence */
#pragma GCC unroll 2
        for (int r = 0; r < 2; r++) {
            __m256 dv, mv = _mm256_setzero_ps();
            if (IS_QK(KIND)) {  /* decoded by gemm2: (2 halves, g1-g0, 2, 8) */
                const float *kf = ksd + (r * (g1 - g0) + g) * 16;
                dv = _mm256_load_ps(kf);
                mv = _mm256_load_ps(kf + 8);
            } else {
                dv = _mm256_cvtph_ps(_mm_loadu_si128(
                    (const __m128i *)(wd + (KIND == GI_Q6_K ? ((g0 + g) >> 3) - (g0 >> 3) : g) * 16 + r * 8)));
            }
            if (HAS_MIN(KIND)) mv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wm + g * 16 + r * 8)));
#pragma GCC unroll 16
            for (int i = 0; i < MR; i++) {
                __m256i t = s[r][i];
                if (CODE_OFF(KIND) && !BIASED(KIND)) t = _mm256_sub_epi32(t, _mm256_set1_epi32(cb[i]));
                /* (float)isum; q6_k with VNNI: isum is already a float (above) */
                const __m256 fi = BIASED(KIND) ? _mm256_sub_ps(_mm256_castsi256_ps(t), _mm256_set1_ps(FOLD_BIAS_F))
                                  : VNNI && KIND == GI_Q6_K ? _mm256_castsi256_ps(t) : _mm256_cvtepi32_ps(t);
                __m256 acc = _mm256_fmadd_ps(fi, _mm256_mul_ps(dv, _mm256_set1_ps(da[i])), _mm256_load_ps(accm[r][i]));
                if (HAS_MIN(KIND) || IS_QK(KIND)) acc = _mm256_fmadd_ps(mv, _mm256_set1_ps(sa[i]), acc);
                _mm256_store_ps(accm[r][i], acc);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < 2; r++)
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) store_unit(w, out, ldo, m + i, rb * 16 + r * 8, _mm256_load_ps(accm[r][i]));
}

/* q2_K_MR: the AVX2 GEMM microkernel (qgemm2) of kind K over MR activation rows */
typedef void (*q2_fn)(const gi_weight *, const uint8_t *, const float *, const uint8_t *, int64_t, int64_t,
                      int64_t, int64_t, float *, int64_t);
#define Q2_DEF(K, UNP, MR) static void q2_##K##_##UNP##_##MR(const gi_weight *w, const uint8_t *uq, \
    const float *ksd, const uint8_t *p, int64_t m, int64_t rb, int64_t g0, int64_t g1, float *o, int64_t ldo) { \
    qgemm2(K, MR, UNP, w, uq, ksd, p, m, rb, g0, g1, o, ldo); }
#define Q2_PTR(K, UNP, MR) q2_##K##_##UNP##_##MR,
SEQ(QG2_MR)(Q2_DEF, GI_Q4_0, 1) SEQ(QG2_MR)(Q2_DEF, GI_Q4_1, 1) SEQ(QG2_MR)(Q2_DEF, GI_Q6_K, 1)
SEQ(QG2_MR)(Q2_DEF, GI_Q4_K, 1)
SEQ(QG2_MR)(Q2_DEF, GI_Q4_0, 0) SEQ(QG2_MR)(Q2_DEF, GI_Q4_1, 0) SEQ(QG2_MR)(Q2_DEF, GI_Q8_0, 0)
SEQ(QG2_MR)(Q2_DEF, GI_Q6_K, 0) SEQ(QG2_MR)(Q2_DEF, GI_Q4_K, 0)
SEQ(QG2_MR)(Q2_DEF, GI_Q5_0, 1) SEQ(QG2_MR)(Q2_DEF, GI_Q5_1, 1) SEQ(QG2_MR)(Q2_DEF, GI_Q5_K, 1)
SEQ(QG2_MR)(Q2_DEF, GI_Q5_0, 0) SEQ(QG2_MR)(Q2_DEF, GI_Q5_1, 0) SEQ(QG2_MR)(Q2_DEF, GI_Q5_K, 0)
#if QG2_MR > MAXMR
#error "QG2_MR exceeds the register array bounds"
#endif
/* [unpacked][kind][rows - 1] */
static const q2_fn q2_tab[2][GI_Q5_1 + 1][QG2_MR] = {
    {[GI_Q4_0] = {SEQ(QG2_MR)(Q2_PTR, GI_Q4_0, 0)}, [GI_Q4_1] = {SEQ(QG2_MR)(Q2_PTR, GI_Q4_1, 0)},
     [GI_Q8_0] = {SEQ(QG2_MR)(Q2_PTR, GI_Q8_0, 0)}, [GI_Q6_K] = {SEQ(QG2_MR)(Q2_PTR, GI_Q6_K, 0)},
     [GI_Q4_K] = {SEQ(QG2_MR)(Q2_PTR, GI_Q4_K, 0)}, [GI_Q5_K] = {SEQ(QG2_MR)(Q2_PTR, GI_Q5_K, 0)},
     [GI_Q5_0] = {SEQ(QG2_MR)(Q2_PTR, GI_Q5_0, 0)}, [GI_Q5_1] = {SEQ(QG2_MR)(Q2_PTR, GI_Q5_1, 0)}},
    {[GI_Q4_0] = {SEQ(QG2_MR)(Q2_PTR, GI_Q4_0, 1)}, [GI_Q4_1] = {SEQ(QG2_MR)(Q2_PTR, GI_Q4_1, 1)},
     [GI_Q6_K] = {SEQ(QG2_MR)(Q2_PTR, GI_Q6_K, 1)}, [GI_Q4_K] = {SEQ(QG2_MR)(Q2_PTR, GI_Q4_K, 1)},
     [GI_Q5_K] = {SEQ(QG2_MR)(Q2_PTR, GI_Q5_K, 1)}, [GI_Q5_0] = {SEQ(QG2_MR)(Q2_PTR, GI_Q5_0, 1)},
     [GI_Q5_1] = {SEQ(QG2_MR)(Q2_PTR, GI_Q5_1, 1)}}};

#ifndef UNP_MIN_TILES
#define UNP_MIN_TILES 8            /* AVX2 q4 GEMM: unpack when at least this many tiles reuse it */
#endif
#ifndef UNP_CHUNK
#define UNP_CHUNK (512 * 1024)     /* AVX2 q4 GEMM: unpacked weight bytes per chunk (in L2) */
#endif

/* The int GEMM of AVX2 (every int kind but mxfp4), blocked for the caches:
     for each chunk of row blocks (~UNP_CHUNK unpacked bytes per K block, in L2):
       for each K block of KB_GROUPS groups:
         unpack the chunk's codes of the block once (not q8_0's)
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
    const size_t uq_bytes = unp ? (size_t)chunk * kb * UNP_GROUP_BYTES : 0;
    const int dec = IS_QK(kind) || (VNNI && kind == GI_Q6_K);            /* scales decoded per chunk */
    const size_t ksd_bytes = dec ? (size_t)chunk * kb * 128 : 0;   /* (chunk, 2, kb, 2, 8) float */
    uint8_t *panel = scratch_buffer(panel_bytes + uq_bytes + ksd_bytes);
    if (!panel) return 0;
    uint8_t *uq = panel + panel_bytes;
    float *ksd = (float *)(uq + uq_bytes);
    for (int64_t c0 = rb0; c0 < rb1; c0 += chunk) {
        const int64_t c1 = min64(c0 + chunk, rb1);
        for (int64_t g0 = 0; g0 < G; g0 += kb) {
            const int64_t g1 = min64(g0 + kb, G);
            if (unp) unpack_codes(w, c0, c1, g0, g1, uq);
            if (IS_QK(kind)) qk_decode(w, 2 * c0, 2 * c1, g0, g1, ksd);
            if (VNNI && kind == GI_Q6_K) q6_decode(w, 2 * c0, 2 * c1, g0, g1, ksd);
            for (int64_t t = 0; t < nt; t++) {
                const int64_t ma = m0 + t * M / nt, mr = m0 + (t + 1) * M / nt - ma;
                pack_panel(a, kind, ma, (int)mr, g0, g1, panel);
                for (int64_t rb = c0; rb < c1; rb++)
                    q2_tab[unp][kind][mr - 1](w, uq + (rb - c0) * (g1 - g0) * UNP_GROUP_BYTES,
                                              ksd + (rb - c0) * (g1 - g0) * 32, panel, ma, rb, g0, g1, out, ldo);
            }
        }
    }
    return 1;
}
