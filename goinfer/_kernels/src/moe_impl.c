/* Mixture-of-Experts routing and fold (see moe.h), compiled once per ISA variant.
 *
 * Routing is scalar double arithmetic with libm's exp (the same function NumPy's reference
 * reaches through Python's math.exp), so the kernel and goinfer._reference.moe_route agree
 * bit for bit.  The fold is a float64 loop over columns that the compiler may vectorize:
 * every step is lane-wise IEEE (products of two floats are exact in double, so fused or not
 * is the same), so a column's bits never depend on its position, the vector width or the
 * variant.
 */
#include <math.h>

#include "moe.h"

/* ============================================================================ routing */

/* the selection key: NaN ranks below every number */
GI_INLINE double rank_key(double v) { return v != v ? -INFINITY : v; }

GI_INLINE int already(const int32_t *id, int r, int64_t j) {
    for (int i = 0; i < r; i++)
        if (id[i] == j) return 1;
    return 0;
}

/* id[0..k-1] = the k largest keys of v (E,), largest first, ties to the lower index */
static void top_k(const double *v, int64_t E, int k, int32_t *id) {
    for (int r = 0; r < k; r++) {
        int64_t best = -1;
        double bv = 0.0;
        for (int64_t j = 0; j < E; j++) {
            if (already(id, r, j)) continue;
            const double kv = rank_key(v[j]);
            if (best < 0 || kv > bv) {
                best = j;
                bv = kv;
            }
        }
        id[r] = (int32_t)best;
    }
}

static void GI(route)(const float *logits, int64_t E, int64_t t0, int64_t t1, int k, int mode,
                      int norm, double scale, int32_t *ids, float *w, double *work) {
    for (int64_t t = t0; t < t1; t++) {
        const float *l = logits + t * E;
        int32_t *id = ids + t * k;
        float *wt = w + t * k;
        if (mode == GI_MOE_SOFTMAX_TOPK) {
            double mx = -INFINITY;
            for (int64_t j = 0; j < E; j++)
                if ((double)l[j] > mx) mx = (double)l[j];
            double S = 0.0;
            for (int64_t j = 0; j < E; j++) {
                work[j] = exp((double)l[j] - mx);
                S = S + work[j];
            }
            for (int64_t j = 0; j < E; j++) work[j] = work[j] / S;
            top_k(work, E, k, id);
            double s = 1.0;
            if (norm) {
                s = 0.0;
                for (int r = 0; r < k; r++) s = s + work[id[r]];
            }
            for (int r = 0; r < k; r++) {
                const double p = norm ? work[id[r]] / s : work[id[r]];
                wt[r] = (float)(p * scale);
            }
        } else {
            for (int64_t j = 0; j < E; j++) work[j] = (double)l[j];
            top_k(work, E, k, id);
            const double m0 = work[id[0]];
            double s = 0.0;
            for (int r = 0; r < k; r++) {
                work[id[r]] = exp(work[id[r]] - m0); /* chosen entries are not read again */
                s = s + work[id[r]];
            }
            for (int r = 0; r < k; r++) wt[r] = (float)((work[id[r]] / s) * scale);
        }
    }
}

/* ============================================================================ fold */

#define FOLD_CHUNK 256 /* columns accumulated at once (a 2 KB double buffer on the stack) */

static void GI(fold)(const float *y, int64_t ldy, const float *w, const int32_t *pos, int k,
                     int renorm, const float *sh, int64_t lds, const float *sh_logit, int64_t t0,
                     int64_t t1, int64_t c0, int64_t c1, float *out, int64_t ldo) {
    double acc[FOLD_CHUNK];
    for (int64_t t = t0; t < t1; t++) {
        const float *wt = w + t * k;
        const int32_t *pt = pos + t * k;
        double S = 0.0;
        for (int r = 0; r < k; r++) S = S + (double)wt[r];
        const double g = sh != NULL ? (double)(float)(1.0 / (1.0 + exp(-(double)sh_logit[t]))) : 0.0;
        for (int64_t cc = c0; cc < c1; cc += FOLD_CHUNK) {
            const int64_t n = c1 - cc < FOLD_CHUNK ? c1 - cc : FOLD_CHUNK;
            const double w0 = (double)wt[0];
            const float *GI_RESTRICT y0 = y + (int64_t)pt[0] * ldy + cc;
            for (int64_t j = 0; j < n; j++) acc[j] = w0 * (double)y0[j];
            for (int r = 1; r < k; r++) {
                const double wr = (double)wt[r];
                const float *GI_RESTRICT yr = y + (int64_t)pt[r] * ldy + cc;
                for (int64_t j = 0; j < n; j++) acc[j] = acc[j] + wr * (double)yr[j];
            }
            if (renorm)
                for (int64_t j = 0; j < n; j++) acc[j] = acc[j] / S;
            if (sh != NULL) {
                const float *GI_RESTRICT sr = sh + t * lds + cc;
                for (int64_t j = 0; j < n; j++) acc[j] = acc[j] + g * (double)sr[j];
            }
            float *GI_RESTRICT o = out + t * ldo + cc;
            for (int64_t j = 0; j < n; j++) o[j] = (float)acc[j];
        }
    }
}

const gi_moe_ops GI(gi_moe_ops) = {
    .route = GI(route),
    .fold = GI(fold),
};
