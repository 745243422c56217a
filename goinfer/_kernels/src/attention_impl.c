/* Exact attention over the paged KV cache (see attention.h), compiled once per ISA variant.
 *
 * For query row (t, h) at position p over keys j = lo..p of kv head h / G (G = H / n_kv):
 *   s_j = scale * sum_d (double)q[d] * (double)k_j[d]          (d in order; product exact)
 *   s_j = softcap * tanh(s_j / softcap)                         (if softcap > 0)
 *   mx  = max(max_j s_j, sink)                                  (sink = sinks[h], or -inf)
 *   e_j = trunc29(exp(s_j - mx))                                (own polynomial exp, then
 *         the significand cut to 29 bits: e_j * v (24-bit float) is then exact in double)
 *   l   = sum_j e_j                 in key order, from 0.0; then l += trunc29(exp(sink - mx))
 *   o_d = sum_j e_j * (double)v_j[d] in key order, from 0.0
 *   out = float(o_d / l)
 * (without a sink the added weight is exactly 0 and l is unchanged)
 * Every product that is accumulated is exact in double, so the explicit FMA of the AVX
 * variants and the mul+add of the portable build give the same bits: all three variants
 * agree bit for bit.  The weights are flushed to 0 for s_j - mx < -600 (e_j < 2^-865), which
 * keeps e_j * v away from double subnormals (exactness) and is far below float resolution.
 *
 * Work item = a tile of tq consecutive queries x nh query heads of one kv head (R <= 12 rows).
 * The item's keys [kmin, kmax] (union of its rows' ranges) are read once for all R rows:
 *   QK  vectorized across the keys of a block (k_cache is transposed per block), register
 *       blocked RB rows x NV key vectors, d innermost;
 *   softmax per row over its own range, in a per-thread score scratch (R x span doubles);
 *   AV  vectorized across d, register blocked RB rows x DV vectors of d: one d-chunk at a
 *       time over all the item's keys in order, its accumulators in registers throughout.
 * Where the R rows do not fit the registers, QK runs them in passes of at most QK_PASS rows
 * over each key group while it is in L1, AV in passes of at most AV_PASS rows over each
 * d-chunk (an f16 or q8_0 chunk converted to double once for all passes).
 * A row's operation sequence does not depend on the other rows of its tile: lanes of keys
 * outside a row's range are computed (where the block is shared) but never used.
 *
 * Cache types (kv_types.h): k and v are read as stored (f32, f16 by F16C, q8_0 as s * q) and
 * converted exactly to double, so the result is this function of the stored values, the same
 * bits as over a float32 cache holding them.
 */
#include "attention.h"
#include "gi_vmath.h"
#include "kv_types.h"

/* ============================================================================ weights */

/* e = trunc29(exp(x)) for x = s - mx <= 0.  The exp is the recipe of gi_vd_exp (gi_vmath.h)
 * with a shorter polynomial, since the result is cut to 29 significant bits anyway:
 * e^r = 1 + r + r^2 P(r), P of degree 6 fitted on Chebyshev nodes of |r| <= ln2/2 (relative
 * error 4.3e-12, vs 2^-28 = 3.7e-9 for the cut).  n <= 0 here, so 2^n is built directly
 * (n >= -866 for x >= -600, a normal double); x < -600 (and -inf) give 0, NaN stays NaN. */
#define GI_W_MASK (~((1ull << 24) - 1ull)) /* keep 28 of 52 fraction bits */
#define GI_W_P0 0x1.fffffffffe067p-2
#define GI_W_P1 0x1.55555567514cfp-3
#define GI_W_P2 0x1.55555565c5e3dp-5
#define GI_W_P3 0x1.1110c638709acp-7
#define GI_W_P4 0x1.6c166be5dbe9cp-10
#define GI_W_P5 0x1.a1516cfd1180cp-13
#define GI_W_P6 0x1.a136b27e95ecep-16

GI_INLINE vd attn_weight(vd x) {
    vd t = vd_add(vd_mul(x, vd_set1(GI_LOG2E)), vd_set1(GI_MAGIC_D));
    vd n = vd_sub(t, vd_set1(GI_MAGIC_D));
    vd r = vd_sub(x, vd_mul(n, vd_set1(GI_LN2HI_D)));
    r = vd_sub(r, vd_mul(n, vd_set1(GI_LN2LO_D)));
    vd p = vd_set1(GI_W_P6);
    p = vd_add(vd_mul(p, r), vd_set1(GI_W_P5));
    p = vd_add(vd_mul(p, r), vd_set1(GI_W_P4));
    p = vd_add(vd_mul(p, r), vd_set1(GI_W_P3));
    p = vd_add(vd_mul(p, r), vd_set1(GI_W_P2));
    p = vd_add(vd_mul(p, r), vd_set1(GI_W_P1));
    p = vd_add(vd_mul(p, r), vd_set1(GI_W_P0));
    vd y = vd_add(vd_mul(vd_mul(r, r), p), r);
    y = vd_add(y, vd_set1(1.0));
    y = vd_mul(y, vd_from_bits(vdi_shl(vdi_add(vd_bits(t), 1023), 52))); /* * 2^n */
    y = vd_from_bits(vdi_and(vd_bits(y), GI_W_MASK));
    return vd_sel_lt(x, vd_set1(GI_EXPD_XMIN), vd_set1(0.0), y);
}

/* ============================================================================ register budgets */
/* QK: RB rows x NV key vectors of accumulators; AV: RB rows x DV d-vectors (+DV for v). */
#if defined(GI_VARIANT_AVX512)
#define QK_NV(RB) ((RB) <= 3 ? 8 : (RB) <= 6 ? 4 : 2)
#define AV_DV(RB) ((RB) <= 2 ? 8 : (RB) <= 6 ? 4 : 2)
#else
#define QK_NV(RB) ((RB) <= 1 ? 8 : (RB) <= 3 ? 4 : (RB) <= 6 ? 2 : 1)
#define AV_DV(RB) ((RB) <= 1 ? 4 : (RB) <= 6 ? 2 : 1)
#endif
#define GI_MAXV 8

/* Rows per pass.  With 16 vector registers (avx2) an item of 8 or 12 rows runs QK with one
 * key vector per step (a load and two converts per RB FMAs, RB broadcasts) and AV with one
 * d-vector: in passes of 4 rows x 2 key vectors (QK) and 6 rows x 2 d-vectors (AV) the QK of a
 * 512-token causal prefill took 14.5-17.1 -> 13.6 ms on a Zen 4 (f16 cache, one thread,
 * shapes 16x2x128, 32x8x64, 8x1x256), AV about 5% less.  AVX-512 (32 registers) and the
 * portable build are fastest without passes. */
#if defined(GI_VARIANT_AVX2)
#define QK_PASS 4
#define AV_PASS 6
#else
#define QK_PASS GI_ATTN_RMAX
#define AV_PASS GI_ATTN_RMAX
#endif
/* rows of each pass but the last, for R rows in passes of at most P: ceil(R / ceil(R / P)) */
#define PASS_ROWS(R, P) (((R) + ((R) + (P) - 1) / (P) - 1) / (((R) + (P) - 1) / (P)))

/* software prefetch (a hint; no effect on results) */
#if defined(GI_ATTN_NO_PREFETCH)
#define GI_PREFETCH(p) ((void)(p))
#else
#define GI_PREFETCH(p) __builtin_prefetch(p)
#endif
#define GI_PF_STEP (VD_N >= 16 ? 1 : 16 / VD_N) /* key vectors per 64-byte line */

/* ============================================================================ item context */

typedef struct {
    int R;                           /* rows: r = ti * nhh + hj */
    int64_t kvh;                     /* kv head */
    int64_t b0, b1;                  /* block_table indices spanned by the item */
    int64_t kbase;                   /* = b0 * bs: key position of score column 0 */
    int64_t jmin, jmax;              /* union key range, relative to kbase */
    int64_t ss;                      /* score row stride (doubles) */
    int64_t lo[GI_ATTN_RMAX];        /* row key range [lo, hi], relative to kbase */
    int64_t hi[GI_ATTN_RMAX];
    float *orow[GI_ATTN_RMAX];       /* out rows (hd floats) */
    double *qd;                      /* (R, hd) queries in double */
    double *o;                       /* (R, hd) AV accumulators */
    double *sc;                      /* (R, ss) scores, then weights */
    float *kf;                       /* multi-pass items: a K group in float32 */
    double *vd;                      /* and a V chunk in double */
    double sink[GI_ATTN_RMAX];       /* row's sink logit (-inf: none) */
    double esink[GI_ATTN_RMAX];      /* its weight trunc29(exp(sink - mx)), added to l */
} item_ctx;

/* ============================================================================ QK */

/* One key vector (VD_N keys of one block, from key offset off) of row d of a K head-block kb
 * (kv_types.h layout, row stride bs) in double; sc: its q8_0 scales for the current 32-row
 * group. */
GI_INLINE vd k_load(const int DT, const int FULL, const char *kb, int64_t bs, int64_t d,
                    int64_t off, int n, vd sc) {
    if (DT == GI_KV_F32) {
        const float *p = (const float *)kb + d * bs + off;
        return FULL ? vd_loadps(p) : vd_loadps_n(p, n);
    }
    if (DT == GI_KV_F16) {
        const uint16_t *p = (const uint16_t *)kb + d * bs + off;
        return FULL ? vd_load_f16(p) : vd_load_f16_n(p, n);
    }
    const int8_t *p = (const int8_t *)kb + d * bs + off;
    return vd_mul(FULL ? vd_load_i8(p) : vd_load_i8_n(p, n), sc); /* s * q: exact */
}

/* sc[v]: the q8_0 scales of key vector v (head-block kb[v], offset ko[v], kn[v] valid lanes)
 * for the 32-row group of row d */
GI_INLINE void k_scales(const int NV, const int FULL, const char *const *kb, const int64_t *ko,
                        const int *kn, int64_t hd, int64_t bs, int64_t d, vd *sc) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) {
        const uint16_t *s16 = (const uint16_t *)(kb[v] + hd * bs) + (d / GI_KV_QB) * bs;
        sc[v] = vd_load_scales(s16 + ko[v], FULL ? VD_N : kn[v]);
    }
}

/* acc[r][v] = sum_d qd[r][d] * k[d][v-th key vector] for the RB rows r0.. of the item (qd:
 * its row r0); then scaled and stored at sp[v] + (r0 + r) * ss (softmax_row applies the soft
 * cap: its constants, live here, took registers the loop needs).  kb[v]: the
 * key vector's head-block, ko[v]: its first key's offset in the block, kn[v]: its valid lanes
 * (FULL: all VD_N).  pf[v]: the next group's key vectors (byte addresses at d = 0, row stride
 * pfs bytes), prefetched along d (the cache is far larger than L2 at long contexts and blocks
 * are scattered). */
GI_INLINE void qk_group(const int RB, const int NV, const int FULL, const int DT,
                        const gi_attn_args *a, const double *qd, const char *const *kb,
                        int64_t kbs, const int64_t *ko, const int *kn, const char *const *pf,
                        int64_t pfs, double *const *sp, int64_t r0, int64_t ss) {
    const int64_t hd = a->hd, bs = a->bs;
    vd acc[GI_ATTN_RMAX][GI_MAXV], sc[GI_MAXV];
    const int pstep = DT == GI_KV_F32 ? GI_PF_STEP : DT == GI_KV_F16 ? 2 * GI_PF_STEP
                                                                     : 4 * GI_PF_STEP;
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) acc[r][v] = vd_zero();
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) sc[v] = vd_zero();
    for (int64_t d = 0; d < hd; d++) {
        if (DT == GI_KV_Q8_0 && d % GI_KV_QB == 0) k_scales(NV, FULL, kb, ko, kn, hd, bs, d, sc);
#pragma GCC unroll 8
        for (int v = 0; v < NV; v += pstep) GI_PREFETCH(pf[v] + d * pfs);
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) {
            vd kv = k_load(DT, FULL, kb[v], kbs, d, ko[v], kn[v], sc[v]);
#pragma GCC unroll 16
            for (int r = 0; r < RB; r++)
                acc[r][v] = vd_fma_exact(vd_set1(qd[r * hd + d]), kv, acc[r][v]);
        }
    }
    const vd sv = vd_set1(a->scale); /* read only now: not held in a register in the loop */
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++) {
            const vd x = vd_mul(acc[r][v], sv);
            if (FULL)
                vd_store(sp[v] + (r0 + r) * ss, x);
            else
                vd_store_n(sp[v] + (r0 + r) * ss, x, kn[v]);
        }
}

/* the next (up to) NV key vectors of blocks b0..b1 from the cursor (bi, off); a group may
 * span blocks.  Empty slots repeat slot 0 with kn = 0 (fully masked).  Returns the count.
 * pf[v]: byte address of the vector at d = 0 (for prefetching). */
GI_INLINE int qk_fill(const int NV, const int DT, const gi_attn_args *a, const item_ctx *c,
                      int64_t *bi, int64_t *off, const char **kb, int64_t *ko,
                      const char **pf, double **sp, int *kn) {
    const int64_t hb = gi_kv_head_bytes(DT, a->hd, a->bs);
    const int64_t esz = DT == GI_KV_F32 ? 4 : DT == GI_KV_F16 ? 2 : 1;
    int nv = 0;
    while (nv < NV && *bi <= c->b1) {
        const int64_t blk = a->block_table[*bi];
        kb[nv] = (const char *)a->k_cache + (blk * a->n_kv + c->kvh) * hb;
        ko[nv] = *off;
        pf[nv] = kb[nv] + *off * esz;
        sp[nv] = c->sc + (*bi - c->b0) * a->bs + *off;
        kn[nv] = (int)(a->bs - *off < VD_N ? a->bs - *off : VD_N);
        nv++;
        *off += VD_N;
        if (*off >= a->bs) {
            *off = 0;
            (*bi)++;
        }
    }
    for (int v = nv; v < NV && nv > 0; v++) {
        kb[v] = kb[0];
        ko[v] = ko[0];
        pf[v] = pf[0];
        sp[v] = sp[0];
        kn[v] = 0;
    }
    return nv;
}

/* VD_N stored values -> float32 at dst (exact: every stored value has at most 19 significant
 * bits; lanes past n are 0): f16 by one F16C convert, q8_0 through k_load */
GI_INLINE void k_store_f32(const int DT, const int FULL, const char *kb, int64_t bs, int64_t d,
                           int64_t off, int n, vd sc, float *dst) {
#if defined(GI_VARIANT_AVX2)
    if (DT == GI_KV_F16 && FULL) {
        const uint16_t *p = (const uint16_t *)kb + d * bs + off;
        _mm_storeu_ps(dst, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)p)));
        return;
    }
#endif
    vd_storeps(dst, k_load(DT, FULL, kb, bs, d, off, n, sc));
}

/* the group's NV key vectors in float32, once for all passes: kf (hd, NV, VD_N) */
GI_INLINE void k_convert(const int NV, const int FULL, const int DT, const gi_attn_args *a,
                         const char *const *kb, const int64_t *ko, const int *kn, float *kf) {
    const int64_t hd = a->hd, bs = a->bs;
    vd sc[GI_MAXV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; v++) sc[v] = vd_zero();
    for (int64_t d = 0; d < hd; d++) {
        if (DT == GI_KV_Q8_0 && d % GI_KV_QB == 0) k_scales(NV, FULL, kb, ko, kn, hd, bs, d, sc);
#pragma GCC unroll 8
        for (int v = 0; v < NV; v++)
            k_store_f32(DT, FULL, kb[v], bs, d, ko[v], kn[v], sc[v], kf + (d * NV + v) * VD_N);
    }
}

/* the R rows' scores of one group of NV key vectors (FULL: all lanes valid), in passes of P
 * rows (the last: the rest) while the group's K lines are in L1.  With more than one pass an
 * f16 or q8_0 group is converted to float32 first (c->kf), once rather than per pass, and the
 * passes read it as a float32 cache (the same values, so the same bits). */
GI_INLINE void qk_passes(const int R, const int P, const int NV, const int FULL, const int DT,
                         const gi_attn_args *a, const item_ctx *c, const char *const *kb,
                         const int64_t *ko, const int *kn, const char *const *pf, int64_t pfs,
                         double *const *sp) {
    const int np = (R + P - 1) / P, PL = R - (np - 1) * P;
    const int nfull = PL == P ? np : np - 1;
    if (np > 1 && DT != GI_KV_F32) {
        const char *kc[GI_MAXV];
        const int64_t zo[GI_MAXV] = {0};
        k_convert(NV, FULL, DT, a, kb, ko, kn, c->kf);
        for (int v = 0; v < NV; v++) kc[v] = (const char *)(c->kf + v * VD_N);
        for (int p = 0; p < nfull; p++)
            qk_group(P, NV, FULL, GI_KV_F32, a, c->qd + (int64_t)p * P * a->hd, kc, NV * VD_N,
                     zo, kn, pf, pfs, sp, (int64_t)p * P, c->ss);
        if (PL != P)
            qk_group(PL, NV, FULL, GI_KV_F32, a, c->qd + (int64_t)(np - 1) * P * a->hd, kc,
                     NV * VD_N, zo, kn, pf, pfs, sp, (int64_t)(np - 1) * P, c->ss);
        return;
    }
    for (int p = 0; p < nfull; p++)
        qk_group(P, NV, FULL, DT, a, c->qd + (int64_t)p * P * a->hd, kb, a->bs, ko, kn, pf, pfs,
                 sp, (int64_t)p * P, c->ss);
    if (PL != P)
        qk_group(PL, NV, FULL, DT, a, c->qd + (int64_t)(np - 1) * P * a->hd, kb, a->bs, ko, kn,
                 pf, pfs, sp, (int64_t)(np - 1) * P, c->ss);
}

/* scores of all key vectors of blocks b0..b1, NV at a time, one group prefetched ahead */
GI_INLINE void qk_rows(const int R, const int DT, const gi_attn_args *a, const item_ctx *c) {
    const int P = PASS_ROWS(R, QK_PASS), NV = QK_NV(P);
    const char *kb[2][GI_MAXV], *pf[2][GI_MAXV];
    int64_t ko[2][GI_MAXV];
    double *sp[2][GI_MAXV];
    int kn[2][GI_MAXV];
    const int64_t pfs = a->bs * (DT == GI_KV_F32 ? 4 : DT == GI_KV_F16 ? 2 : 1);
    int64_t bi = c->b0, off = 0;
    int cur = 0;
    int n = qk_fill(NV, DT, a, c, &bi, &off, kb[0], ko[0], pf[0], sp[0], kn[0]);
    while (n) {
        const int nx = cur ^ 1;
        const int nn = qk_fill(NV, DT, a, c, &bi, &off, kb[nx], ko[nx], pf[nx], sp[nx], kn[nx]);
        const char *const *pfp = nn ? pf[nx] : pf[cur];
        int full = 1;
        for (int v = 0; v < NV; v++) full &= kn[cur][v] == VD_N;
        if (full)
            qk_passes(R, P, NV, 1, DT, a, c, kb[cur], ko[cur], kn[cur], pfp, pfs, sp[cur]);
        else if (n == NV)
            qk_passes(R, P, NV, 0, DT, a, c, kb[cur], ko[cur], kn[cur], pfp, pfs, sp[cur]);
        else /* the last, short group: one vector at a time rather than NV with empty slots */
            for (int v = 0; v < n; v++)
                qk_passes(R, P, 1, 0, DT, a, c, kb[cur] + v, ko[cur] + v, kn[cur] + v, pfp, pfs,
                          sp[cur] + v);
        cur = nx;
        n = nn;
    }
}

/* ============================================================================ softmax weights */

/* row r over [lo, hi], in place: the soft cap s = softcap * tanh(s / softcap) if softcap > 0
   (element by element, the same bits as in the QK epilogue, where its constants held on an
   avx2 build made an accumulator spill: QK 2.3x slower), mx = max of the scores and the sink,
   then e = trunc29(exp(s - mx)); returns the sink's weight trunc29(exp(sink - mx)) (0 for
   sink = -inf) */
static double softmax_row(double *srow, int64_t lo, int64_t hi, double sink, double softcap) {
    const int64_t end = hi + 1;
    int64_t i = lo;
    if (softcap > 0.0) {
        const vd cv = vd_set1(softcap);
        for (; i + VD_N <= end; i += VD_N)
            vd_store(srow + i, vd_mul(cv, gi_vd_tanh(vd_div(vd_load(srow + i), cv))));
        if (i < end) {
            const int n = (int)(end - i);
            vd_store_n(srow + i, vd_mul(cv, gi_vd_tanh(vd_div(vd_load_n(srow + i, n), cv))), n);
        }
        i = lo;
    }
    vd mv = vd_set1(sink);
    for (; i + VD_N <= end; i += VD_N) mv = vd_max(mv, vd_load(srow + i));
    double mx = vd_hmax(mv);
    for (; i < end; i++) mx = srow[i] > mx ? srow[i] : mx; /* max is exact: order is free */
    const vd m = vd_set1(mx);
    i = lo;
    for (; i + VD_N <= end; i += VD_N) vd_store(srow + i, attn_weight(vd_sub(vd_load(srow + i), m)));
    if (i < end) {
        int n = (int)(end - i);
        vd_store_n(srow + i, attn_weight(vd_sub(vd_load_n(srow + i, n), m)), n);
    }
    return vd_lane0(attn_weight(vd_set1(sink - mx)));
}

/* ============================================================================ AV */

/* one key j (relative to kbase): acc[r] += e[r] * v for rows r of the pass (all, or those
 * whose range holds j when CHECK); l[r] += e[r] when FIRST (in every lane of lacc[r]) */
#define AV_KEY(CHECK)                                                                  \
    do {                                                                               \
        const double *er = e; /* row r's weight of key j: e + r * ss, stepped */       \
        _Pragma("GCC unroll 16") for (int r = 0; r < RB; r++, er += ss) {              \
            if (CHECK && (j < lo[r] || j > hi[r])) continue;                           \
            const vd ev = vd_set1(*er);                                                \
            _Pragma("GCC unroll 8") for (int v = 0; v < DV; v++) acc[r][v] =           \
                vd_fma_exact(ev, vv[v], acc[r][v]);                                    \
            if (FIRST) lacc[r] = vd_add(lacc[r], ev); /* every lane: the same sum */    \
        }                                                                              \
    } while (0)

/* V rows already converted to double (v_convert): read as they are */
#define GI_KV_F64 (-1)

/* DV vectors of d (from d0) of one V row (kv_types.h layout) in double */
GI_INLINE void v_load(const int DV, const int DT, const char *row, int64_t hd, int64_t d0,
                      vd *vv) {
    if (DT == GI_KV_F64) { /* a converted chunk's row: its DV vectors from d0 */
#pragma GCC unroll 8
        for (int v = 0; v < DV; v++) vv[v] = vd_load((const double *)row + v * VD_N);
    } else if (DT == GI_KV_F32) {
#pragma GCC unroll 8
        for (int v = 0; v < DV; v++) vv[v] = vd_loadps((const float *)row + d0 + v * VD_N);
    } else if (DT == GI_KV_F16) {
#pragma GCC unroll 8
        for (int v = 0; v < DV; v++) vv[v] = vd_load_f16((const uint16_t *)row + d0 + v * VD_N);
    } else {
        const uint16_t *s16 = (const uint16_t *)(row + hd);
#pragma GCC unroll 8
        for (int v = 0; v < DV; v++) {
            const int64_t d = d0 + v * VD_N;
            const double s = (double)gi_f16_load1(s16 + d / GI_KV_QB);
            vv[v] = vd_mul(vd_load_i8((const int8_t *)row + d), vd_set1(s)); /* exact */
        }
    }
}

/* The keys of an item run in spans of AV_SPAN blocks: per span, d-chunk and pass, the
 * accumulators are loaded from c->o, stay in registers over the span's keys and are stored
 * back.  AVX-512 (no passes) runs all keys as one span; avx2 (two passes, each span's chunk
 * converted to double once for both) spans of 8 blocks, whose converted chunk stays in L1 (a
 * whole item's chunk made 16x2x128 1.07x slower).  The AV of a 512-token causal prefill (f16,
 * one thread, Zen 4, medians of 5 rounds) against spans of one block: avx512-vnni 16.2 -> 13.7
 * ms (32x8x64) and 29.9 -> 26.2 (32x8x128), avx2 17.4 -> 16.0 and 31.9 -> 31.6, 16x2x128
 * alike on both (docs/benchmarks.md, "Attention kernels"). */
#if defined(GI_VARIANT_AVX2)
#define AV_SPAN 8
#else
#define AV_SPAN ((int64_t)1 << 40)
#if AV_PASS < GI_ATTN_RMAX
#error "AV passes convert a span's chunk into scratch: AV_SPAN must be a few blocks"
#endif
#endif

/* the key range [j0, j1] of blocks [s0, s1] of the item (relative to kbase) */
GI_INLINE void span_keys(const item_ctx *c, int64_t bs, int64_t s0, int64_t s1, int64_t *j0,
                         int64_t *j1) {
    const int64_t a0 = (s0 - c->b0) * bs, a1 = (s1 - c->b0 + 1) * bs - 1;
    *j0 = c->jmin > a0 ? c->jmin : a0;
    *j1 = c->jmax < a1 ? c->jmax : a1;
}

/* d-chunk [d0, d0 + DV*VD_N) of the RB rows r0.. over the keys of blocks [s0, s1] in order,
 * the accumulators (and l when FIRST, in every lane of lacc[r]) from c->o and back.  Keys are
 * read from the cache blocks (DT), or with DT = GI_KV_F64 from the span's chunk converted to
 * double (c->vd: key j at (j - first key) * DV * VD_N).  FIRST and r0 == 0 prefetch the next
 * block's V rows. */
GI_INLINE void av_span(const int RB, const int DV, const int FIRST, const int DT,
                       const gi_attn_args *a, const item_ctx *c, int64_t r0, int64_t s0,
                       int64_t s1, int64_t d0, int64_t clo, int64_t chi, double *l) {
    vd acc[GI_ATTN_RMAX][GI_MAXV], lacc[GI_ATTN_RMAX];
    const int64_t hd = a->hd, bs = a->bs, ss = c->ss, *lo = c->lo + r0, *hi = c->hi + r0;
    const int CONV = DT == GI_KV_F64;
    const int64_t hb = CONV ? 0 : gi_kv_head_bytes(DT, hd, bs);
    const int64_t vrb = CONV ? 0 : gi_kv_vrow_bytes(DT, hd);
    double *o = c->o + r0 * hd;
    const double *vp = c->vd; /* CONV: the next key's converted chunk */
    l += r0;
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++) {
        if (FIRST) lacc[r] = vd_set1(l[r]);
#pragma GCC unroll 8
        for (int v = 0; v < DV; v++) acc[r][v] = vd_load(o + r * hd + d0 + v * VD_N);
    }
    for (int64_t bi = s0; bi <= s1; bi++) {
        int64_t j0, j1;
        span_keys(c, bs, bi, bi, &j0, &j1);
        const int64_t jb = (bi - c->b0) * bs; /* first key of the block, relative */
        const char *vb = 0, *vnext = 0;
        if (!CONV) {
            vb = (const char *)a->v_cache + (a->block_table[bi] * a->n_kv + c->kvh) * hb;
            if (FIRST && r0 == 0 && bi < c->b1)
                vnext = (const char *)a->v_cache +
                        (a->block_table[bi + 1] * a->n_kv + c->kvh) * hb;
        }
        for (int64_t j = j0; j <= j1; j++) {
            vd vv[GI_MAXV];
            if (CONV) {
                v_load(DV, GI_KV_F64, (const char *)vp, hd, 0, vv);
                vp += DV * VD_N;
            } else {
                if (vnext) /* the next block's row of this offset, all of it */
                    for (int64_t f = 0; f < vrb; f += 64) GI_PREFETCH(vnext + (j - jb) * vrb + f);
                v_load(DV, DT, vb + (j - jb) * vrb, hd, d0, vv);
            }
            const double *e = c->sc + r0 * ss + j;
            if (j >= clo && j <= chi)
                AV_KEY(0);
            else
                AV_KEY(1);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < RB; r++) {
        if (FIRST) l[r] = vd_lane0(lacc[r]);
#pragma GCC unroll 8
        for (int v = 0; v < DV; v++) vd_store(o + r * hd + d0 + v * VD_N, acc[r][v]);
    }
}

/* d-chunk [d0, d0 + DV*VD_N) of the keys of blocks [s0, s1] in double, key-major: vd_
 * (keys, DV, VD_N), as av_span reads it; with FIRST the next block's V rows are prefetched */
GI_INLINE void v_convert(const int DV, const int FIRST, const int DT, const gi_attn_args *a,
                         const item_ctx *c, int64_t s0, int64_t s1, int64_t d0, double *vd_) {
    const int64_t hd = a->hd, bs = a->bs;
    const int64_t hb = gi_kv_head_bytes(DT, hd, bs), vrb = gi_kv_vrow_bytes(DT, hd);
    for (int64_t bi = s0; bi <= s1; bi++) {
        int64_t j0, j1;
        span_keys(c, bs, bi, bi, &j0, &j1);
        const int64_t jb = (bi - c->b0) * bs;
        const char *vb = (const char *)a->v_cache + (a->block_table[bi] * a->n_kv + c->kvh) * hb;
        const char *vnext = 0;
        if (FIRST && bi < c->b1)
            vnext = (const char *)a->v_cache + (a->block_table[bi + 1] * a->n_kv + c->kvh) * hb;
        for (int64_t j = j0; j <= j1; j++) {
            if (vnext)
                for (int64_t f = 0; f < vrb; f += 64) GI_PREFETCH(vnext + (j - jb) * vrb + f);
            vd vv[GI_MAXV];
            v_load(DV, DT, vb + (j - jb) * vrb, hd, d0, vv);
#pragma GCC unroll 8
            for (int v = 0; v < DV; v++) vd_store(vd_ + v * VD_N, vv[v]);
            vd_ += DV * VD_N;
        }
    }
}

/* av_span over the R rows in passes of P (the last: the rest).  With more than one pass an
 * f16 or q8_0 chunk is converted to double first (c->vd), once rather than per pass. */
GI_INLINE void av_passes(const int R, const int P, const int DV, const int FIRST, const int DT,
                         const gi_attn_args *a, const item_ctx *c, int64_t s0, int64_t s1,
                         int64_t d0, int64_t clo, int64_t chi, double *l) {
    const int np = (R + P - 1) / P, PL = R - (np - 1) * P;
    const int nfull = PL == P ? np : np - 1;
    if (np > 1 && DT != GI_KV_F32) {
        v_convert(DV, FIRST, DT, a, c, s0, s1, d0, c->vd);
        for (int p = 0; p < nfull; p++)
            av_span(P, DV, FIRST, GI_KV_F64, a, c, (int64_t)p * P, s0, s1, d0, clo, chi, l);
        if (PL != P)
            av_span(PL, DV, FIRST, GI_KV_F64, a, c, (int64_t)(np - 1) * P, s0, s1, d0, clo, chi,
                    l);
        return;
    }
    for (int p = 0; p < nfull; p++)
        av_span(P, DV, FIRST, DT, a, c, (int64_t)p * P, s0, s1, d0, clo, chi, l);
    if (PL != P)
        av_span(PL, DV, FIRST, DT, a, c, (int64_t)(np - 1) * P, s0, s1, d0, clo, chi, l);
}

/* o[r] = sum_j e[r][j] * v_j, l[r] = sum_j e[r][j] over the item's keys in order, span by
 * span; then out = float(o / l) */
GI_INLINE void av_rows(const int R, const int DV, const int DT, const gi_attn_args *a,
                       const item_ctx *c) {
    const int P = PASS_ROWS(R, AV_PASS);
    const int64_t hd = a->hd, step = (int64_t)DV * VD_N;
    double l[GI_ATTN_RMAX];
    int64_t clo = c->lo[0], chi = c->hi[0]; /* keys every row sees */
    for (int r = 0; r < R; r++) {
        l[r] = 0.0;
        clo = c->lo[r] > clo ? c->lo[r] : clo;
        chi = c->hi[r] < chi ? c->hi[r] : chi;
    }
    memset(c->o, 0, (size_t)R * (size_t)hd * sizeof(double));
    for (int64_t s0 = c->b0; s0 <= c->b1; s0 += AV_SPAN) {
        const int64_t s1 = c->b1 - s0 < AV_SPAN ? c->b1 : s0 + AV_SPAN - 1;
        av_passes(R, P, DV, 1, DT, a, c, s0, s1, 0, clo, chi, l);
        for (int64_t d0 = step; d0 < hd; d0 += step)
            av_passes(R, P, DV, 0, DT, a, c, s0, s1, d0, clo, chi, l);
    }
    for (int r = 0; r < R; r++) {
        const vd lv = vd_set1(l[r] + c->esink[r]);
        for (int64_t d = 0; d < hd; d += VD_N)
            vd_storeps(c->orow[r] + d, vd_div(vd_load(c->o + r * hd + d), lv));
    }
}

/* ============================================================================ dispatch on RB */

#define GI_RB_CASES(X) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12)

#define QK_CASE(RB)                                                \
    case RB:                                                       \
        if (a->kv_dtype == GI_KV_F16) qk_rows(RB, GI_KV_F16, a, c);   \
        else if (a->kv_dtype == GI_KV_Q8_0) qk_rows(RB, GI_KV_Q8_0, a, c); \
        else qk_rows(RB, GI_KV_F32, a, c);                          \
        break;
static void qk_dispatch(const gi_attn_args *a, const item_ctx *c) {
    switch (c->R) { GI_RB_CASES(QK_CASE) default: break; }
}

#define AV_DT(RB, DV)                                                       \
    do {                                                                    \
        if (a->kv_dtype == GI_KV_F16) av_rows(RB, DV, GI_KV_F16, a, c);     \
        else if (a->kv_dtype == GI_KV_Q8_0) av_rows(RB, DV, GI_KV_Q8_0, a, c); \
        else av_rows(RB, DV, GI_KV_F32, a, c);                              \
    } while (0)

/* DV: the budget AV_DV of a pass if it divides the hd/VD_N vectors of a row, else 2, else 1 */
#define AV_DVP(RB) AV_DV(PASS_ROWS(RB, AV_PASS))
#define AV_CASE(RB)                                                     \
    case RB:                                                            \
        if (nvec % AV_DVP(RB) == 0) AV_DT(RB, AV_DVP(RB));              \
        else if (AV_DVP(RB) > 2 && nvec % 2 == 0) AV_DT(RB, 2);         \
        else AV_DT(RB, 1);                                              \
        break;
static void av_dispatch(const gi_attn_args *a, const item_ctx *c) {
    const int64_t nvec = a->hd / VD_N;
    switch (c->R) { GI_RB_CASES(AV_CASE) default: break; }
}

/* ============================================================================ plan and run */

GI_INLINE int64_t row_lo(const gi_attn_args *a, int64_t p) {
    if (a->window <= 0) return 0;
    int64_t lo = p - a->window + 1;
    return lo > 0 ? lo : 0;
}

GI_INLINE int64_t n_items(const gi_attn_args *a, int64_t tq, int64_t nparts) {
    return (a->T + tq - 1) / tq * a->n_kv * nparts;
}

/* Tiles of tq queries x nh heads (R = tq * nh <= RMAX rows); smaller tiles, then split kv
 * groups, while there are fewer items than threads.  The tiling never changes a result. */
static void GI(attn_plan)(gi_attn_args *a, int nthreads) {
    const int64_t G = a->H / a->n_kv;
    int64_t nh = G < GI_ATTN_RMAX ? G : GI_ATTN_RMAX;
    int64_t nparts = (G + nh - 1) / nh;
    int64_t tq = GI_ATTN_RMAX / nh;
    if (tq > a->T) tq = a->T;
    if (tq < 1) tq = 1;
    while (n_items(a, tq, nparts) < nthreads && tq > 1) tq = (tq + 1) / 2;
    while (n_items(a, tq, nparts) < nthreads && nh > 1) {
        nh = (nh + 1) / 2;
        nparts = (G + nh - 1) / nh;
    }
    a->tq = tq;
    a->nh = nh;
    a->nparts = nparts;
    a->n_items = n_items(a, tq, nparts);
    int64_t maxss = 0;
    for (int64_t t0 = 0; t0 < a->T; t0 += tq) {
        int64_t kmin = INT64_MAX, kmax = -1;
        for (int64_t t = t0; t < t0 + tq && t < a->T; t++) {
            int64_t p = a->q_pos[t], lo = row_lo(a, p);
            kmin = lo < kmin ? lo : kmin;
            kmax = p > kmax ? p : kmax;
        }
        int64_t ss = ((kmax / a->bs - kmin / a->bs + 1) * a->bs + 7) & ~(int64_t)7;
        maxss = ss > maxss ? ss : maxss;
    }
    a->scratch_doubles = tq * nh * (2 * a->hd + maxss) + 8 + 8 /* alignment */;
#if QK_PASS < GI_ATTN_RMAX || AV_PASS < GI_ATTN_RMAX /* vd, kf of items run in passes */
    a->scratch_doubles += a->bs * AV_SPAN * GI_MAXV * VD_N + (a->hd * GI_MAXV * VD_N + 1) / 2;
#endif
    a->kchunks = 1; /* never split: one reduction order over all keys */
    a->kvspan = 1;
    a->shared_bytes = 0;
}

static void GI(attn_run)(const gi_attn_args *a, int64_t item, double *scratch) {
    scratch = gi_attn_scratch64(scratch);
    const int64_t G = a->H / a->n_kv;
    const int64_t per_tile = a->n_kv * a->nparts;
    const int64_t tile = item / per_tile, rem = item % per_tile;
    const int64_t part = rem % a->nparts;
    const int64_t t0 = tile * a->tq, h0 = part * a->nh;
    const int64_t nt = a->T - t0 < a->tq ? a->T - t0 : a->tq;
    const int64_t nhh = G - h0 < a->nh ? G - h0 : a->nh;
    const int64_t hd = a->hd, bs = a->bs;
    item_ctx c;
    c.kvh = rem / a->nparts;
    c.R = (int)(nt * nhh);

    /* ---- rows, key ranges */
    int64_t kmin = INT64_MAX, kmax = -1;
    for (int64_t ti = 0; ti < nt; ti++) {
        const int64_t t = t0 + ti, p = a->q_pos[t], lo = row_lo(a, p);
        kmin = lo < kmin ? lo : kmin;
        kmax = p > kmax ? p : kmax;
        for (int64_t hj = 0; hj < nhh; hj++) {
            const int r = (int)(ti * nhh + hj);
            c.lo[r] = lo;
            c.hi[r] = p;
            c.orow[r] = a->out + (t * a->H + c.kvh * G + h0 + hj) * hd;
            c.sink[r] = a->sinks ? (double)a->sinks[c.kvh * G + h0 + hj] : -INFINITY;
        }
    }
    c.b0 = kmin / bs;
    c.b1 = kmax / bs;
    c.kbase = c.b0 * bs;
    c.jmin = kmin - c.kbase;
    c.jmax = kmax - c.kbase;
    c.ss = ((c.b1 - c.b0 + 1) * bs + 7) & ~(int64_t)7;
    for (int r = 0; r < c.R; r++) {
        c.lo[r] -= c.kbase;
        c.hi[r] -= c.kbase;
    }

    /* ---- scratch: qd (R, hd) | o (R, hd) | sc (R, ss); with passes vd (AV_SPAN bs, 8 VD_N) |
       kf (hd, 8 VD_N) */
    c.qd = scratch;
    c.o = scratch + (int64_t)c.R * hd;
    c.sc = scratch + 2 * (int64_t)c.R * hd;
#if QK_PASS < GI_ATTN_RMAX || AV_PASS < GI_ATTN_RMAX
    c.vd = c.sc + (int64_t)c.R * c.ss;
    c.kf = (float *)(c.vd + a->bs * AV_SPAN * GI_MAXV * VD_N);
#else
    c.vd = 0; /* one pass: nothing converted */
    c.kf = 0;
#endif
    for (int64_t ti = 0; ti < nt; ti++)
        for (int64_t hj = 0; hj < nhh; hj++) {
            const float *qr = a->q + ((t0 + ti) * a->H + c.kvh * G + h0 + hj) * hd;
            double *qd = c.qd + (ti * nhh + hj) * hd;
            for (int64_t d = 0; d < hd; d++) qd[d] = (double)qr[d];
        }

    const int timing = __atomic_load_n(&gi_attn_timing, __ATOMIC_RELAXED);
    int64_t ns0 = timing ? gi_attn_now_ns() : 0, ns1 = 0, ns2 = 0;
    qk_dispatch(a, &c);
    if (timing) ns1 = gi_attn_now_ns();
    for (int r = 0; r < c.R; r++)
        c.esink[r] = softmax_row(c.sc + r * c.ss, c.lo[r], c.hi[r], c.sink[r], a->softcap);
    if (timing) ns2 = gi_attn_now_ns();
    av_dispatch(a, &c);
    if (timing) {
        GI_ATTN_PHASE_ADD(0, ns1 - ns0);
        GI_ATTN_PHASE_ADD(1, ns2 - ns1);
        GI_ATTN_PHASE_ADD(2, gi_attn_now_ns() - ns2);
    }
}

/* ============================================================================ KV write */

/* kv heads [h0, h1) of T tokens in token order (a repeated slot: the last wins), each value
 * rounded once to the cache type (kv_types.h) */
static void GI(kv_write)(void *k_cache, void *v_cache, int dt, const float *k, const float *v,
                         const int64_t *slots, int64_t T, int64_t n_kv, int64_t hd, int64_t bs,
                         int64_t h0, int64_t h1) {
    const int64_t hb = gi_kv_head_bytes(dt, hd, bs), vrb = gi_kv_vrow_bytes(dt, hd);
    for (int64_t h = h0; h < h1; h++)
        for (int64_t t = 0; t < T; t++) {
            const int64_t b = slots[t] / bs, o = slots[t] % bs;
            const float *kr = k + (t * n_kv + h) * hd, *vr = v + (t * n_kv + h) * hd;
            char *kb = (char *)k_cache + (b * n_kv + h) * hb;  /* K head-block */
            char *vrow = (char *)v_cache + (b * n_kv + h) * hb + o * vrb;
            if (dt == GI_KV_F32) {
                float *kc = (float *)kb + o; /* stride bs per d */
                for (int64_t d = 0; d < hd; d++) kc[d * bs] = kr[d];
                memcpy(vrow, vr, (size_t)hd * sizeof(float));
            } else if (dt == GI_KV_F16) {
                uint16_t *kc = (uint16_t *)kb + o, *vc = (uint16_t *)vrow;
                for (int64_t d = 0; d < hd; d++) kc[d * bs] = gi_f32_to_f16(kr[d]);
                for (int64_t d = 0; d < hd; d++) vc[d] = gi_f32_to_f16(vr[d]);
            } else {
                uint16_t *ks = (uint16_t *)(kb + hd * bs), *vs = (uint16_t *)(vrow + hd);
                for (int64_t g = 0; g < hd / GI_KV_QB; g++) {
                    const int64_t d0 = g * GI_KV_QB;
                    ks[g * bs + o] = gi_q8_0_block(kr + d0, (int8_t *)kb + d0 * bs + o, bs);
                    vs[g] = gi_q8_0_block(vr + d0, (int8_t *)vrow + d0, 1);
                }
            }
        }
}

/* ============================================================================ test hooks */

#define GI_MAP_D(NAME, F)                                                           \
    static void GI(NAME)(const double *x, double *y, int64_t n) {                   \
        int64_t i = 0;                                                              \
        for (; i + VD_N <= n; i += VD_N) vd_store(y + i, F(vd_load(x + i)));        \
        if (i < n) vd_store_n(y + i, F(vd_load_n(x + i, (int)(n - i))), (int)(n - i)); \
    }
GI_MAP_D(exp_f64, gi_vd_exp)
GI_MAP_D(tanh_f64, gi_vd_tanh)
GI_MAP_D(weight_f64, attn_weight)

/* ============================================================================ table */

const gi_attn_ops GI(gi_attn_ops) = {
    GI(attn_plan), GI(attn_run), GI(kv_write), GI(exp_f64), GI(tanh_f64), GI(weight_f64),
};
