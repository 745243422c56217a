/* Linear-attention kernels (see ssm.h), compiled once per ISA variant.  Vectors run across
 * channels / value columns (one lane per column), sums run sequentially inside a lane, so a
 * column's bits do not depend on the vector width; tails use masked loads of the same code. */
#include "ssm.h"
#include "gi_vmath.h"

GI_INLINE vf silu_v(vf x) {
    return vf_div(x, vf_add(vf_set1(1.0f), gi_vf_exp(vf_sub(vf_set1(0.0f), x))));
}

/* row r of xx = state (K-1 rows) ++ x, r in [0, K-1+T) */
GI_INLINE const float *xx_row(const float *x, int64_t xs, const float *state, int64_t C,
                              int64_t K, int64_t r) {
    return r < K - 1 ? state + r * C : x + (r - (K - 1)) * xs;
}

/* Full vectors take plain loads / stores (AVX2's masked stores are slow), tails masked ones;
 * the same lanes either way. */
GI_INLINE vf ld_n(const float *p, int n) { return n == VF_N ? vf_load(p) : vf_load_n(p, n); }
GI_INLINE void st_n(float *p, vf v, int n) {
    if (n == VF_N) vf_store(p, v);
    else vf_store_n(p, v, n);
}

static void GI(conv)(const float *x, int64_t xs, const float *wT, float *state, float *out,
                     int64_t os, int64_t T, int64_t C, int64_t K, int64_t c0, int64_t c1,
                     const int32_t *snap_rows, int64_t n_snap, float *snap, int64_t snap_stride) {
    /* row by row, columns [c0, c1) contiguous within each row (a column stripe walked down
       all T rows touches a new page every row) */
    for (int64_t t = 0; t < T; t++) {
        for (int64_t c = c0; c < c1; c += VF_N) {
            const int n = (int)(c1 - c < VF_N ? c1 - c : VF_N);
            vf acc = vf_zero();
            for (int64_t j = 0; j < K; j++) {
                const float *src = xx_row(x, xs, state, C, K, t + j);
                acc = vf_add(acc, vf_mul(ld_n(wT + j * C + c, n), ld_n(src + c, n)));
            }
            st_n(out + t * os + c, silu_v(acc), n);
        }
    }
    for (int64_t c = c0; c < c1; c += VF_N) {
        const int n = (int)(c1 - c < VF_N ? c1 - c : VF_N);
        for (int64_t s = 0; s < n_snap; s++) { /* state after token snap_rows[s] */
            float *dst = snap + s * snap_stride;
            for (int64_t i = 0; i < K - 1; i++) {
                const float *src = xx_row(x, xs, state, C, K, (int64_t)snap_rows[s] + 1 + i);
                vf_store_n(dst + i * C + c, vf_load_n(src + c, n), n);
            }
        }
        for (int64_t i = 0; i < K - 1; i++) { /* in place: reads row T+i >= i, ahead of writes */
            const float *src = xx_row(x, xs, state, C, K, T + i);
            vf_store_n(state + i * C + c, vf_load_n(src + c, n), n);
        }
    }
}

/* GD_JV vectors of value columns go through each pass over dk together: GD_JV independent
 * dependency chains instead of one (the passes are add-latency bound); every column's own
 * operation sequence is unchanged, so are its bits. */
#define GD_JV 4

static void GI(delta)(const float *qn, const float *kn, const float *v, int64_t vs,
                      const float *beta, const float *decay, float *state, float *out, int64_t os,
                      int64_t T, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, int64_t h,
                      int64_t j0, int64_t j1, const int32_t *snap_rows, int64_t n_snap,
                      float *snap, int64_t snap_stride) {
    float *S = state + h * dk * dv;
    const int64_t kh = h % Hk; /* GGUF order: value heads tiled over key heads */
    int64_t s = 0;
    for (int64_t t = 0; t < T; t++) {
        const float *q = qn + (t * Hk + kh) * dk, *k = kn + (t * Hk + kh) * dk;
        const vf g = vf_set1(decay[t * Hv + h]), b = vf_set1(beta[t * Hv + h]);
        for (int64_t j = j0; j < j1; j += GD_JV * VF_N) {
            int n[GD_JV];
            vf kv[GD_JV], d[GD_JV], o[GD_JV];
            for (int u = 0; u < GD_JV; u++) {
                const int64_t r = j1 - (j + u * VF_N);
                n[u] = r <= 0 ? 0 : (int)(r < VF_N ? r : VF_N);
                kv[u] = o[u] = vf_zero();
            }
            for (int64_t i = 0; i < dk; i++) {
                const vf ki = vf_set1(k[i]);
                for (int u = 0; u < GD_JV; u++)
                    kv[u] = vf_add(kv[u], vf_mul(ld_n(S + i * dv + j + u * VF_N, n[u]), ki));
            }
            for (int u = 0; u < GD_JV; u++)
                d[u] = vf_mul(vf_sub(ld_n(v + t * vs + h * dv + j + u * VF_N, n[u]), vf_mul(kv[u], g)), b);
            for (int64_t i = 0; i < dk; i++) {
                const vf ki = vf_set1(k[i]), qi = vf_set1(q[i]);
                for (int u = 0; u < GD_JV; u++) {
                    float *p = S + i * dv + j + u * VF_N;
                    const vf si = vf_add(vf_mul(ld_n(p, n[u]), g), vf_mul(ki, d[u]));
                    st_n(p, si, n[u]);
                    o[u] = vf_add(o[u], vf_mul(si, qi));
                }
            }
            for (int u = 0; u < GD_JV; u++) st_n(out + t * os + h * dv + j + u * VF_N, o[u], n[u]);
        }
        while (s < n_snap && snap_rows[s] == t) {
            float *dst = snap + s * snap_stride + h * dk * dv;
            for (int64_t i = 0; i < dk; i++)
                for (int64_t j = j0; j < j1; j++) dst[i * dv + j] = S[i * dv + j];
            s++;
        }
    }
}

static void GI(sigmoid_mul)(const float *g, int64_t gs, const float *x, int64_t xs, float *out,
                            int64_t os, int64_t m0, int64_t m1, int64_t N) {
    for (int64_t m = m0; m < m1; m++) {
        for (int64_t c = 0; c < N; c += VF_N) {
            const int n = (int)(N - c < VF_N ? N - c : VF_N);
            vf gv = vf_load_n(g + m * gs + c, n), xv = vf_load_n(x + m * xs + c, n);
            vf e = gi_vf_exp(vf_sub(vf_set1(0.0f), gv));
            vf_store_n(out + m * os + c, vf_div(xv, vf_add(vf_set1(1.0f), e)), n);
        }
    }
}

const gi_ssm_ops GI(gi_ssm_ops) = {GI(conv), GI(delta), GI(sigmoid_mul)};
