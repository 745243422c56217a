/* AMX int8 GEMM for q4_0 / q4_1 / q8_0 / q6_k / q4_k / q5_k / q5_0 / q5_1 weights (see matmul_amx.h).
 *
 * Exactness: per output element (m, n) the contract of matmul_impl.h is
 *   acc = 0; for g in order: acc = fmaf((float)is, d[n,g]*da[m,g], acc)
 *                            (q4_1: then acc = fmaf(mn[n,g], sa[m,g], acc))
 * where is = the exact int32 dot product of group g with signed weights (q4_0: nib - 8,
 * q4_1: nib, q5_0: q - 16, q5_1: q, q8_0: q; q5_1 folds as q4_1).  One TDPBSSD of K = 32 gives exactly these int32 values for 16
 * activation rows x 16 output rows (|is| <= 32*128*127 < 2^31), and the fold below does the
 * float operations of the VNNI kernel in the same order, so the bits are the same.
 *
 * Tiles (palette 1; CFG):
 *   tmm0..tmm3  C: 16 activation rows x 16 int32 (four groups in flight)
 *   tmm4, tmm5  A: 16 activation rows x 32 int8 (one group of qa; row stride K)
 *   tmm6, tmm7  B: 8 rows x 64 bytes = 16 output rows x 4 consecutive k (row kk: k = 4kk..4kk+3)
 * B for q8_0 is the repacked weight itself (line c = k 4c..4c+3 x 16 rows x 4); for q4 the
 * nibbles are unpacked into signed int8 once per row block and reused by every activation tile.
 * Every group's C tile goes through memory to the fold (the scales are per group); four
 * groups are in flight.  With that and the accumulators held in registers (they were in
 * memory: GCC does not scalarize an array indexed in a loop it did not unroll), one core of
 * an Emerald Rapids Xeon ran the Llama-3.2-1B shape's q4_k GEMMs (M = 512) at 1.07-1.21x the
 * GOP/s of two groups in flight, q6_k's at 0.98-1.07x.  What is left is the per-group C
 * store and fold: without the fold the tile work alone ran ~2x as fast, the fold alone ~2.5x.
 *
 * q4_k, q5_k: the codes unpacked the same way (0..15, 0..31), the fold as q4_1's with the
 * group's d*sc and -(dmin*mn) (exact products, the contract of matmul_impl.h).  q6_k: q - 32
 * unpacked (-32..31); the two 16-k halves of a group have their own scales, so each half is
 * one TDPBSSD of K = 16 into its own C tile (H0, H1), and the fold forms
 * isum = fma(H1, sc1, H0*sc0) in float32, exact (integers below 2^24), as the VNNI kernel
 * does.  q6_k tiles (CFG_Q6): two groups in flight, C tmm0, tmm1 (H0, H1 of the first) and
 * tmm2, tmm3 (the second's); A tmm4, tmm6: 16 rows x 16 int8; B tmm5, tmm7: 4 rows x 64 bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "matmul_amx.h"
#include "matmul_impl.h"

#if GI_HAVE_AMX
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* ============================================================================ runtime detection */

static int probe(void) {
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, 0) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if (!((d >> 24) & 1u) || !((d >> 25) & 1u)) return 0;     /* AMX-TILE, AMX-INT8 */
    __cpuid(1, a, b, c, d);
    if (!((c >> 27) & 1u)) return 0;                          /* OSXSAVE: xgetbv usable */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if (((lo >> 17) & 3u) != 3u) return 0;                     /* XTILECFG, XTILEDATA */
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 0;
    return 1;
}

static int g_supported = -1;   /* -1: not probed yet */
static int g_on = -1;          /* -1: not decided yet */

int gi_amx_supported(void) {
    int s = __atomic_load_n(&g_supported, __ATOMIC_ACQUIRE);
    if (s < 0) {
        s = probe();   /* idempotent: racing first callers get the same answer */
        __atomic_store_n(&g_supported, s, __ATOMIC_RELEASE);
    }
    return s;
}

int gi_amx_enabled(void) { return gi_switch_enabled(&g_on, "GOINFER_AMX", gi_amx_supported); }

int gi_amx_set(int on) { return gi_switch_set(&g_on, on, gi_amx_supported); }

/* ============================================================================ kernel */

typedef struct tilecfg {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

static const tilecfg CFG = {
    1, 0, {0},
    {64, 64, 64, 64, 32, 32, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0},
    {16, 16, 16, 16, 16, 16, 8, 8, 0, 0, 0, 0, 0, 0, 0, 0},
};
static const tilecfg CFG_Q6 = {
    1, 0, {0},
    {64, 64, 64, 64, 16, 64, 16, 64, 0, 0, 0, 0, 0, 0, 0, 0},
    {16, 16, 16, 16, 16, 4, 16, 4, 0, 0, 0, 0, 0, 0, 0, 0},
};

#define ACT_CHUNK (768 * 1024)   /* activation bytes per cache block (as the VNNI GEMM) */

/* q4 / q4_k / q5 / q6_k row block -> signed int8 B tiles: bq (G, 8, 16, 4); line c <- the
   codes of k = 4c + j, line 4+c <- those of k = 16 + 4c + j (minus 8: q4_0, minus 16: q5_0,
   minus 32: q6_k). */
static void unpack_q(int kind, const uint8_t *wq, int64_t G, int8_t *bq) {
    const int NL = LINES(kind);
    const __m512i nib = _mm512_set1_epi8(0x0F), b4 = _mm512_set1_epi8(0x10), m3f = _mm512_set1_epi8(0x3F),
                  m30 = _mm512_set1_epi8(0x30);
    const __m512i off = _mm512_set1_epi8((char)(kind == GI_Q6_K ? 32 : CODE_OFF(kind)));
    for (int64_t g = 0; g < G; g++) {
        const uint8_t *lg = wq + g * NL * 64;
        for (int c = 0; c < 4; c++) {
            __m512i l = _mm512_loadu_si512(lg + c * 64), lo, hi;
            if (kind == GI_Q6_K) {  /* as the VNNI kernel: bits 0..5; a nibble of line 4 + c/2 | bits 6..7 */
                __m512i y = _mm512_loadu_si512(lg + (4 + (c >> 1)) * 64);
                if (c & 1) y = _mm512_srli_epi16(y, 4);
                lo = _mm512_and_si512(l, m3f);
                hi = _mm512_ternarylogic_epi32(y, _mm512_and_si512(_mm512_srli_epi16(l, 2), m30), nib, 0xE4);
            } else {
                lo = _mm512_and_si512(l, nib);
                hi = _mm512_and_si512(_mm512_srli_epi16(l, 4), nib);
                if (IS_Q5(kind)) {
                    const __m512i h = _mm512_loadu_si512(lg + 4 * 64);
                    lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(h, 4 - c), b4));
                    hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_srli_epi16(h, c), b4));
                }
            }
            _mm512_store_si512(bq + g * 512 + c * 64, _mm512_sub_epi8(lo, off));
            _mm512_store_si512(bq + g * 512 + (4 + c) * 64, _mm512_sub_epi8(hi, off));
        }
    }
}

/* acc[i] (16 output rows) of activation row i += group g's int32 c (16, 16), contract order. */
GI_INLINE void fold(const int KIND, __m512 acc[16], const int32_t *c, __m512 dv, __m512 mv,
                    const float *da, const float *sa, int64_t G, int64_t g) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
        __m512 dai = _mm512_set1_ps(da[i * G + g]);
        __m512 ci = _mm512_cvtepi32_ps(_mm512_load_si512(c + i * 16));
        acc[i] = _mm512_fmadd_ps(ci, _mm512_mul_ps(dv, dai), acc[i]);
        if (HAS_MIN(KIND) || IS_QK(KIND)) acc[i] = _mm512_fmadd_ps(mv, _mm512_set1_ps(sa[i * G + g]), acc[i]);
    }
}

/* q6_k: as fold, with isum = fma(H1, sc1, H0*sc0) from the halves' C tiles c0, c1 (exact). */
GI_INLINE void fold_q6(__m512 acc[16], const int32_t *c0, const int32_t *c1, __m512 dv, __m512 s0, __m512 s1,
                       const float *da, int64_t G, int64_t g) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
        __m512 h0 = _mm512_cvtepi32_ps(_mm512_load_si512(c0 + i * 16));
        __m512 h1 = _mm512_cvtepi32_ps(_mm512_load_si512(c1 + i * 16));
        __m512 isf = _mm512_fmadd_ps(h1, s1, _mm512_mul_ps(h0, s0));
        acc[i] = _mm512_fmadd_ps(isf, _mm512_mul_ps(dv, _mm512_set1_ps(da[i * G + g])), acc[i]);
    }
}

/* the group's scale vectors of a q4_0 / q4_1 / q8_0 / q4_k / q5_k / q5_0 / q5_1 row block (mv: q4_1, q5_1, qk;
   qk from kq, the row block's scales decoded once: (G, 2, 16) float32) */
GI_INLINE void scales(const int KIND, const gi_weight *w, const float *kq, int64_t rb, int64_t G, int64_t g,
                      __m512 *dv, __m512 *mv) {
    if (IS_QK(KIND)) {
        *dv = _mm512_load_ps(kq + g * 32);
        *mv = _mm512_load_ps(kq + g * 32 + 16);
        return;
    }
    *dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w->d + (rb * G + g) * 16)));
    if (HAS_MIN(KIND)) *mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(w->m + (rb * G + g) * 16)));
}

/* 16 activation rows from m x one row block rb (B tiles at bq, row stride 64 bytes); cbuf:
   four C tiles (4, 16, 16).  The accumulators stay in registers (every index constant). */
GI_INLINE void tile16(const int KIND, const gi_weight *w, const gi_qact *a, int64_t m, int64_t rb,
                      const int8_t *bq, const float *kq, int32_t *cbuf, float *out, int64_t ldo) {
    const int64_t K = w->n_in, G = K / GI_GROUP;
    const int8_t *qa = a->qa + m * K;                              /* (16, K) */
    const float *da = a->da + m * G, *sa = a->sa + m * G;          /* (16, G) */
    __m512 acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    int64_t g = 0;
    if (KIND == GI_Q6_K) {
/* group gg's halves into C tiles H0, H1 (A tile TA, B tile TB), then its fold from cbuf + c */
#define Q6_DP(H0, H1, TA, TB, gg)                                   \
        do {                                                        \
            _tile_zero(H0);                                         \
            _tile_zero(H1);                                         \
            _tile_loadd(TA, qa + (gg) * GI_GROUP, K);               \
            _tile_loadd(TB, bq + (gg) * 512, 64);                   \
            _tile_dpbssd(H0, TA, TB);                               \
            _tile_loadd(TA, qa + (gg) * GI_GROUP + 16, K);          \
            _tile_loadd(TB, bq + (gg) * 512 + 256, 64);             \
            _tile_dpbssd(H1, TA, TB);                               \
        } while (0)
#define Q6_FOLD(H0, H1, c, gg)                                                                         \
        do {                                                                                           \
            __m512 s0, s1;                                                                             \
            q6_scales16(w->sc + (rb * G + (gg)) * 32, &s0, &s1);                                       \
            const __m512 dv = _mm512_cvtph_ps(                                                         \
                _mm256_loadu_si256((const __m256i *)(w->d + (rb * (G / 8) + (gg) / 8) * 16)));         \
            _tile_stored(H0, cbuf + (c), 64);                                                          \
            _tile_stored(H1, cbuf + (c) + 256, 64);                                                    \
            fold_q6(acc, cbuf + (c), cbuf + (c) + 256, dv, s0, s1, da, G, gg);                         \
        } while (0)
        for (; g < G; g += 2) {  /* G % 8 == 0: q6_k's K is whole super-blocks of 256 */
            Q6_DP(0, 1, 4, 5, g);
            Q6_DP(2, 3, 6, 7, g + 1);
            Q6_FOLD(0, 1, 0, g);
            Q6_FOLD(2, 3, 512, g + 1);
        }
#undef Q6_DP
#undef Q6_FOLD
    } else {
/* group gg into C tile C (A tile TA, B tile TB), then its fold from cbuf + c */
#define Q_DP(C, TA, TB, gg)                                         \
        do {                                                        \
            _tile_zero(C);                                          \
            _tile_loadd(TA, qa + (gg) * GI_GROUP, K);               \
            _tile_loadd(TB, bq + (gg) * 512, 64);                   \
            _tile_dpbssd(C, TA, TB);                                \
        } while (0)
#define Q_FOLD(C, c, gg)                                            \
        do {                                                        \
            __m512 dv, mv = _mm512_setzero_ps();                    \
            scales(KIND, w, kq, rb, G, gg, &dv, &mv);               \
            _tile_stored(C, cbuf + (c), 64);                        \
            fold(KIND, acc, cbuf + (c), dv, mv, da, sa, G, gg);     \
        } while (0)
        for (; g + 4 <= G; g += 4) {
            Q_DP(0, 4, 6, g);
            Q_DP(1, 5, 7, g + 1);
            Q_DP(2, 4, 6, g + 2);
            Q_DP(3, 5, 7, g + 3);
            Q_FOLD(0, 0, g);
            Q_FOLD(1, 256, g + 1);
            Q_FOLD(2, 512, g + 2);
            Q_FOLD(3, 768, g + 3);
        }
        for (; g < G; g++) {
            Q_DP(0, 4, 6, g);
            Q_FOLD(0, 0, g);
        }
#undef Q_DP
#undef Q_FOLD
    }
    const int64_t n0 = rb * GI_ROWS, cnt = w->n_out - n0;
    const __mmask16 keep = cnt >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cnt) - 1u);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) _mm512_mask_storeu_ps(out + (m + i) * ldo + n0, keep, acc[i]);
}

typedef void (*tile_fn)(const gi_weight *, const gi_qact *, int64_t, int64_t, const int8_t *, const float *,
                        int32_t *, float *, int64_t);
#define TILE_DEF(KIND) static void tile16_##KIND(const gi_weight *w, const gi_qact *a, int64_t m, int64_t rb, \
    const int8_t *bq, const float *kq, int32_t *cbuf, float *out, int64_t ldo) { \
    tile16(KIND, w, a, m, rb, bq, kq, cbuf, out, ldo); }
TILE_DEF(GI_Q4_0) TILE_DEF(GI_Q4_1) TILE_DEF(GI_Q8_0) TILE_DEF(GI_Q6_K) TILE_DEF(GI_Q4_K) TILE_DEF(GI_Q5_K)
TILE_DEF(GI_Q5_0) TILE_DEF(GI_Q5_1)
static const tile_fn TILES[GI_Q5_1 + 1] = {
    [GI_Q4_0] = tile16_GI_Q4_0, [GI_Q4_1] = tile16_GI_Q4_1, [GI_Q8_0] = tile16_GI_Q8_0,
    [GI_Q6_K] = tile16_GI_Q6_K, [GI_Q4_K] = tile16_GI_Q4_K, [GI_Q5_K] = tile16_GI_Q5_K,
    [GI_Q5_0] = tile16_GI_Q5_0, [GI_Q5_1] = tile16_GI_Q5_1,
};

int64_t gi_matmul_q_amx(const gi_weight *w, const gi_qact *a, int64_t m0, int64_t m1,
                        int64_t rb0, int64_t rb1, float *out, int64_t ldo) {
    const int kind = w->kind;
    const int64_t K = w->n_in, G = K / GI_GROUP, M16 = (m1 - m0) / 16 * 16;
    if (kind == GI_MXFP4 || kind > GI_Q5_1 || M16 <= 0 || rb1 <= rb0 || G <= 0) return 0;  /* mxfp4: VNNI */
    int8_t *bq = 0;                  /* unpacked codes (G, 8, 16, 4), then qk: scales (G, 2, 16) float */
    float *kq = 0;
    int32_t cbuf[4 * 16 * 16] __attribute__((aligned(64)));      /* four C tiles (16, 16) */
    if (kind != GI_Q8_0) {
        bq = aligned_alloc(64, (size_t)G * (IS_QK(kind) ? 512 + 128 : 512));
        if (!bq) return 0;
        kq = (float *)(bq + G * 512);
    }
    const tile_fn tile = TILES[kind];
    _tile_loadconfig(kind == GI_Q6_K ? &CFG_Q6 : &CFG);
    int64_t mblk = ACT_CHUNK / K / 16 * 16;
    if (mblk < 16) mblk = 16;
    for (int64_t mb0 = m0; mb0 < m0 + M16; mb0 += mblk) {
        const int64_t mb1 = mb0 + mblk < m0 + M16 ? mb0 + mblk : m0 + M16;
        for (int64_t rb = rb0; rb < rb1; rb++) {
            const uint8_t *wq = (const uint8_t *)w->qs + rb * G * LINES(kind) * 64;
            const int8_t *b = (const int8_t *)wq;
            if (kind != GI_Q8_0) {
                unpack_q(kind, wq, G, bq);
                if (IS_QK(kind))   /* the row block's d*sc, -(dmin*mn), once for every tile */
                    for (int64_t g = 0; g < G; g++) {
                        __m512 dv, mv;
                        qk_scales16(w->d + (rb * (G / 8) + g / 8) * 32, w->ks + (rb * (G / 8) + g / 8) * 192,
                                    (int)(g & 7), &dv, &mv);
                        _mm512_store_ps(kq + g * 32, dv);
                        _mm512_store_ps(kq + g * 32 + 16, mv);
                    }
                __asm__ volatile("" ::: "memory");   /* tileloadd reads bq: no clobber of its own */
                b = bq;
            }
            for (int64_t m = mb0; m < mb1; m += 16) tile(w, a, m, rb, b, kq, cbuf, out, ldo);
        }
    }
    _tile_release();
    free(bq);
    return M16;
}

#else /* the compiler cannot emit AMX: never used */

int gi_amx_supported(void) { return 0; }
int gi_amx_enabled(void) { return 0; }
int gi_amx_set(int on) { return on ? -1 : 0; }
int64_t gi_matmul_q_amx(const gi_weight *w, const gi_qact *a, int64_t m0, int64_t m1,
                        int64_t rb0, int64_t rb1, float *out, int64_t ldo) {
    (void)w; (void)a; (void)m0; (void)m1; (void)rb0; (void)rb1; (void)out; (void)ldo;
    return 0;
}

#endif
