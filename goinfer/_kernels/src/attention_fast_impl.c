/* Fast attention over the paged KV cache (see attention.h), compiled once per ISA variant.
 *
 * float32 throughout, flash-style: keys are taken in tiles of FA_TK = 64 positions, tiles
 * aligned to multiples of 64 absolute positions; each query row (t, h) keeps a running max m,
 * a running sum l and an output accumulator o (hd floats), and for every tile that holds keys
 * of its range [lo, hi]:
 *   s_j   = (q * scale * log2 e) . k_j         float32, fused multiply-adds in d order
 *   s_j   = softcap * tanh(s_j / softcap)      (if softcap > 0, in log2 units)
 *   s_j   = -inf outside [lo, hi]
 *   m'    = max(m, max_j s_j),  c = 2^(m - m')
 *   p_j   = 2^(s_j - m')                       (fa_exp2: a degree-5 polynomial)
 *   l     = l * c + sum_j p_j,  o = o * c + sum_j p_j v_j   (keys of the tile in order)
 * Keys are grouped in chunks of FA_CH = 512 positions (aligned to multiples of 512): the
 * online softmax above runs per chunk, from m = -inf, l = 0, o = 0, and the chunks a row sees
 * are folded in chunk order into (M, L, O): the first copied, then
 *   M' = max(M, m),  a = M == M' ? 1 : 2^(M - M'),  b = m == M' ? 1 : 2^(m - M'),
 *   L  = L a + l b,  O = O a + o b;     out = O / L.
 * A row with a sink logit (sinks[h], gpt-oss) folds it last as one more chunk with m = sink *
 * log2 e (float), l = 1, o = 0: M' = max(M, m), L = L a + b, O = O a (no sink: nothing).
 * So a long row's keys can be split over threads by chunk (decode: few rows, many keys) with
 * the same bits as one thread running every chunk: the fold order is fixed by position.
 *
 * Work item = a block of tq consecutive queries x nh query heads of one kv head (R <= FA_RMAX
 * rows), or of kvspan kv heads in turn, tile by tile (a decode step over many keys: see the
 * plan): each key tile is gathered once per kv head (K transposed into a packed (hd, 64)
 * tile, V read in place through row pointers) and used by all R rows, so a kv head's keys are
 * read once per query block for the whole GQA group.  Items run in parallel (OpenMP, dynamic
 * schedule, the longest query blocks first).  Within a tile, QK runs in chunks of 64 dims and
 * AV in chunks of d, so the piece of K or V in use stays in L1 for all the row blocks.
 *
 * A row's operation sequence depends only on its own query, its key range and the tile grid:
 * rows of an item whose range misses a tile get p = 0 and c = 1 there (exact no-ops), and a
 * row's masked keys get p = 0 exactly.  Only keys in [min lo, max hi] of the item are read
 * (all below the largest query position, so written); K outside it is zero-filled in the
 * tile, so unwritten slots (which may hold anything, NaN included) never reach a result.
 * So a row's result does not depend on the other queries of the call, on the item tiling or
 * on the thread count (tested); it does depend on the variant (the portable build does not
 * fuse multiply-adds) and it differs from the exact kernel by float32 rounding (stated and
 * tested as a cosine bound, tests/test_kernels_attention.py).
 */
#include "attention.h"
#include "gi_vmath.h"
#include "kv_types.h"

#define FA_TK 64           /* keys per tile */
#define FA_CH 512          /* keys per chunk (a multiple of FA_TK) */
#ifndef FA_PF
#define FA_PF 2            /* tiles ahead to prefetch (1 when a tile is over FA_PF_BYTES) */
#endif
#ifndef FA_PF_BYTES
#define FA_PF_BYTES 32768  /* K and V bytes of a tile (of an item's kv heads) */
#endif
#ifndef FA_SPAN_BYTES
#define FA_SPAN_BYTES 131072 /* at most this many K and V bytes per tile of a kv-head span */
#endif
#define FA_RMAX 64         /* rows (query x head) per item */
#define FA_DC 64           /* d-chunk of QK: a (FA_DC, FA_TK) piece of the K tile, 16 KB */

/* register blocks: QK RB rows x NV key vectors, AV RB rows x DV d-vectors */
#if defined(GI_VARIANT_AVX512)
#define FA_RB 6
#define FA_NV 4
#define FA_DV 4
#elif defined(GI_VARIANT_AVX2)
/* 16 registers: 12 accumulators, 2 key / d vectors and a broadcast.  3 x 4 needed 17 in AV
   (an accumulator spilled: a store-load on the critical path); 6 x 2 took a 2048-token causal
   prefill's AV from 171 to 88 ms on a Zen 4 (QK unchanged, f16 cache, one thread). */
#define FA_RB 6
#define FA_NV 2
#define FA_DV 2
#else
#define FA_RB 4
#define FA_NV 8
#define FA_DV 8
#endif
#define FA_TV (FA_TK / VF_N) /* vectors per tile row */
/* direct QK (few rows, fa_qk_direct): key vectors of one block per pass over d.  An item of
 * at most FA_FEW rows (a decode step of a GQA group of 4 or fewer) takes FA_PW_FEW key vectors
 * per QK pass and FA_DV_FEW d-vectors per AV chunk: on avx2, 4 x 3 = 12 accumulators instead
 * of 8, more independent chains than the FMA latency x throughput (the 1B shape's decode
 * attention with the cache in L3, one Zen 5 core: 1.10x). */
#if defined(GI_VARIANT_AVX512)
#define FA_PW 4
#define FA_FEW 0
#elif defined(GI_VARIANT_AVX2)
#define FA_PW 2
#define FA_FEW 4
#define FA_PW_FEW 3
#define FA_DV_FEW 3
#else
#define FA_PW 8
#define FA_FEW 0
#endif
#ifndef FA_PW_FEW
#define FA_PW_FEW FA_PW
#define FA_DV_FEW FA_DV
#endif
#define FA_PW_MAX (FA_PW > FA_PW_FEW ? FA_PW : FA_PW_FEW)
#define FA_DV_MAX (FA_DV > FA_DV_FEW ? FA_DV : FA_DV_FEW)
#define FA_PWN(rb) ((rb) <= FA_FEW ? FA_PW_FEW : FA_PW) /* QK key vectors per pass, rb rows */
#define FA_DVN(rb) ((rb) <= FA_FEW ? FA_DV_FEW : FA_DV) /* AV d-vectors per chunk, rb rows */
/* direct path (fa_tile): items of at most FA_DMAX rows, in the fewest nearly equal row blocks
 * of at most FA_RB rows, each block reading the tile's K and V from the cache (the second from
 * L1) */
#ifndef FA_DMAX
#define FA_DMAX (2 * FA_RB)
#endif

/* vectors of the next pass (QK key vectors, AV d-vectors) with n left, w per full pass: w,
 * then 2 or 1 at the end (3 + 1 as 2 + 2, so that no pass runs on 4 chains) */
GI_INLINE int fa_pass(int w, int64_t n) {
    if (n >= w) return n - w == 1 && w == 3 ? 2 : w;
    return n >= 2 ? 2 : 1;
}

/* passes that cover n vectors */
GI_INLINE int64_t fa_passes(int w, int64_t n) {
    int64_t k = 0;
    for (; n > 0; k++) n -= fa_pass(w, n);
    return k;
}

#if FA_TV % FA_NV != 0
#error "FA_NV must divide the vectors of a tile"
#endif

/* ============================================================================ item context */

/* The prefetch cursor of an item, shared by its kv heads: the blocks b0..pfb1 of the tile
 * `ahead` tiles after `tile`, walked kv head by kv head from h0 to h0 + nh - 1, as the tiles
 * compute them, each head through every block (hb bytes of K in a block, and as many of V at
 * the same offset); the K lines [cur, end) of the head-block being walked; pq lines per step
 * of a tile, credit lines the kernels may still issue. */
typedef struct {
    int64_t h0, nh;
    int64_t ahead;           /* tiles */
    int64_t tile;            /* the tile whose look-ahead this is (-1: none yet) */
    int64_t b0, pfb1;        /* blocks of the look-ahead */
    int64_t hc, pfb;         /* the head being walked (h0 + hc; nh: none), its next block */
    const char *cur, *end;   /* K lines left of the head-block being walked */
    ptrdiff_t dv;            /* a V line = its K line + dv */
    int64_t pq, credit;      /* lines per step or kv head; lines left to the kernels */
    int64_t mask;            /* the kernels issue a line at loop steps i with i & mask == 0 */
    const int32_t *bt;       /* the sequence's block table */
    const char *kc;          /* the K cache */
    int64_t n_kv, hb;        /* kv heads, bytes of one head in a block */
} fa_pf;

typedef struct {
    int R;                   /* rows r = ti * nhh + hj */
    int64_t kvh;             /* kv head */
    int64_t kmin, kmax;      /* union key range of the rows (absolute) */
    int64_t lo[FA_RMAX];     /* row key range [lo, hi] (absolute) */
    int64_t hi[FA_RMAX];
    float *orow[FA_RMAX];    /* out rows */
    const float *qrow[FA_RMAX]; /* q rows */
    float *qs;               /* (R, hd) q * scale */
    float *o;                /* (R, hd) accumulators */
    float *p;                /* (R, FA_TK) scores, then weights */
    float *kt;               /* (hd, FA_TK) the tile's keys, transposed, as float */
    const char **vp;         /* (FA_TK,) the tile's value rows (of type vdt) */
    float *vt;               /* (FA_TK, hd) the tile's values as float (gathered, R > FA_RB) */
    int vdt;                 /* the type AV reads: kv_dtype, or GI_KV_F32 from vt */
    float *O;                /* (R, hd) the folded chunks */
    float m[FA_RMAX], l[FA_RMAX], c[FA_RMAX];   /* the current chunk */
    float M[FA_RMAX], L[FA_RMAX];               /* the folded chunks */
    int nf[FA_RMAX];         /* chunks folded */
    int act[FA_RMAX];        /* row has keys in the current tile */
    int direct;              /* fa_direct: QK and AV read the cache in place */
    int nrb, rbx;            /* row blocks (fa_row_blocks), rows of the largest (AV d-chunks) */
    int rs[FA_RMAX + 1];     /* row block i: rows [rs[i], rs[i + 1]) */
    float sink[FA_RMAX];     /* row's sink logit in log2 units (-inf: none) */
    fa_pf *pf;               /* the item's prefetch cursor */
} fa_ctx;

/* ============================================================================ prefetch */

/* The K and V blocks of the tile FA_PF tiles ahead are prefetched while the current one is
 * computed (the cache streams from memory at long contexts, and its blocks are scattered; a
 * hint, no effect on results).  The lines go out a few at a time, never in a burst: all at
 * the tile's start (256 lines for hd 64, f16), a decode step's attention at 4,096 tokens took
 * 1.1-1.3x as long on a Zen 4, about the time of its compute plus that of its reads, as if
 * the burst held the step until memory answered.  With few rows (a decode step, the direct
 * path) a line goes out every 2^k steps of the kernels' own loops (fa_pf_step, paced so that
 * a kv head's share of the look-ahead spreads over its tile): on a Zen 5, where hardware
 * prefetch left the step's reads serialized with its compute, two threads ran the 1B and 8B
 * shapes' layers at 4,096 tokens (f16) 1.59-1.72x as fast on avx512-vnni (50-53 GB/s against
 * 28-32 with a share before each QK and AV call) and 1.36-1.42x on avx2 (q8_0: 1.25-1.37x and
 * 1.05x, nearer their compute bound); a counter per step in place of the loop index cost
 * avx2 10%, and every second line alone was no faster than none.  They go to L2, not L1: two
 * tiles ahead are 32 KB (hd 64, f16), all of a Zen 4's L1, and prefetched into L1 the same
 * step ran 1.15-1.3x slower there.  An item of several kv heads has larger tiles (128 KB for
 * 8 kv heads of hd 64, f16) and looks one tile ahead (two tiles ahead: 1.15-1.2x slower on
 * the Zen 5).  Its look-ahead goes out kv head by kv head, the order its tiles read it, so
 * that each kv head's share (pq lines) is that head's own next tile; walked block by block in
 * memory order, the first head's lines in the tile's last blocks went out among the last, only
 * a few heads' compute before they were read.  Two threads ran one decode step over 4,096
 * tokens 1.01-1.10x as fast head by head on a Zen 4 (the 3B and 8B shapes on both variants and
 * the 1B on avx2; medians of the rounds' ratios, 6 or 10 alternating rounds), the 1B on
 * avx512-vnni alike (1.03x and 0.99x). */
static int fa_pf_refill(fa_pf *f) {
    if (f->hc >= f->nh) return 0;
    if (f->pfb > f->pfb1) { /* the head's last block walked: the next head */
        if (f->hc + 1 >= f->nh) {
            f->hc = f->nh;
            return 0;
        }
        f->hc++;
        f->pfb = f->b0;
    }
    f->cur = f->kc + (f->bt[f->pfb++] * f->n_kv + f->h0 + f->hc) * f->hb;
    f->end = f->cur + f->hb;
    return 1;
}

/* lines of the look-ahead not yet issued */
GI_INLINE int fa_pf_left(const fa_pf *f) {
    return f->cur < f->end || (f->hc < f->nh && (f->pfb <= f->pfb1 || f->hc + 1 < f->nh));
}

/* one K line and its V line, into L2 (prefetcht1) */
GI_INLINE void fa_pf_line(fa_pf *f) {
    if (f->cur >= f->end && !fa_pf_refill(f)) return;
    __builtin_prefetch(f->cur, 0, 2);
    __builtin_prefetch((const char *)((uintptr_t)f->cur + (uintptr_t)f->dv), 0, 2);
    f->cur += 64;
}

static void fa_pf_some(fa_pf *f, int64_t lines) {
    for (; lines > 0 && fa_pf_left(f); lines--) fa_pf_line(f);
}

/* a kernel's loop step i (pm: f's mask, or INT64_MAX without f): one more line at every
 * (mask + 1)-th step while the kv head's share lasts */
GI_INLINE void fa_pf_step(fa_pf *f, int64_t pm, int64_t i) {
    if ((i & pm) == 0 && f && f->credit > 0) {
        f->credit--;
        fa_pf_line(f);
    }
}

/* start prefetching the blocks of keys [pa, pb] (what is left of the previous range first) */
static void fa_pf_start(const gi_attn_args *a, fa_pf *f, int64_t pa, int64_t pb) {
    fa_pf_some(f, INT64_MAX);
    f->b0 = f->pfb = pa <= pb ? pa / a->bs : 1;
    f->pfb1 = pa <= pb ? pb / a->bs : 0;
    f->hc = pa <= pb ? 0 : f->nh; /* nh: nothing to walk */
}

/* ============================================================================ QK */

/* p[r][0..FA_TK) (+)= qs[r][0..dn) . kt[0..dn, 0..FA_TK) for RB rows (qs row stride hd):
 * one chunk of d; FIRST starts the sums, otherwise they continue from p (the same chain) */
GI_INLINE void fa_qk(const int RB, const int FIRST, const float *qs, int64_t hd,
                     const float *kt, int64_t dn, float *p) {
    for (int c0 = 0; c0 < FA_TV; c0 += FA_NV) {
        vf acc[FA_RB][FA_NV];
#pragma GCC unroll 8
        for (int r = 0; r < RB; r++)
#pragma GCC unroll 8
            for (int v = 0; v < FA_NV; v++)
                acc[r][v] = FIRST ? vf_zero() : vf_load(p + r * FA_TK + (c0 + v) * VF_N);
        const float *kd = kt + c0 * VF_N;
        for (int64_t d = 0; d < dn; d++, kd += FA_TK) {
            vf kv[FA_NV];
#pragma GCC unroll 8
            for (int v = 0; v < FA_NV; v++) kv[v] = vf_load(kd + v * VF_N);
#pragma GCC unroll 8
            for (int r = 0; r < RB; r++) {
                const vf qv = vf_set1(qs[r * hd + d]);
#pragma GCC unroll 8
                for (int v = 0; v < FA_NV; v++) acc[r][v] = vf_muladd(qv, kv[v], acc[r][v]);
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < RB; r++)
#pragma GCC unroll 8
            for (int v = 0; v < FA_NV; v++) vf_store(p + r * FA_TK + (c0 + v) * VF_N, acc[r][v]);
    }
}

/* Direct QK for an item of at most FA_RB rows (a decode step): the scores of PW key vectors
 * straight from the cache (vector v: the VF_N keys from offset off[v] of the K head-block
 * kb[v]; the vectors of a tile may lie in different blocks), p[r][v * VF_N ...] for RB rows.
 * The same chain per key as fa_qk over the gathered tile (acc = 0; acc = muladd(q[d], k[d],
 * acc) for d in order), so the same bits, without packing the tile first; RB x PW independent
 * chains, so that a few rows still keep the FMA units busy. */
GI_INLINE void fa_qk_direct(const int RB, const int PW, const int DT, const float *qs, int64_t hd,
                            const char *const *kb, const int64_t *off, int64_t bs, float *p,
                            fa_pf *pf) {
    vf acc[FA_RB][FA_PW_MAX], sc[FA_PW_MAX];
    const char *kp[FA_PW_MAX];                            /* vector v's first key in row d = 0 */
    const int es = DT == GI_KV_F32 ? 4 : DT == GI_KV_F16 ? 2 : 1;
#pragma GCC unroll 8
    for (int v = 0; v < PW; v++) kp[v] = kb[v] + off[v] * es;
#pragma GCC unroll 8
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 8
        for (int v = 0; v < PW; v++) acc[r][v] = vf_zero();
#pragma GCC unroll 8
    for (int v = 0; v < PW; v++) sc[v] = vf_zero();
    const int64_t pm = pf ? pf->mask : INT64_MAX;
    for (int64_t d = 0; d < hd; d++) {
        fa_pf_step(pf, pm, d);
        vf kv[FA_PW_MAX];
        if (DT == GI_KV_F32) {
#pragma GCC unroll 8
            for (int v = 0; v < PW; v++) kv[v] = vf_load((const float *)kp[v] + d * bs);
        } else if (DT == GI_KV_F16) {
#pragma GCC unroll 8
            for (int v = 0; v < PW; v++) kv[v] = vf_load_f16((const uint16_t *)kp[v] + d * bs);
        } else {
            if (d % GI_KV_QB == 0) {
#pragma GCC unroll 8
                for (int v = 0; v < PW; v++)
                    sc[v] = vf_load_f16((const uint16_t *)(kb[v] + hd * bs) + (d / GI_KV_QB) * bs + off[v]);
            }
#pragma GCC unroll 8
            for (int v = 0; v < PW; v++) kv[v] = vf_mul(vf_load_i8((const int8_t *)kp[v] + d * bs), sc[v]);
        }
#pragma GCC unroll 8
        for (int r = 0; r < RB; r++) {
            const vf qv = vf_set1(qs[r * hd + d]);
#pragma GCC unroll 8
            for (int v = 0; v < PW; v++) acc[r][v] = vf_muladd(qv, kv[v], acc[r][v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 8
        for (int v = 0; v < PW; v++) vf_store(p + r * FA_TK + v * VF_N, acc[r][v]);
}

/* ============================================================================ softmax */

/* Scores are kept in log2 units (q is pre-scaled by scale * log2(e)), so weights are 2^x.
 * 2^x for x <= 0: n = rint(x) by the 1.5 * 2^23 "magic" add, f = x - n in [-1/2, 1/2],
 * 2^f by a degree-5 polynomial (fitted for relative error; 1.6e-7 measured), 2^n from
 * exponent bits.  x is first clamped to -127, whose 2^n bits are 0: x < -126.5 and -inf give
 * exactly 0 (so masked keys are exact no-ops).  Fused multiply-adds where the ISA has them. */
#define FA_P0 0x1.000002p+0f
#define FA_P1 0x1.62e428p-1f
#define FA_P2 0x1.ebf918p-3f
#define FA_P3 0x1.c6b6e6p-5f
#define FA_P4 0x1.3d0c52p-7f
#define FA_P5 0x1.5c08e0p-10f
#define FA_LOG2E 1.4426950408889634

GI_INLINE vf fa_exp2(vf x) {
    x = vf_max(x, vf_set1(-127.0f));
    const vf t = vf_add(x, vf_set1(GI_MAGIC_F));
    const vf f = vf_sub(x, vf_sub(t, vf_set1(GI_MAGIC_F)));
    vf p = vf_muladd(vf_set1(FA_P5), f, vf_set1(FA_P4));
    p = vf_muladd(p, f, vf_set1(FA_P3));
    p = vf_muladd(p, f, vf_set1(FA_P2));
    p = vf_muladd(p, f, vf_set1(FA_P1));
    p = vf_muladd(p, f, vf_set1(FA_P0));
    return vf_mul(p, vf_from_bits(vfi_shl(vfi_add(vf_bits(t), 127), 23)));
}

static float fa_exp2_1(float x) {
    float y[VF_N];
    vf_store(y, fa_exp2(vf_set1(x)));
    return y[0];
}

/* One row's scores s (FA_TK, log2 units) of keys [a, b] (tile-relative, a <= b): softcap,
 * mask, online max and sum; s becomes the weights p.  Returns the rescale c of the row's o
 * and l (1 when the max did not grow). */
static float fa_softmax_row(float *s, int a, int b, float cap2, float *m, float *l) {
    if (cap2 > 0.0f) { /* cap * tanh(s / cap) in natural units = cap2 * tanh(s2 / cap2) */
        const vf cv = vf_set1(cap2);
        for (int i = 0; i < FA_TK; i += VF_N)
            vf_store(s + i, vf_mul(cv, gi_vf_tanh(vf_div(vf_load(s + i), cv))));
    }
    for (int i = 0; i < a; i++) s[i] = -INFINITY;
    for (int i = b + 1; i < FA_TK; i++) s[i] = -INFINITY;
    vf mv = vf_load(s);
    for (int i = VF_N; i < FA_TK; i += VF_N) mv = vf_max(mv, vf_load(s + i));
    const float mt = vf_hmax(mv);
    float c = 1.0f, mn = *m;
    if (mt > mn) { /* m = -inf at the start: c = 0 (o and l are 0) */
        c = fa_exp2_1(mn - mt);
        mn = mt;
    }
    const vf mnv = vf_set1(mn);
    vf sum = vf_zero();
    for (int i = 0; i < FA_TK; i += VF_N) {
        const vf e = fa_exp2(vf_sub(vf_load(s + i), mnv));
        vf_store(s + i, e);
        sum = vf_add(sum, e);
    }
    *l = *l * c + vf_hsum(sum);
    *m = mn;
    return c;
}

/* ============================================================================ AV */

/* d-chunk of one V row (kv_types.h layout) as float: DV vectors from d0, the last one of
 * n lanes when TAIL */
GI_INLINE void fa_vload(const int DT, const int DV, const int TAIL, int n, const char *row,
                        int64_t hd, int64_t d0, vf *vv) {
#pragma GCC unroll 8
    for (int v = 0; v < DV; v++) {
        const int64_t d = d0 + v * VF_N;
        const int part = TAIL && v == DV - 1;
        if (DT == GI_KV_F32) {
            const float *p = (const float *)row + d;
            vv[v] = part ? vf_load_n(p, n) : vf_load(p);
        } else if (DT == GI_KV_F16) {
            const uint16_t *p = (const uint16_t *)row + d;
            vv[v] = part ? vf_load_f16_n(p, n) : vf_load_f16(p);
        } else {
            const int8_t *p = (const int8_t *)row + d;
            const float s = gi_f16_load1((const uint16_t *)(row + hd) + d / GI_KV_QB);
            vv[v] = vf_mul(part ? vf_load_i8_n(p, n) : vf_load_i8(p), vf_set1(s)); /* exact */
        }
    }
}

/* o[r][d0 .. d0 + DV vectors) = o * c[r] + sum_{j = ja..jb} p[r][j] * v_j, for RB rows.
 * n: valid lanes of the last vector (VF_N: all). */
GI_INLINE void fa_av(const int RB, const int DV, const int TAIL, const int DT, int n, float *o,
                     int64_t hd, const float *p, const char *const *vp, int ja, int jb,
                     const float *c, int64_t d0, fa_pf *pf) {
    vf acc[FA_RB][FA_DV_MAX];
#pragma GCC unroll 8
    for (int r = 0; r < RB; r++) {
        const vf cv = vf_set1(c[r]);
#pragma GCC unroll 8
        for (int v = 0; v < DV; v++) {
            const float *op = o + r * hd + d0 + v * VF_N;
            acc[r][v] = vf_mul(TAIL && v == DV - 1 ? vf_load_n(op, n) : vf_load(op), cv);
        }
    }
    const int64_t pm = pf ? pf->mask : INT64_MAX;
    for (int j = ja; j <= jb; j++) {
        fa_pf_step(pf, pm, j);
        vf vv[FA_DV_MAX];
        fa_vload(DT, DV, TAIL, n, vp[j], hd, d0, vv);
#pragma GCC unroll 8
        for (int r = 0; r < RB; r++) {
            const vf pv = vf_set1(p[r * FA_TK + j]);
#pragma GCC unroll 8
            for (int v = 0; v < DV; v++) acc[r][v] = vf_muladd(pv, vv[v], acc[r][v]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 8
        for (int v = 0; v < DV; v++) {
            float *op = o + r * hd + d0 + v * VF_N;
            if (TAIL && v == DV - 1)
                vf_store_n(op, acc[r][v], n);
            else
                vf_store(op, acc[r][v]);
        }
}

/* ============================================================================ dispatch on RB */

#if FA_RB == 6
#define FA_RB_CASES(X) X(1) X(2) X(3) X(4) X(5) X(6)
#elif FA_RB == 4
#define FA_RB_CASES(X) X(1) X(2) X(3) X(4)
#else
#define FA_RB_CASES(X) X(1) X(2) X(3)
#endif

static void fa_qk_block(int RB, int first, const float *qs, int64_t hd, const float *kt,
                        int64_t dn, float *p) {
#define FA_QK_CASE(N)                                          \
    case N:                                                    \
        if (first) fa_qk(N, 1, qs, hd, kt, dn, p);             \
        else fa_qk(N, 0, qs, hd, kt, dn, p);                   \
        break;
    switch (RB) { FA_RB_CASES(FA_QK_CASE) default: break; }
}

/* direct QK of nv key vectors (kb[v], off[v]: see fa_qk_direct) to p[r][v * VF_N ...], RB
 * rows, FA_PWN(RB) vectors at a time (fa_pass) */
static void fa_qk_direct_block(int RB, int dt, const float *qs, int64_t hd, const char *const *kb,
                               const int64_t *off, int64_t bs, int64_t nv, float *p, fa_pf *pf) {
#define FA_QKD_DT(N, PW)                                                                    \
    do {                                                                                    \
        if (dt == GI_KV_F16) fa_qk_direct(N, PW, GI_KV_F16, qs, hd, kb, off, bs, p, pf);     \
        else if (dt == GI_KV_Q8_0)                                                          \
            fa_qk_direct(N, PW, GI_KV_Q8_0, qs, hd, kb, off, bs, p, pf);                     \
        else fa_qk_direct(N, PW, GI_KV_F32, qs, hd, kb, off, bs, p, pf);                     \
    } while (0)
#define FA_QKD_CASE(N)                                   \
    case N:                                              \
        if (pw == FA_PWN(N)) FA_QKD_DT(N, FA_PWN(N));    \
        else if (pw == 2) FA_QKD_DT(N, 2);               \
        else FA_QKD_DT(N, 1);                            \
        break;
    const int w = FA_PWN(RB);
    while (nv > 0) {
        const int pw = fa_pass(w, nv);
        switch (RB) { FA_RB_CASES(FA_QKD_CASE) default: break; }
        kb += pw;
        off += pw;
        p += pw * VF_N;
        nv -= pw;
    }
}

/* d-chunk [d0, d0 + nd) of RB rows: FA_DVN(RB), 2 or 1 whole vectors, or a single (tail)
 * vector of nd < VF_N lanes */
#define FA_AV_DT(N, DV, TAIL, n)                                                            \
    do {                                                                                    \
        if (dt == GI_KV_F16)                                                                \
            fa_av(N, DV, TAIL, GI_KV_F16, n, o, hd, p, vp, ja, jb, c, d0, pf);               \
        else if (dt == GI_KV_Q8_0)                                                          \
            fa_av(N, DV, TAIL, GI_KV_Q8_0, n, o, hd, p, vp, ja, jb, c, d0, pf);              \
        else fa_av(N, DV, TAIL, GI_KV_F32, n, o, hd, p, vp, ja, jb, c, d0, pf);              \
    } while (0)
static void fa_av_block(int RB, int dt, int64_t nd, float *o, int64_t hd, const float *p,
                        const char *const *vp, int ja, int jb, const float *c, int64_t d0,
                        fa_pf *pf) {
#define FA_AV_CASE(N)                                                  \
    case N:                                                            \
        if (nd == FA_DVN(N) * VF_N) FA_AV_DT(N, FA_DVN(N), 0, VF_N);   \
        else if (nd == 2 * VF_N) FA_AV_DT(N, 2, 0, VF_N);              \
        else if (nd == VF_N) FA_AV_DT(N, 1, 0, VF_N);                  \
        else FA_AV_DT(N, 1, 1, (int)nd);                               \
        break;
    switch (RB) { FA_RB_CASES(FA_AV_CASE) default: break; }
}

/* ============================================================================ one key tile */

/* the d extent of the AV chunk starting at d0 for row blocks of at most rb rows: whole
 * vectors by fa_pass, else the partial tail */
GI_INLINE int64_t fa_av_extent(int64_t d0, int64_t hd, int rb) {
    const int64_t n = (hd - d0) / VF_N;
    if (n > 0) return fa_pass(FA_DVN(rb), n) * VF_N;
    return hd - d0;
}

/* AV d-chunks of a row, row blocks of at most rb rows */
GI_INLINE int64_t fa_av_chunks(int64_t hd, int rb) {
    int64_t k = 0;
    for (int64_t d0 = 0; d0 < hd; k++) d0 += fa_av_extent(d0, hd, rb);
    return k;
}

/* n keys (a run inside one block, from offset off) of K row d, as float, to dst */
GI_INLINE void fa_krow(const int DT, const int VEC, const char *kb, int64_t hd, int64_t bs,
                       int64_t d, int64_t off, int64_t n, float *dst) {
    if (DT == GI_KV_F32) {
        const float *src = (const float *)kb + d * bs + off;
        if (VEC)
            for (int64_t i = 0; i < n; i += VF_N) vf_store(dst + i, vf_load(src + i));
        else
            for (int64_t i = 0; i < n; i++) dst[i] = src[i];
    } else if (DT == GI_KV_F16) {
        const uint16_t *src = (const uint16_t *)kb + d * bs + off;
        if (VEC)
            for (int64_t i = 0; i < n; i += VF_N) vf_store(dst + i, vf_load_f16(src + i));
        else
            for (int64_t i = 0; i < n; i++) dst[i] = gi_f16_to_f32(src[i]);
    } else {
        const int8_t *src = (const int8_t *)kb + d * bs + off;
        const uint16_t *sc = (const uint16_t *)(kb + hd * bs) + (d / GI_KV_QB) * bs + off;
        if (VEC)
            for (int64_t i = 0; i < n; i += VF_N)
                vf_store(dst + i, vf_mul(vf_load_i8(src + i), vf_load_f16(sc + i)));
        else
            for (int64_t i = 0; i < n; i++) dst[i] = (float)src[i] * gi_f16_to_f32(sc[i]);
    }
}

GI_INLINE void fa_gather_dt(const int DT, const gi_attn_args *a, fa_ctx *x, int64_t t0,
                            int64_t ta, int64_t tb, int with_k) {
    const int64_t hd = a->hd, bs = a->bs;
    const int64_t hb = gi_kv_head_bytes(DT, hd, bs), vrb = gi_kv_vrow_bytes(DT, hd);
    const int ja = (int)(ta - t0), jb = (int)(tb - t0);
    if (with_k && (ja > 0 || jb < FA_TK - 1))
        for (int64_t d = 0; d < hd; d++) {
            float *row = x->kt + d * FA_TK;
            for (int j = 0; j < ja; j++) row[j] = 0.0f;
            for (int j = jb + 1; j < FA_TK; j++) row[j] = 0.0f;
        }
    for (int64_t j = ta; j <= tb;) {
        const int64_t bi = j / bs, off = j % bs;
        const int64_t n = (bs - off < tb - j + 1) ? bs - off : tb - j + 1; /* run in one block */
        const int64_t blk = a->block_table[bi];
        const char *kb = (const char *)a->k_cache + (blk * a->n_kv + x->kvh) * hb;
        const char *vb = (const char *)a->v_cache + (blk * a->n_kv + x->kvh) * hb + off * vrb;
        float *dst = x->kt + (j - t0);
        if (!with_k)
            ;
        else if (n % VF_N == 0) /* whole vectors (a full block of 16, 32, ... keys) */
            for (int64_t d = 0; d < hd; d++) fa_krow(DT, 1, kb, hd, bs, d, off, n, dst + d * FA_TK);
        else
            for (int64_t d = 0; d < hd; d++) fa_krow(DT, 0, kb, hd, bs, d, off, n, dst + d * FA_TK);
        if (x->vdt == DT) {
            const char **vp = x->vp + (j - t0); /* a local: x->vp itself would be reloaded
                                                   after every store (they may alias) */
            for (int64_t i = 0; i < n; i++) vp[i] = vb + i * vrb;
        } else { /* several row blocks will read V: convert its rows once, exactly */
            for (int64_t i = 0; i < n; i++) {
                float *dst = x->vt + (j - t0 + i) * hd;
                for (int64_t d0 = 0; d0 < hd; d0 += fa_av_extent(d0, hd, FA_RB)) {
                    const int64_t nd = fa_av_extent(d0, hd, FA_RB);
                    vf vv[FA_DV_MAX];
                    if (nd == FA_DV * VF_N) {
                        fa_vload(DT, FA_DV, 0, VF_N, vb + i * vrb, hd, d0, vv);
                        for (int v = 0; v < FA_DV; v++) vf_store(dst + d0 + v * VF_N, vv[v]);
                    } else if (nd == 2 * VF_N) {
                        fa_vload(DT, 2, 0, VF_N, vb + i * vrb, hd, d0, vv);
                        for (int v = 0; v < 2; v++) vf_store(dst + d0 + v * VF_N, vv[v]);
                    } else if (nd == VF_N) {
                        fa_vload(DT, 1, 0, VF_N, vb + i * vrb, hd, d0, vv);
                        vf_store(dst + d0, vv[0]);
                    } else {
                        fa_vload(DT, 1, 1, (int)nd, vb + i * vrb, hd, d0, vv);
                        vf_store_n(dst + d0, vv[0], (int)nd);
                    }
                }
                x->vp[j - t0 + i] = (const char *)dst;
            }
        }
        j += n;
    }
}

/* keys [ta, tb] (absolute) of the tile starting at t0: gather K transposed and converted to
 * float (zeros elsewhere, so no garbage reaches a score) and the V row pointers */
static void fa_gather(const gi_attn_args *a, fa_ctx *x, int64_t t0, int64_t ta, int64_t tb,
                      int with_k) {
    if (a->kv_dtype == GI_KV_F16) fa_gather_dt(GI_KV_F16, a, x, t0, ta, tb, with_k);
    else if (a->kv_dtype == GI_KV_Q8_0) fa_gather_dt(GI_KV_Q8_0, a, x, t0, ta, tb, with_k);
    else fa_gather_dt(GI_KV_F32, a, x, t0, ta, tb, with_k);
}

/* the direct path (an item of few rows, a decode step): QK reads the cache directly and AV
 * the V rows in place; it needs whole key vectors per block and whole blocks per tile */
GI_INLINE int fa_direct(const gi_attn_args *a, int R) {
    return R <= FA_DMAX && a->bs % VF_N == 0 && FA_TK % a->bs == 0;
}

/* the row blocks of an item of R rows: [rs[i], rs[i + 1]) for i < the count returned; direct:
 * the fewest nearly equal blocks of at most FA_RB rows (8 rows on avx2: 4 + 4, each with the
 * 12 accumulators of FA_FEW), else blocks of FA_RB and the rest */
static int fa_row_blocks(int R, int direct, int *rs) {
    int n = 0;
    if (direct) {
        const int nb = (R + FA_RB - 1) / FA_RB;
        for (; n <= nb; n++) rs[n] = n * R / nb;
        return nb;
    }
    for (int r0 = 0; r0 < R; r0 += FA_RB) rs[n++] = r0;
    rs[n] = R;
    return n;
}

/* One key tile [t0, t0 + FA_TK) for every row of the item: QK in chunks of FA_DC dims (a
 * chunk of the K tile stays in L1 while every row block passes over it), the online softmax
 * of each row, then AV in chunks of d (likewise for V). */
static void fa_tile(const gi_attn_args *a, fa_ctx *x, int64_t t0) {
    const int64_t hd = a->hd;
    const int64_t ta = x->kmin > t0 ? x->kmin : t0;
    const int64_t tb = x->kmax < t0 + FA_TK - 1 ? x->kmax : t0 + FA_TK - 1;
    const int ja = (int)(ta - t0), jb = (int)(tb - t0);
    const int timing = __atomic_load_n(&gi_attn_timing, __ATOMIC_RELAXED);
    int64_t ns0 = timing ? gi_attn_now_ns() : 0, ns1 = 0, ns2 = 0;
    const int direct = x->direct, nrb = x->nrb, rbx = x->rbx;
    const int *rs = x->rs;
    /* prefetch: the tile pf->ahead tiles ahead (every kv head of the item), started by the
     * item's first kv head at this tile.  Direct: a line per step of the kernels' loops
     * while the kv head's share (pq lines) lasts; otherwise pq lines before each QK block
     * or d-chunk and each AV d-chunk */
    fa_pf *pf = x->pf;
    if (FA_PF > 0 && pf->tile != t0) {
        const int64_t pa = t0 + pf->ahead * FA_TK, pb0 = pa + FA_TK - 1;
        const int64_t pb = pb0 < x->kmax ? pb0 : x->kmax;
        fa_pf_start(a, pf, pa, pb);
        const int64_t blocks = pa <= pb ? pb / a->bs - pa / a->bs + 1 : 0;
        const int64_t lines = blocks * ((pf->nh * pf->hb + 63) / 64); /* K lines (and V) */
        const int64_t steps =
            direct ? 1 : (hd + FA_DC - 1) / FA_DC + fa_av_chunks(hd, rbx);
        pf->pq = (lines + steps * pf->nh - 1) / (steps * pf->nh);
        pf->credit = 0;
        pf->tile = t0;
    }
    if (FA_PF > 0 && direct) {
        /* the kernels' loop steps on this kv head's tile: QK over d per pass of key vectors,
         * AV over the keys per d-chunk */
        const int64_t nv = (tb / a->bs - ta / a->bs + 1) * (a->bs / VF_N);
        int64_t slots = 0;
        for (int i = 0; i < nrb; i++)
            slots += fa_passes(FA_PWN(rs[i + 1] - rs[i]), nv) * hd +
                     fa_av_chunks(hd, rbx) * (jb - ja + 1);
        pf->credit += pf->pq;
        pf->mask = 0; /* the largest power of two at most slots / credit, less one */
        while (pf->credit > 0 && 2 * (pf->mask + 1) * pf->credit <= slots)
            pf->mask = 2 * pf->mask + 1;
    }
    fa_pf *kpf = FA_PF > 0 && direct ? pf : NULL; /* the kernels' prefetch */
    fa_gather(a, x, t0, ta, tb, !direct);
    int gact[FA_RMAX]; /* gact[i]: row block i has an active row */
    for (int i = 0; i < nrb; i++) {
        gact[i] = 0;
        for (int r = rs[i]; r < rs[i + 1]; r++) {
            x->act[r] = x->lo[r] <= tb && x->hi[r] >= ta;
            gact[i] |= x->act[r];
        }
    }
    /* ---- QK */
    if (direct) {
        /* the key vectors of the tile's blocks, in key order, a pass (fa_pass) of them at a
         * time across blocks */
        const int64_t bs = a->bs, hb = gi_kv_head_bytes(a->kv_dtype, hd, bs);
        const char *kbv[FA_TV];
        int64_t offv[FA_TV], nv = 0;
        for (int64_t b = ta / bs; b <= tb / bs; b++) {
            const char *kb = (const char *)a->k_cache +
                             (a->block_table[b] * a->n_kv + x->kvh) * hb;
            for (int64_t o = 0; o < bs; o += VF_N, nv++) {
                kbv[nv] = kb;
                offv[nv] = o;
            }
        }
        float *p0 = x->p + ((ta / bs) * bs - t0);
        for (int i = 0; i < nrb; i++)
            if (gact[i])
                fa_qk_direct_block(rs[i + 1] - rs[i], a->kv_dtype, x->qs + rs[i] * hd, hd, kbv,
                                   offv, bs, nv, p0 + (int64_t)rs[i] * FA_TK, kpf);
    }
    for (int64_t d0 = 0; !direct && d0 < hd; d0 += FA_DC) {
        const int64_t dn = hd - d0 < FA_DC ? hd - d0 : FA_DC;
        fa_pf_some(pf, pf->pq);
        for (int i = 0; i < nrb; i++) {
            if (!gact[i]) continue;
            const int r0 = rs[i];
            fa_qk_block(rs[i + 1] - r0, d0 == 0, x->qs + r0 * hd + d0, hd, x->kt + d0 * FA_TK,
                        dn, x->p + (int64_t)r0 * FA_TK);
        }
    }
    if (timing) ns1 = gi_attn_now_ns();
    /* ---- softmax */
    const float cap2 = (float)(a->softcap * FA_LOG2E);
    for (int i = 0; i < nrb; i++) {
        if (!gact[i]) continue;
        for (int r = rs[i]; r < rs[i + 1]; r++) {
            float *pr = x->p + (int64_t)r * FA_TK;
            if (x->act[r]) {
                const int64_t lo = x->lo[r] > t0 ? x->lo[r] - t0 : 0;
                const int64_t hi = x->hi[r] < t0 + FA_TK - 1 ? x->hi[r] - t0 : FA_TK - 1;
                x->c[r] = fa_softmax_row(pr, (int)lo, (int)hi, cap2, &x->m[r], &x->l[r]);
            } else { /* no keys here: an exact no-op for this row */
                memset(pr, 0, FA_TK * sizeof(float));
                x->c[r] = 1.0f;
            }
        }
    }
    if (timing) ns2 = gi_attn_now_ns();
    /* ---- AV */
    for (int64_t d0 = 0; d0 < hd;) {
        const int64_t nd = fa_av_extent(d0, hd, rbx);
        if (!kpf) fa_pf_some(pf, pf->pq);
        for (int i = 0; i < nrb; i++) {
            if (!gact[i]) continue;
            const int r0 = rs[i];
            fa_av_block(rs[i + 1] - r0, x->vdt, nd, x->o + r0 * hd, hd,
                        x->p + (int64_t)r0 * FA_TK, x->vp, ja, jb, x->c + r0, d0, kpf);
        }
        d0 += nd;
    }
    if (timing) {
        GI_ATTN_PHASE_ADD(0, ns1 - ns0);
        GI_ATTN_PHASE_ADD(1, ns2 - ns1);
        GI_ATTN_PHASE_ADD(2, gi_attn_now_ns() - ns2);
    }
}

/* ============================================================================ plan and run */

GI_INLINE int64_t fa_row_lo(const gi_attn_args *a, int64_t p) {
    if (a->window <= 0) return 0;
    int64_t lo = p - a->window + 1;
    return lo > 0 ? lo : 0;
}

/* K and V bytes of one key tile of nh kv heads */
GI_INLINE int64_t fa_tile_bytes(const gi_attn_args *a, int64_t nh) {
    return 2 * FA_TK * nh * gi_kv_head_bytes(a->kv_dtype, a->hd, a->bs) / a->bs;
}

/* work items before the key split: query blocks x kv-head spans x head groups */
GI_INLINE int64_t fa_items(const gi_attn_args *a, int64_t tq, int64_t span, int64_t nparts) {
    return (a->T + tq - 1) / tq * ((a->n_kv + span - 1) / span) * nparts;
}

#define FA_ALIGN(n) (((n) + 15) & ~(int64_t)15) /* floats, to 64 bytes */
#define FA_PART(hd) FA_ALIGN((hd) + 2) /* floats of one row's chunk partial: o, m, l */
#define FA_CTX_FLOATS FA_ALIGN((int64_t)((sizeof(fa_ctx) + 3) / 4)) /* an fa_ctx in scratch */

/* R = tq * nh <= FA_RMAX rows per kv head; smaller query blocks while there are fewer items
 * than threads.  A few queries over at least two chunks of keys (a decode step) take several
 * kv heads per item (kvspan): a block holds the keys of every kv head side by side, so the
 * item reads each block's heads in one run, in memory order, where items of one kv head each
 * would stride through the blocks (measured 1.2x slower from memory on a Zen 4).  The span
 * starts at every kv head and halves while a tile of it is over FA_SPAN_BYTES (the tile
 * ahead must stay in L2 beside the current one), then while the items (with the split
 * below) cannot occupy the threads twice over.  Then, if the caller allows it (split_ok: it
 * provides shared memory), the keys of each (query block, head span, head group) are split
 * by chunk over kchunks items while the groups alone cannot occupy the threads twice over.
 * The tiling, the span and the split never change a result. */
static void GI(attn_fast_plan)(gi_attn_args *a, int nthreads) {
    const int64_t G = a->H / a->n_kv;
    const int64_t rows = FA_RMAX;
    const int64_t nh = G < rows ? G : rows;
    const int64_t nparts = (G + nh - 1) / nh;
    int64_t tq = rows / nh;
    if (tq > a->T) tq = a->T;
    if (tq < 1) tq = 1;
    while (fa_items(a, tq, 1, nparts) < nthreads && tq > 1) tq = (tq + 1) / 2;
    a->tq = tq;
    a->nh = nh;
    a->nparts = nparts;
    int64_t pmax = a->max_pos;
    for (int64_t t = 0; t < a->T; t++) pmax = a->q_pos[t] > pmax ? a->q_pos[t] : pmax;
    const int64_t nch = pmax / FA_CH + 1;
    const int split = a->split_ok && nthreads > 1;
    int64_t span = 1;
    if (tq >= a->T && nparts == 1 && a->n_kv > 1) {
        const int64_t keys = a->window > 0 && a->window < pmax + 1 ? a->window : pmax + 1;
        const int64_t kc = (keys + FA_CH - 1) / FA_CH; /* chunks a row's keys span, at least */
        if (kc >= 2) {
            span = a->n_kv;
            while (span > 1 && fa_tile_bytes(a, span) > FA_SPAN_BYTES) span = (span + 1) / 2;
            while (nthreads > 1 && span > 1 &&
                   fa_items(a, tq, span, 1) * (split ? kc : 1) < 2 * (int64_t)nthreads)
                span = (span + 1) / 2;
        }
    }
    a->kvspan = span;
    const int64_t groups = fa_items(a, tq, span, nparts);
    const int64_t R = tq * nh;
    a->kchunks = 1;
    a->shared_bytes = 0;
    if (split && groups < 2 * (int64_t)nthreads && nch > 1) {
        a->kchunks = nch;
        a->shared_bytes = 64 * ((groups * 8 + 63) / 64) /* counters, int64 */
                          + groups * nch * span * R * FA_PART(a->hd) * (int64_t)sizeof(float);
    }
    a->n_items = groups * a->kchunks;
    const int64_t floats = span * (FA_CTX_FLOATS + 3 * FA_ALIGN(R * a->hd)) +
                           FA_ALIGN(R * FA_TK) + 2 * FA_ALIGN(a->hd * FA_TK) +
                           2 * FA_TK /* pointers */ + 16 + 16 /* alignment */;
    a->scratch_doubles = (floats + 1) / 2;
}

/* rows [lo, hi] of the item that intersect chunk ch */
GI_INLINE int fa_row_in_chunk(const fa_ctx *x, int r, int64_t ch) {
    return x->lo[r] < (ch + 1) * FA_CH && x->hi[r] >= ch * FA_CH;
}

/* the tiles of chunk ch for every row of the item's ns kv heads (the same query rows and key
 * range), from a fresh online softmax; each tile for every kv head in turn */
static void fa_chunk(const gi_attn_args *a, fa_ctx *xs, int ns, int64_t ch) {
    for (int s = 0; s < ns; s++) {
        fa_ctx *x = &xs[s];
        for (int r = 0; r < x->R; r++) {
            x->m[r] = -INFINITY;
            x->l[r] = 0.0f;
        }
        memset(x->o, 0, (size_t)x->R * (size_t)a->hd * sizeof(float));
    }
    int64_t t = ch * FA_CH, kmin_tile = (xs->kmin / FA_TK) * FA_TK;
    if (t < kmin_tile) t = kmin_tile;
    const int64_t end = (ch + 1) * FA_CH - 1 < xs->kmax ? (ch + 1) * FA_CH - 1 : xs->kmax;
    for (; t <= end; t += FA_TK)
        for (int s = 0; s < ns; s++) fa_tile(a, &xs[s], t);
}

/* fold row r's chunk (m, l, o) into (M, L, O) (see the file comment) */
static void fa_fold(int64_t hd, fa_ctx *x, int r, float m, float l, const float *o) {
    float *O = x->O + r * hd;
    if (x->nf[r]++ == 0) {
        x->M[r] = m;
        x->L[r] = l;
        memcpy(O, o, (size_t)hd * sizeof(float));
        return;
    }
    const float M = x->M[r], Mn = m > M ? m : M;
    const float ca = M == Mn ? 1.0f : fa_exp2_1(M - Mn);
    const float cb = m == Mn ? 1.0f : fa_exp2_1(m - Mn);
    x->M[r] = Mn;
    x->L[r] = x->L[r] * ca + l * cb;
    const vf av = vf_set1(ca), bv = vf_set1(cb);
    int64_t d = 0;
    for (; d + VF_N <= hd; d += VF_N)
        vf_store(O + d, vf_add(vf_mul(vf_load(O + d), av), vf_mul(vf_load(o + d), bv)));
    if (d < hd) {
        const int n = (int)(hd - d);
        vf_store_n(O + d, vf_add(vf_mul(vf_load_n(O + d, n), av), vf_mul(vf_load_n(o + d, n), bv)),
                   n);
    }
}

/* out = O / L + 0: adding +0 turns a -0 into +0 and changes nothing else.  The sign of a
 * zero in o is the one thing the other rows of an item can change (a key outside the row's
 * range adds 0 * v, and -0 + +0 = +0), so this makes the bits the row's own. */
static void fa_finish(int64_t hd, fa_ctx *x) {
    const vf zero = vf_zero();
    for (int r = 0; r < x->R; r++) {
        const float s = x->sink[r];
        if (s != -INFINITY) { /* the sink as a last chunk: m = s, l = 1, o = 0 */
            float *O = x->O + r * hd;
            const float M = x->M[r], Mn = s > M ? s : M;
            const float ca = M == Mn ? 1.0f : fa_exp2_1(M - Mn);
            const float cb = s == Mn ? 1.0f : fa_exp2_1(s - Mn);
            x->M[r] = Mn;
            x->L[r] = x->L[r] * ca + cb;
            const vf av = vf_set1(ca);
            int64_t d = 0;
            for (; d + VF_N <= hd; d += VF_N) vf_store(O + d, vf_mul(vf_load(O + d), av));
            if (d < hd) vf_store_n(O + d, vf_mul(vf_load_n(O + d, (int)(hd - d)), av), (int)(hd - d));
        }
        const vf lv = vf_set1(x->L[r]);
        const float *o = x->O + r * hd;
        int64_t d = 0;
        for (; d + VF_N <= hd; d += VF_N)
            vf_store(x->orow[r] + d, vf_add(vf_div(vf_load(o + d), lv), zero));
        if (d < hd) {
            const int n = (int)(hd - d);
            vf_store_n(x->orow[r] + d, vf_add(vf_div(vf_load_n(o + d, n), lv), zero), n);
        }
    }
}

static void fa_scale_q(int64_t hd, float sc, fa_ctx *x) {
    for (int r = 0; r < x->R; r++)
        for (int64_t d = 0; d < hd; d++) x->qs[r * hd + d] = x->qrow[r][d] * sc;
}

/* the union key range [kmin, kmax] of the queries [t0, t0 + nt) */
GI_INLINE void fa_key_range(const gi_attn_args *a, int64_t t0, int64_t nt, int64_t *kmin,
                            int64_t *kmax) {
    *kmin = INT64_MAX;
    *kmax = -1;
    for (int64_t t = t0; t < t0 + nt; t++) {
        const int64_t lo = fa_row_lo(a, a->q_pos[t]);
        *kmin = lo < *kmin ? lo : *kmin;
        *kmax = a->q_pos[t] > *kmax ? a->q_pos[t] : *kmax;
    }
}

/* kv head kvh's rows of the query block [t0, t0 + nt) x query heads [h0, h0 + nhh) of its
 * group: their key ranges, row blocks, q and out rows, sinks */
static void fa_rows(const gi_attn_args *a, fa_ctx *x, int64_t t0, int64_t nt, int64_t h0,
                    int64_t nhh) {
    const int64_t G = a->H / a->n_kv, hd = a->hd;
    x->R = (int)(nt * nhh);
    fa_key_range(a, t0, nt, &x->kmin, &x->kmax);
    x->direct = fa_direct(a, x->R);
    x->nrb = fa_row_blocks(x->R, x->direct, x->rs);
    x->rbx = 0;
    for (int i = 0; i < x->nrb; i++)
        x->rbx = x->rs[i + 1] - x->rs[i] > x->rbx ? x->rs[i + 1] - x->rs[i] : x->rbx;
    /* a float V tile when several gathered row blocks read it */
    x->vdt = x->R > FA_RB && !x->direct ? GI_KV_F32 : a->kv_dtype;
    for (int64_t ti = 0; ti < nt; ti++) {
        const int64_t t = t0 + ti, pos = a->q_pos[t], lo = fa_row_lo(a, pos);
        for (int64_t hj = 0; hj < nhh; hj++) {
            const int r = (int)(ti * nhh + hj);
            const int64_t h = x->kvh * G + h0 + hj;
            x->lo[r] = lo;
            x->hi[r] = pos;
            x->orow[r] = a->out + (t * a->H + h) * hd;
            x->nf[r] = 0;
            x->qrow[r] = a->q + (t * a->H + h) * hd;
            x->sink[r] = a->sinks ? (float)((double)a->sinks[h] * FA_LOG2E) : -INFINITY;
        }
    }
}

/* the query block [t0, t0 + nt) of the items of group `group` (a query block x kv-head span x
 * head group) */
GI_INLINE void fa_group_queries(const gi_attn_args *a, int64_t group, int64_t *t0, int64_t *nt) {
    const int64_t per_tile = (a->n_kv + a->kvspan - 1) / a->kvspan * a->nparts;
    const int64_t n_tiles = (a->T + a->tq - 1) / a->tq;
    const int64_t tile = n_tiles - 1 - group / per_tile; /* later queries (more keys) first */
    *t0 = tile * a->tq;
    *nt = a->T - *t0 < a->tq ? a->T - *t0 : a->tq;
}

static void GI(attn_fast_run)(const gi_attn_args *a, int64_t item, double *scratch) {
    const int64_t G = a->H / a->n_kv, hd = a->hd;
    const int64_t group = item / a->kchunks, slot = item % a->kchunks;
    const int64_t per_tile = (a->n_kv + a->kvspan - 1) / a->kvspan * a->nparts;
    const int64_t rem = group % per_tile, part = rem % a->nparts;
    int64_t t0, nt;
    fa_group_queries(a, group, &t0, &nt);
    const int64_t h0 = part * a->nh;
    const int64_t nhh = G - h0 < a->nh ? G - h0 : a->nh;
    const int64_t kv0 = rem / a->nparts * a->kvspan; /* kv heads [kv0, kv0 + ns) */
    const int ns = (int)(a->n_kv - kv0 < a->kvspan ? a->n_kv - kv0 : a->kvspan);
    const int64_t R = nt * nhh;
    /* split: the chunks that hold keys of the block's queries ([kmin, kmax], the same for
     * every head); an item of another chunk has nothing to do.  A bound op's kchunks covers
     * max_pos, the cache's capacity: most of its items are of chunks past the positions of
     * the step, and return here before any setup */
    int64_t ch0 = 0, ch1 = 0;
    if (a->kchunks > 1) {
        int64_t lo, hi;
        fa_key_range(a, t0, nt, &lo, &hi);
        ch0 = lo / FA_CH;
        ch1 = hi / FA_CH;
        if (slot < ch0 || slot > ch1) return;
    }
    const float sc = (float)(a->scale * FA_LOG2E); /* scores in log2 units */
    fa_pf pf = {0};
    pf.h0 = kv0;
    pf.nh = ns;
    pf.ahead = fa_tile_bytes(a, ns) > FA_PF_BYTES && FA_PF > 1 ? 1 : FA_PF;
    pf.tile = -1;
    pf.hc = ns; /* nothing to walk yet */
    pf.dv = (ptrdiff_t)((uintptr_t)a->v_cache - (uintptr_t)a->k_cache);
    pf.bt = a->block_table;
    pf.kc = (const char *)a->k_cache;
    pf.n_kv = a->n_kv;
    pf.hb = gi_kv_head_bytes(a->kv_dtype, hd, a->bs);

    /* ---- scratch: per kv head, its context | qs (R, hd) | o (R, hd) | O (R, hd); then, for
     * one tile of one kv head at a time: p (R, TK) | kt (hd, TK) | vt (TK, hd) | vp */
    float *f = (float *)gi_attn_scratch64(scratch);
    fa_ctx *xs = (fa_ctx *)(void *)f;
    f += ns * FA_CTX_FLOATS;
    float *p = f + ns * 3 * FA_ALIGN(R * hd);
    float *kt = p + FA_ALIGN(R * FA_TK);
    float *vt = kt + FA_ALIGN(hd * FA_TK);
    const char **vp = (const char **)(void *)(vt + FA_ALIGN(hd * FA_TK));
    for (int s = 0; s < ns; s++) {
        fa_ctx *x = &xs[s];
        x->kvh = kv0 + s;
        x->pf = &pf;
        x->qs = f + s * 3 * FA_ALIGN(R * hd);
        x->o = x->qs + FA_ALIGN(R * hd);
        x->O = x->o + FA_ALIGN(R * hd);
        x->p = p;
        x->kt = kt;
        x->vt = vt;
        x->vp = vp;
        fa_rows(a, x, t0, nt, h0, nhh);
    }
    const int64_t kmin = xs->kmin, kmax = xs->kmax;

    if (a->kchunks == 1) { /* every chunk here, folded in order */
        for (int s = 0; s < ns; s++) fa_scale_q(hd, sc, &xs[s]);
        for (int64_t ch = kmin / FA_CH; ch <= kmax / FA_CH; ch++) {
            fa_chunk(a, xs, ns, ch);
            for (int s = 0; s < ns; s++) {
                fa_ctx *x = &xs[s];
                for (int r = 0; r < x->R; r++)
                    if (fa_row_in_chunk(x, r, ch))
                        fa_fold(hd, x, r, x->m[r], x->l[r], x->o + r * hd);
            }
        }
        for (int s = 0; s < ns; s++) fa_finish(hd, &xs[s]);
        return;
    }

    /* ---- split: this item computes chunk `slot`, the last of the group's ch1 - ch0 + 1 items
     * with keys folds them all and sets the group's counter back to 0 for the next run (the
     * op's next run starts after this one has finished); a group's partials are (kchunks,
     * kvspan * tq * nh rows, pw), row s * R + r */
    const int64_t groups = a->n_items / a->kchunks, rg = a->kvspan * a->tq * a->nh;
    const int64_t pw = FA_PART(hd);
    int64_t *count = (int64_t *)a->shared;
    float *parts = (float *)((char *)a->shared + 64 * ((groups * 8 + 63) / 64)) +
                   group * a->kchunks * rg * pw;
    for (int s = 0; s < ns; s++) fa_scale_q(hd, sc, &xs[s]);
    fa_chunk(a, xs, ns, slot);
    for (int s = 0; s < ns; s++)
        for (int r = 0; r < R; r++) {
            float *pr = parts + (slot * rg + s * R + r) * pw;
            memcpy(pr, xs[s].o + r * hd, (size_t)hd * sizeof(float));
            pr[hd] = xs[s].m[r];
            pr[hd + 1] = xs[s].l[r];
        }
    if (__atomic_add_fetch(&count[group], 1, __ATOMIC_ACQ_REL) != ch1 - ch0 + 1) return;
    __atomic_store_n(&count[group], 0, __ATOMIC_RELAXED);
    for (int64_t c = ch0; c <= ch1; c++)
        for (int s = 0; s < ns; s++)
            for (int r = 0; r < R; r++)
                if (fa_row_in_chunk(&xs[s], r, c)) {
                    const float *pr = parts + (c * rg + s * R + r) * pw;
                    fa_fold(hd, &xs[s], r, pr[hd], pr[hd + 1], pr);
                }
    for (int s = 0; s < ns; s++) fa_finish(hd, &xs[s]);
}

/* ============================================================================ shares */

/* Share s of nshares (a bound op's; run by one thread): its items in order, run with scratch,
 * or (items != NULL) only listed in items; returns how many.  Not split (kchunks == 1): items
 * s, s + nshares, ...  Split: the items with keys in this run, in (group, chunk) order, cut
 * into nshares runs of consecutive items with nearly equal key counts (an item goes to the
 * share whose part of the keys holds its middle key), so a thread streams through
 * consecutive chunks and the look-ahead prefetch of a chunk's last tiles lands in the next
 * chunk it runs; striped (item i to share i % nshares), those tiles were another thread's and
 * every chunk started from memory: a decode step's attention at 4,000 tokens (f16, 2 threads,
 * a Zen 4; the 1B, 3B and 8B shapes) took 1.01-1.09x as long.  Which thread runs an item
 * never changes a result. */
static int64_t GI(attn_fast_share)(const gi_attn_args *a, int64_t s, int64_t nshares,
                                   double *scratch, int64_t *items) {
    int64_t n = 0;
    if (a->kchunks <= 1) {
        for (int64_t it = s; it < a->n_items; it += nshares, n++) {
            if (items) items[n] = it;
            else GI(attn_fast_run)(a, it, scratch);
        }
        return n;
    }
    const int64_t groups = a->n_items / a->kchunks;
    int64_t total = 0, before = 0, t0, nt, lo, hi;
    for (int64_t g = 0; g < groups; g++) {
        fa_group_queries(a, g, &t0, &nt);
        fa_key_range(a, t0, nt, &lo, &hi);
        total += hi - lo + 1;
    }
    for (int64_t g = 0; g < groups; g++) {
        fa_group_queries(a, g, &t0, &nt);
        fa_key_range(a, t0, nt, &lo, &hi);
        for (int64_t ch = lo / FA_CH; ch <= hi / FA_CH; ch++) {
            const int64_t ka = ch * FA_CH > lo ? ch * FA_CH : lo;
            const int64_t kb = (ch + 1) * FA_CH - 1 < hi ? (ch + 1) * FA_CH - 1 : hi;
            const int64_t w = kb - ka + 1, owner = (2 * before + w) * nshares / (2 * total);
            before += w;
            if (owner < s) continue;
            if (owner > s) return n;
            if (items) items[n] = g * a->kchunks + ch;
            else GI(attn_fast_run)(a, g * a->kchunks + ch, scratch);
            n++;
        }
    }
    return n;
}

/* ============================================================================ table */

const gi_attn_fast_ops GI(gi_attn_fast_ops) = {GI(attn_fast_plan), GI(attn_fast_run),
                                               GI(attn_fast_share)};
