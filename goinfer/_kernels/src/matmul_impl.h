/* Matrix-multiply kernels: what every ISA file shares (matmul_impl.c, the per-variant
 * translation unit, includes this header, then the one ISA file of the variant it compiles:
 * matmul_avx512.c, matmul_avx2.c or matmul_portable.c).
 *
 * Contracts (docs/design/kernels.md), per output element (m, n):
 *   int kinds:   acc = 0; for g in order: isum = exact int32 dot of group g's codes (minus 8*asum
 *                for q4_0, 16*asum for q5_0); acc = fmaf((float)isum, d[n,g]*da[m,g], acc);
 *                q4_1 and q5_1 also acc = fmaf(mn[n,g], sa[m,g], acc).  mxfp4: the group's int values are
 *                KV[code] (twice the e2m1 values, -12..12) and d = 2^(e-128) exactly.
 *                q6_k: isum = sum_k sc[n,k/16]*(q-32)*qa, exact int32; the fold's d is the
 *                super-block's d[n,g/8]
 *   q4_k, q5_k:  isum = exact int32 dot of group g's codes (0..15 / 0..31) with qa;
 *                ds = d[n,g/8]*(float)sc[n,g], dm = dmin[n,g/8]*(float)mn[n,g] (both exact);
 *                acc = fmaf((float)isum, ds*da[m,g], acc); acc = fmaf(-dm, sa[m,g], acc)
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
 *   q4_k   qs as q4 (codes 0..15), d (n_rb, G/8, 2, 16) float16: d, dmin per 256 k;
 *          ks (n_rb, G/8, 12, 16) uint8: byte i of GGUF's packed 6-bit scales/mins of row r
 *   q5_k   qs (n_rb, G, 5, 16, 4): lines 0..3 as q4 (bits 0..3), line 4 byte (r, j): bit c is
 *          bit 4 of the code of k = 4c+j, bit 4+c of k = 16+4c+j; d, ks as q4_k
 *   q5_0, q5_1  qs as q5_k (codes 0..31), d [, m] as q4_0 [, q4_1]
 *   d, m   (n_rb, G, 16) float16
 *   float  (n_rb, K, 16)
 */
#ifndef GI_MATMUL_IMPL_H
#define GI_MATMUL_IMPL_H
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "matmul.h"

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

/* The GEMV's software prefetch distances in groups (dispatch.h) for a weight kind, read once
   per microkernel call: near (prefetcht0) and far (prefetcht2) */
#if defined(GI_VARIANT_AVX512)
#define GI_THIS_VARIANT GI_AVX512
#else
#define GI_THIS_VARIANT GI_AVX2
#endif
GI_INLINE int64_t gemv_prefetch(int kind) { return gi_gemv_prefetch_for(GI_PF_NEAR, GI_THIS_VARIANT, kind); }
GI_INLINE int64_t gemv_prefetch_far(int kind) { return gi_gemv_prefetch_for(GI_PF_FAR, GI_THIS_VARIANT, kind); }
/* ... and the row blocks it reads per call (each its own stream) */
GI_INLINE int64_t gemv_streams(void) { return gi_gemv_streams_for(GI_THIS_VARIANT); }
#if !defined(GI_VARIANT_PORTABLE)
#include <xmmintrin.h>
/* One software prefetch of the line at p: far (a constant where it is inlined): prefetcht2
   (the outer caches, not L1), else prefetcht0 (into L1).  Never faults, so a distance past a weight's end is harmless. */
GI_INLINE void prefetch_line(const void *p, const int far) {
    if (far) _mm_prefetch((const char *)p, _MM_HINT_T2);
    else _mm_prefetch((const char *)p, _MM_HINT_T0);
}

/* The q4 GEMV's (qv_q4) prefetches, near (pf) and far (ff) groups ahead: of group g's 4 lines
   at lg and, for q4_0 / q4_1, its scales (wd) and mins (wm: q4_1) */
GI_INLINE void qv_q4_prefetch(const int KIND, const uint8_t *lg, const uint16_t *wd, const uint16_t *wm,
                              int64_t g, int64_t pf, int64_t ff) {
#pragma GCC unroll 2
    for (int far = 0; far < 2; far++) {
        const int64_t d = far ? ff : pf;
        if (d <= 0) continue;
        for (int c = 0; c < 4; c++) prefetch_line(lg + d * 256 + c * 64, far);
        if (KIND == GI_Q4_K) continue;  /* its scales: qv_q4k_prefetch, once per super-block */
        prefetch_line(wd + (g + d) * 16, far);
        if (KIND == GI_Q4_1) prefetch_line(wm + (g + d) * 16, far);
    }
}

/* ... and q4_k's packed scales (kp: 192 bytes) and d, dmin (kd) of super-block sb, pfs and ffs
   super-blocks ahead */
GI_INLINE void qv_q4k_prefetch(const uint8_t *kp, const uint16_t *kd, int64_t pfs, int64_t ffs) {
#pragma GCC unroll 2
    for (int far = 0; far < 2; far++) {
        const int64_t ds = far ? ffs : pfs;
        if (ds <= 0) continue;
        for (int c = 0; c < 3; c++) prefetch_line(kp + ds * 192 + c * 64, far);
        prefetch_line(kd + ds * 32, far);
    }
}
#endif

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
#define IS_Q5(kind) ((kind) == GI_Q5_K || (kind) == GI_Q5_0 || (kind) == GI_Q5_1)  /* 5-bit codes */
#define LINES(kind) ((kind) == GI_Q8_0 ? 8 : (kind) == GI_Q6_K ? 6 : IS_Q5(kind) ? 5 : 4)
#define SCALE_BYTES(kind) ((kind) == GI_MXFP4 ? 16 : HAS_MIN(kind) ? 64 : (kind) == GI_Q6_K ? 36 : 32)
#define IS_QK(kind) ((kind) == GI_Q4_K || (kind) == GI_Q5_K)  /* d*sc*q - dmin*mn kinds */
#define HAS_MIN(kind) ((kind) == GI_Q4_1 || (kind) == GI_Q5_1)  /* d*q + m kinds: a float16 m per group */
/* the code offset folded in as -OFF*asum: q4_0 8, q5_0 16 (q8_0's 128 and mxfp4's 12 belong to
   the AVX-512 / AVX2 kernels' unsigned operands, not to the contract) */
#define CODE_OFF(kind) ((kind) == GI_Q4_0 ? 8 : (kind) == GI_Q5_0 ? 16 : 0)

/* The int32 -> float32 of the fold without vcvtdq2ps, which on Intel cores shares ports 0 and 1
   (0 and 5 for 512 bits) with every vpdpbusd and FMA: an int32 group sum started at FOLD_BIAS
   instead of 0 reads as the float 1.5*2^23 + isum exactly (the binade [2^23, 2^24) steps by 1,
   and every kind's |isum| <= 32*128*127 < 2^22), so subtracting FOLD_BIAS_F (an adder: ports
   1 and 5 from Golden Cove) gives the float the conversion would, bit for bit. */
#define FOLD_BIAS 0x4B400000
#define FOLD_BIAS_F 12582912.0f

/* q4_k / q5_k: 6-bit scale and min of sub-block s (0..7) of row r, from the super-block's 12
   lines ks (12, 16) (GGUF's get_scale_min_k4, one row) */
GI_INLINE void qk_scale_min(const uint8_t *ks, int r, int s, int *sc, int *mn) {
    if (s < 4) {
        *sc = ks[s * 16 + r] & 63;
        *mn = ks[(s + 4) * 16 + r] & 63;
    } else {
        const int h = ks[(s + 4) * 16 + r];
        *sc = (h & 15) | (ks[(s - 4) * 16 + r] >> 6) << 4;
        *mn = (h >> 4) | (ks[s * 16 + r] >> 6) << 4;
    }
}

/* q4 / q4_k / q5_k / q5_0 / q5_1: code k (0..31) of row r in a group's lines lg (plain C:
   portable, get_rows) */
GI_INLINE int qk_code(const int kind, const uint8_t *lg, int r, int k) {
    const int c = (k >> 2) & 3, j = k & 3, b = lg[c * 64 + r * 4 + j];
    int q = k < 16 ? b & 15 : b >> 4;
    if (IS_Q5(kind)) q |= (lg[4 * 64 + r * 4 + j] >> (c + (k < 16 ? 0 : 4)) & 1) << 4;
    return q;
}

/* q6_k: code k (0..31) of row r in a group's 6 lines lg (plain C: portable, get_rows) */
GI_INLINE int q6_code(const uint8_t *lg, int r, int k) {
    const int c = (k >> 2) & 3, j = k & 3, x = lg[c * 64 + r * 4 + j];
    if (k < 16) return x & 63;
    return (lg[(4 + (c >> 1)) * 64 + r * 4 + j] >> (4 * (c & 1)) & 15) | (x >> 6) << 4;
}

/* Each thread's scratch (AVX2 GEMM: an activation panel, then the unpacked q4 weights of a
   chunk; q4_k / q5_k GEMM: a chunk's decoded scales; AVX-512 q6_k GEMM: an activation block's
   low-half sums, ACT_CHUNK / 8 bytes), grown as needed and kept for the thread's life: at most
   ~660 KB. */
static __thread uint8_t *t_scratch;
static __thread size_t t_scratch_cap;

static inline uint8_t *scratch_buffer(size_t n) {
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
/* Columns of row block/unit starting at row n0 that exist in the output (<= 0: none). */
GI_INLINE int64_t cols_left(const gi_weight *w, int64_t n0) { return w->n_out - n0; }

GI_INLINE int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }


#if defined(__AVX512F__) && defined(__AVX512BW__)
/* ============================================================================ AVX-512 scale helpers (matmul_avx512.c, matmul_amx.c) */
#include <immintrin.h>

/* q4_k / q5_k: d*sc and -(dmin*mn) of group g (sub-block g % 8 of its super-block) for the 16
   rows of a unit, from the super-block's d, dmin (kd: (2, 16) float16) and 12 lines of packed
   scales and mins (kp: (12, 16)), decoded as GGUF's get_scale_min_k4.  Both products exact. */
GI_INLINE void qk_scales16(const uint16_t *kd, const uint8_t *kp, int s, __m512 *dv, __m512 *mv) {
    const __m128i m6 = _mm_set1_epi8(63), m4 = _mm_set1_epi8(15), m30 = _mm_set1_epi8(0x30);
    __m128i sc, mn;
    if (s < 4) {
        sc = _mm_and_si128(_mm_loadu_si128((const __m128i *)(kp + s * 16)), m6);
        mn = _mm_and_si128(_mm_loadu_si128((const __m128i *)(kp + (s + 4) * 16)), m6);
    } else {  /* low 4 bits from line s+4, top 2 from bits 6..7 of lines s-4 (sc) and s (mn) */
        const __m128i h = _mm_loadu_si128((const __m128i *)(kp + (s + 4) * 16));
        sc = _mm_or_si128(_mm_and_si128(h, m4),
                          _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(kp + (s - 4) * 16)), 2), m30));
        mn = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(h, 4), m4),
                          _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(kp + s * 16)), 2), m30));
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)kd));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kd + 16)));
    *dv = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc)));
    *mv = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mn)))),
                                               _mm512_set1_epi32((int)0x80000000u)));  /* -(dmin*mn), as C's unary minus */
}

/* q6_k: a group's (16 rows x 2) int8 scales -> the low and high halves' scales, float32 */
GI_INLINE void q6_scales16(const int8_t *p, __m512 *s0, __m512 *s1) {
    const __m512i v = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p));
    *s0 = _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(v, 16), 16));
    *s1 = _mm512_cvtepi32_ps(_mm512_srai_epi32(v, 16));
}
#endif


/* ============================================================================ what an ISA file provides
 *
 * Every ISA file defines GI(quantize_act) and MR_Q (gi_matmul_ops.mr_q).  The portable one
 * also defines GI(matmul_q), GI(matmul_f) and FG_MR.  A SIMD one instead defines microkernels
 * that matmul_impl.c instantiates and tiles into matmul_q / matmul_f:
 *   qtile(KIND, RB, MR, w, a, m, u, out, ldo)   int kinds, ftile(...) float kinds
 * and their sizes: UNIT (output rows per unit), QV_RB / FV_RB (units per GEMV call), QG_RB x
 * QG_MR / FG_RB x FG_MR (units x activation rows per GEMM call), optionally QG_MR_Q6K (q6_k's
 * GEMM rows, <= QG_MR).  Every SIMD file has microkernels for every int kind.  It may also
 * define QV_Q4 and qv_q4(KIND, RB, w, a, m, rb, out, ldo): its own GEMV of q4_0, q4_1 and q4_k
 * (RB row blocks from rb, one activation row, the same bits), which matmul_q runs instead of
 * qtile's, and QV_Q6 with qv_q6(RB, ...) for q6_k.
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

/* SEQ(N)(X, A, B) expands to X(A, B, 1) X(A, B, 2) ... X(A, B, N): the instantiation lists */
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

#endif
