/* Matrix-multiply kernels, compiled once per ISA variant (portable, avx2, avx512): this file is
 * the variant's translation unit.  It includes the one ISA file of the variant:
 *   matmul_impl.h       the contracts, the layouts, the scalar helpers every ISA file uses
 *   matmul_avx512.c     quantize_act, qtile / ftile (one zmm of 16 output rows per unit)
 *   matmul_avx2.c       quantize_act, qtile / ftile (one ymm of 8 rows), the prefill GEMM gemm2
 *   matmul_portable.c   quantize_act, matmul_q / matmul_f in plain C
 *   matmul_amx.c        the AMX int8 GEMM (its own translation unit; the avx512 variant's)
 * then instantiates the SIMD microkernels for every kind and tile size, tiles GEMV and GEMM over
 * them (matmul_q, matmul_f), adds get_rows (plain C, every variant) and exports the variant's
 * table gi_matmul_ops_<variant> (matmul.h).  One translation unit per variant keeps the
 * microkernels inlined into their instantiations.
 */
#include "matmul_impl.h"

#if defined(GI_AVXVNNI_TABLE)
/* this object is the avx2 variant's second table, gi_matmul_ops_avx2vnni (dispatch.h): 1 when
   compiled with -mavxvnni, 0 when the compiler could not (then never selected) */
const int gi_avxvnni_built = GI_AVXVNNI_TABLE;
#endif

#if defined(GI_VARIANT_AVX512)
#include "matmul_amx.h"
#include "matmul_avx512.c"
#elif defined(GI_VARIANT_AVX2)
#include "matmul_avx2.c"
#elif defined(GI_VARIANT_PORTABLE)
#include "matmul_portable.c"
#else
#error "no matmul ISA file for this variant (add matmul_<isa>.c: see matmul_impl.h)"
#endif


/* ============================================================================ SIMD drivers: instantiation and tiling */

#if !defined(GI_VARIANT_PORTABLE)

/* The GEMV reads gemv_streams() row blocks per call (dispatch.h), each its own stream:
   GI_GEMV_STREAMS_MAX instantiations per kind, the last call of a range taking what is left. */
#if defined(QV_Q4)
/* The ISA file's GEMV of the 4-bit kinds (qv_q4, RB row blocks per call), instantiated per kind;
   qtile serves the GEMV of the other kinds (qv_tab) */
typedef void (*qv_rb_fn)(const gi_weight *, const gi_qact *, int64_t, int64_t, float *, int64_t);
#define QV4_DEF(K, RB) static void qv4_##K##_##RB(const gi_weight *w, const gi_qact *a, int64_t m, \
    int64_t rb, float *o, int64_t ldo) { qv_q4(K, RB, w, a, m, rb, o, ldo); }
#define QV4_KIND(K) QV4_DEF(K, 1) QV4_DEF(K, 2) QV4_DEF(K, 3) QV4_DEF(K, 4)
#define QV4_ROW(K) {qv4_##K##_1, qv4_##K##_2, qv4_##K##_3, qv4_##K##_4},
QV4_KIND(GI_Q4_0) QV4_KIND(GI_Q4_1) QV4_KIND(GI_Q4_K)
_Static_assert(GI_GEMV_STREAMS_MAX == 4, "qv4_tab instantiates 1..4 row blocks");
static const qv_rb_fn qv4_tab[3][GI_GEMV_STREAMS_MAX] = {QV4_ROW(GI_Q4_0) QV4_ROW(GI_Q4_1) QV4_ROW(GI_Q4_K)};
static void qv_q4_rows(const gi_weight *w, const gi_qact *a, int64_t m, int64_t rb0, int64_t rb1,
                       float *out, int64_t ldo) {
    const qv_rb_fn *f = qv4_tab[w->kind == GI_Q4_0 ? 0 : w->kind == GI_Q4_1 ? 1 : 2];
    const int64_t s = gemv_streams();
    for (int64_t rb = rb0; rb < rb1; rb += s) f[min64(s, rb1 - rb) - 1](w, a, m, rb, out, ldo);
}
#endif

#if defined(QV_Q6)
/* q6_k's GEMV (qv_q6) for K up to 32 * QV_Q6_MAXG (its per-call offsets live on the stack);
   qtile's beyond */
#define QV_Q6_MAXG 1024
typedef void (*qv6_fn)(const gi_weight *, const gi_qact *, int64_t, int64_t, const int32_t *, float *, int64_t);
#define QV6_DEF(RB) static void qv6_##RB(const gi_weight *w, const gi_qact *a, int64_t m, int64_t rb, \
    const int32_t *ns, float *out, int64_t ldo) { qv_q6(RB, w, a, m, rb, ns, out, ldo); }
QV6_DEF(1) QV6_DEF(2) QV6_DEF(3) QV6_DEF(4)
static const qv6_fn qv6_tab[GI_GEMV_STREAMS_MAX] = {qv6_1, qv6_2, qv6_3, qv6_4};
#endif

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

/* kinds 0..8 = q4_0, q4_1, q8_0, mxfp4, q6_k, q4_k, q5_k, q5_0, q5_1; 9..11 = f32, f16, bf16
   (matmul.h) */
_Static_assert(GI_Q6_K == 4 && GI_Q4_K == 5 && GI_Q5_K == 6 && GI_Q5_1 == 8 && GI_F32 == 9 && GI_BF16 == 11,
               "the instantiation lists below assume the kind numbers of matmul.h");
#define N_QKINDS 9
#if defined(QV_Q4)  /* q4_0, q4_1, q4_k (kinds 0, 1, 5): qv_q4, no qtile GEMV */
#define QV_Q4DEF(K)
#define QV_Q4ROW(K) {0},
#else
#define QV_Q4DEF(K) SEQ(QV_RB)(QV_DEF, K, 1)
#define QV_Q4ROW(K) {SEQ(QV_RB)(QV_PTR, K, 1)},
#endif
QV_Q4DEF(0) QV_Q4DEF(1) SEQ(QV_RB)(QV_DEF, 2, 1) SEQ(QV_RB)(QV_DEF, 3, 1)
SEQ(QV_RB)(QV_DEF, 4, 1) QV_Q4DEF(5) SEQ(QV_RB)(QV_DEF, 6, 1) SEQ(QV_RB)(QV_DEF, 7, 1)
SEQ(QV_RB)(QV_DEF, 8, 1)
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
QG_KIND(0) QG_KIND(1) QG_KIND(2) QG_KIND(3) QG_KIND(4) QG_KIND(5) QG_KIND(6) QG_KIND(7) QG_KIND(8)
SEQ(FV_RB)(FV_DEF, 9, 1) SEQ(FV_RB)(FV_DEF, 10, 1) SEQ(FV_RB)(FV_DEF, 11, 1)
SEQ(FG_MR)(FG_DEF, 9, 1) SEQ(FG_MR)(FG_DEF, 10, 1) SEQ(FG_MR)(FG_DEF, 11, 1)
SEQ(FG_MR)(FG_DEF, 9, 2) SEQ(FG_MR)(FG_DEF, 10, 2) SEQ(FG_MR)(FG_DEF, 11, 2)

#if FG_RB != 2
#error "instantiation lists above assume FG_RB == 2"
#endif
#if QV_RB > MAXRB || FV_RB > MAXRB || QG_RB > MAXRB || QG_MR > MAXMR || FG_MR > MAXMR
#error "microkernel sizes exceed the register array bounds"
#endif
#ifndef QG_MR_Q6K
#define QG_MR_Q6K QG_MR  /* q6_k GEMM tile rows (<= QG_MR) */
#endif

static const qtile_fn qv_tab[N_QKINDS][QV_RB] = {
    QV_Q4ROW(0) QV_Q4ROW(1) {SEQ(QV_RB)(QV_PTR, 2, 1)},
    {SEQ(QV_RB)(QV_PTR, 3, 1)}, {SEQ(QV_RB)(QV_PTR, 4, 1)}, QV_Q4ROW(5)
    {SEQ(QV_RB)(QV_PTR, 6, 1)}, {SEQ(QV_RB)(QV_PTR, 7, 1)}, {SEQ(QV_RB)(QV_PTR, 8, 1)},
};
static const qtile_fn qg_tab[N_QKINDS][QG_RB][QG_MR] = {
    QG_ROW(0) QG_ROW(1) QG_ROW(2) QG_ROW(3) QG_ROW(4) QG_ROW(5) QG_ROW(6) QG_ROW(7) QG_ROW(8)
};
static const ftile_fn fv_tab[3][FV_RB] = {
    {SEQ(FV_RB)(FV_PTR, 9, 1)}, {SEQ(FV_RB)(FV_PTR, 10, 1)}, {SEQ(FV_RB)(FV_PTR, 11, 1)}};
static const ftile_fn fg_tab[3][FG_RB][FG_MR] = {
    {{SEQ(FG_MR)(FG_PTR, 9, 1)}, {SEQ(FG_MR)(FG_PTR, 9, 2)}},
    {{SEQ(FG_MR)(FG_PTR, 10, 1)}, {SEQ(FG_MR)(FG_PTR, 10, 2)}},
    {{SEQ(FG_MR)(FG_PTR, 11, 1)}, {SEQ(FG_MR)(FG_PTR, 11, 2)}}};

#define UPB (GI_ROWS / UNIT)       /* units per row block */
#ifndef L2_CHUNK
#define L2_CHUNK (512 * 1024)      /* GEMM: weight bytes per cache block */
#endif
#ifndef ACT_CHUNK
#define ACT_CHUNK (768 * 1024)     /* GEMM: activation bytes per cache block (both fit a 2 MB L2) */
#endif

/* GEMM tiling shared by the int and float paths.  Cache blocks: activation rows [m0, m1) in
   blocks of about ACT_CHUNK bytes, units [u0, u1) in chunks of about L2_CHUNK weight bytes
   (together they stay in L2); inside, the block's rows in nearly equal tiles of <= MR rows;
   inside a tile, the chunk's units RB at a time.  APREP(mb0, mb1) runs at each activation
   block [mb0, mb1), PREP(c0, c1) at each chunk of units [c0, c1) of each activation block,
   before its tiles; CALL(rb_count, mr, m, u) runs one microkernel.  (The order of tiles does
   not matter for the bits: each output element is computed entirely inside one microkernel
   call.) */
#define GEMM_LOOP(u0, u1, m0, m1, unit_bytes, row_bytes, RBn, MRn, APREP, PREP, CALL)           \
    do {                                                                                        \
        int64_t chunk_ = L2_CHUNK / ((unit_bytes) > 0 ? (unit_bytes) : 1);                      \
        chunk_ = chunk_ < (RBn) ? (RBn) : chunk_ / (RBn) * (RBn);                               \
        int64_t mblk_ = ACT_CHUNK / ((row_bytes) > 0 ? (row_bytes) : 1);                        \
        mblk_ = mblk_ < (MRn) ? (MRn) : mblk_ / (MRn) * (MRn);                                  \
        for (int64_t mb0_ = (m0); mb0_ < (m1); mb0_ += mblk_) {                                 \
            const int64_t mb1_ = min64(mb0_ + mblk_, (m1));                                     \
            const int64_t M_ = mb1_ - mb0_, nt_ = (M_ + (MRn) - 1) / (MRn);                     \
            APREP(mb0_, mb1_);                                                                  \
            for (int64_t c0_ = (u0); c0_ < (u1); c0_ += chunk_) {                               \
                const int64_t c1_ = min64(c0_ + chunk_, (u1));                                  \
                PREP(c0_, c1_);                                                                 \
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

static void GI(matmul_q)(const gi_weight *w, const gi_qact *a, int64_t m0, int64_t m1,
                         int64_t rb0, int64_t rb1, float *out, int64_t ldo) {
    const int kind = w->kind;
    const int64_t u0 = rb0 * UPB, u1 = rb1 * UPB;
    if (m1 - m0 <= 0 || u1 <= u0) return;
    if (m1 - m0 == 1) {
        /* GEMV (decode): stream the weights once, gemv_streams() row blocks per call, each
           read front to back as its own stream (dispatch_common.c says which count suits
           which CPU) */
#if defined(QV_Q6)
        if (kind == GI_Q6_K && w->n_in / GI_GROUP <= QV_Q6_MAXG) {  /* the ISA file's own GEMV */
            int32_t ns[2 * QV_Q6_MAXG];
            q6_offsets(a, w->n_in, m0, ns);
            const int64_t st = gemv_streams();
            for (int64_t rb = rb0; rb < rb1; rb += st) qv6_tab[min64(st, rb1 - rb) - 1](w, a, m0, rb, ns, out, ldo);
            return;
        }
#endif
#if defined(QV_Q4)
        if (kind == GI_Q4_0 || kind == GI_Q4_1 || kind == GI_Q4_K) {  /* the ISA file's own GEMV */
            qv_q4_rows(w, a, m0, rb0, rb1, out, ldo);
            return;
        }
#endif
        const int64_t n = min64(gemv_streams() * UPB, QV_RB);   /* units per call */
        for (int64_t u = u0; u < u1; u += n)
            qv_tab[kind][min64(n, u1 - u) - 1](w, a, m0, u, out, ldo);
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
    if (kind != GI_MXFP4 && gemm2(w, a, m0, m1, rb0, rb1, out, ldo)) return;
#endif
    const int mr = kind == GI_Q6_K ? QG_MR_Q6K : QG_MR;
    /* q4_k / q5_k: each chunk's scales decoded once (128 bytes per group and row block, counted
       in the chunk's bytes) instead of once per tile; without scratch, decoded in the tiles */
    gi_weight wl = *w;
    int64_t ubk = ub;
    if (IS_QK(kind)) {
        ubk = ub + (w->n_in / GI_GROUP) * 128 / UPB;
        int64_t ch = L2_CHUNK / (ubk > 0 ? ubk : 1);
        ch = ch < QG_RB ? QG_RB : ch / QG_RB * QG_RB;
        wl.kdec = (const float *)scratch_buffer((size_t)ch * (w->n_in / GI_GROUP) * 2 * UNIT * 4);
    }
#if defined(GI_VARIANT_AVX512)
    /* q6_k: each activation block's low-half sums computed once (the tiles' offsets of the
       codes), instead of once per tile; without scratch, computed in the tiles */
#define QAPREP(mb0, mb1) if (kind == GI_Q6_K) q6_lowsums(a, w->n_in, (mb0), (mb1), &wl)
#else
#define QAPREP(mb0, mb1) (void)0
#endif
#define QPREP(c0, c1) if (wl.kdec) { qk_decode(w, (c0), (c1), 0, w->n_in / GI_GROUP, (float *)wl.kdec); wl.kdec_u0 = (c0); }
#define QCALL(rbn, mrn, m, u) qg_tab[kind][(rbn) - 1][(mrn) - 1](&wl, a, (m), (u), out, ldo)
    GEMM_LOOP(u0, u1, m0, m1, ubk, w->n_in, QG_RB, mr, QAPREP, QPREP, QCALL);
#undef QAPREP
#undef QPREP
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
#define FPREP(c0, c1) (void)0
    GEMM_LOOP(u0, u1, m0, m1, ub, w->n_in * 4, FG_RB, FG_MR, FPREP, FPREP, FCALL);
#undef FPREP
#undef FCALL
}

#endif


/* ============================================================================ get_rows (all variants: plain C) */

/* Dequantized value = the reference's float32 expression: q4_0 (nib-8)*d, q4_1 nib*d + m
   (two roundings), q5_0 (q-16)*d, q5_1 q*d + m (two roundings), q8_0 q*d, mxfp4 KV[code]*2^(e-128) (exact), q6_k (d*sc)*(q-32) (exact),
   q4_k / q5_k (d*sc)*q - dmin*mn (one rounding), floats converted exactly. */
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
            if (IS_QK(kind)) {  /* (d * sc) * q - dmin * mn: both products exact in float32 */
                int sc, mn;
                qk_scale_min(w->ks + (rb * (G / 8) + g / 8) * 12 * 16, (int)r, (int)(g & 7), &sc, &mn);
                const uint16_t *dg = w->d + (rb * (G / 8) + g / 8) * 32;
                const float ds = f16_to_f32(dg[r]) * (float)sc, dm = f16_to_f32(dg[16 + r]) * (float)mn;
                for (int k = 0; k < GI_GROUP; k++)
                    og[k] = (float)qk_code(kind, wq + g * NL * 64, (int)r, k) * ds - dm;
                continue;
            }
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
            if (kind == GI_Q5_0 || kind == GI_Q5_1) {
                const float mn = kind == GI_Q5_1 ? f16_to_f32(w->m[(rb * G + g) * GI_ROWS + r]) : 0.0f;
                for (int k = 0; k < GI_GROUP; k++) {
                    const int q = qk_code(kind, wq + g * NL * 64, (int)r, k);
                    if (kind == GI_Q5_0) og[k] = (float)(q - 16) * d;
                    else og[k] = (float)q * d + mn;
                }
            } else if (kind == GI_MXFP4) {
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


/* ============================================================================ peak probes */
/* reps rounds of 12 independent STEP(acc, a, b) on vectors of type T (more accumulators than
   the instruction's latency x throughput), the asm barrier keeping each from being folded
   away; the lanes' xor / sum goes to a volatile.  OPS: operations per STEP (0: no probe). */
#define PEAK_PROBE(NAME, T, SET1, STEP, LANE0, OPS, A, B, INIT, SINK_T, FOLD)                   \
    static int64_t GI(NAME)(int64_t reps) {                                                    \
        T acc[12];                                                                             \
        const T a = SET1(A), b = SET1(B);                                                      \
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) acc[i] = SET1(INIT);             \
        for (int64_t n = 0; n < reps; n++) {                                                   \
            _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) {                            \
                acc[i] = STEP(acc[i], a, b);                                                   \
                __asm__("" : "+v"(acc[i]));                                                    \
            }                                                                                  \
        }                                                                                      \
        SINK_T sink = 0;                                                                       \
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++)                                  \
            sink = FOLD(sink, LANE0(acc[i]));                                                  \
        volatile SINK_T keep = sink;                                                           \
        (void)keep;                                                                            \
        return reps * 12 * (OPS);                                                              \
    }
#define PROBE_XOR(s, v) ((s) ^ (v))
#define PROBE_ADD(s, v) ((s) + (v))

/* gi_matmul_ops.int8_probe: the variant's dot-product instruction (PROBE_STEP); returns the
   int8 operations done (2 per multiply-add) */
#if PROBE_OPS > 0
PEAK_PROBE(int8_probe, PROBE_T, PROBE_SET1, PROBE_STEP, PROBE_LANE0, PROBE_OPS, 0x01020304,
           0x05060708, i, int32_t, PROBE_XOR)
#else
static int64_t GI(int8_probe)(int64_t reps) { (void)reps; return 0; }
#endif

/* gi_matmul_ops.fma_probe: the float32 fused multiply-add on the widest vector (FPROBE_STEP:
   acc = acc * 0.999 + 0.001, which stays near 1, no denormals); returns the float operations
   done (2 per lane) */
#if FPROBE_OPS > 0
PEAK_PROBE(fma_probe, FPROBE_T, FPROBE_SET1, FPROBE_STEP, FPROBE_LANE0, FPROBE_OPS, 0.999f,
           0.001f, (float)i, float, PROBE_ADD)
#else
static int64_t GI(fma_probe)(int64_t reps) { (void)reps; return 0; }
#endif

/* gi_matmul_ops.f16_fma_probe: 12 accumulators as fma_probe, each step's multiplier one of 3
   vectors converted from float16 in its round (F16PROBE_LOAD; 0.999, so acc stays near 1), so
   1 conversion per 4 multiply-adds; the rounds alternate between two copies of the source so
   that no conversion is hoisted out of the loop.  Returns the float operations of the
   multiply-adds (2 per lane). */
#if FPROBE_OPS > 0
static int64_t GI(f16_fma_probe)(int64_t reps) {
    uint16_t h[2][3][FPROBE_OPS / 2] __attribute__((aligned(64)));
    for (int i = 0; i < 2 * 3 * (FPROBE_OPS / 2); i++) (&h[0][0][0])[i] = 0x3BFE; /* 0.99902 */
    FPROBE_T acc[12];
    const FPROBE_T b = FPROBE_SET1(0.001f);
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) acc[i] = FPROBE_SET1((float)i);
    for (int64_t n = 0; n < reps; n++) {
        const uint16_t *p = &h[n & 1][0][0];
        __asm__("" : "+r"(p));
        FPROBE_T k[3];
        _Pragma("GCC unroll 3") for (int c = 0; c < 3; c++) k[c] = F16PROBE_LOAD(p + c * (FPROBE_OPS / 2));
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) {
            acc[i] = FPROBE_STEP(acc[i], k[i % 3], b);
            __asm__("" : "+v"(acc[i]));
        }
    }
    float sink = 0;
    _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) sink += FPROBE_LANE0(acc[i]);
    volatile float keep = sink;
    (void)keep;
    return reps * 12 * (FPROBE_OPS);
}
#else
static int64_t GI(f16_fma_probe)(int64_t reps) { (void)reps; return 0; }
#endif

/* ============================================================================ table */

const gi_matmul_ops GI(gi_matmul_ops) = {
    GI(quantize_act), GI(matmul_q), GI(matmul_f), GI(get_rows), MR_Q, FG_MR, GI(int8_probe),
    GI(fma_probe), GI(f16_fma_probe),
};
