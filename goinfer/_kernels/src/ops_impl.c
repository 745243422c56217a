/* Elementwise and normalization kernels (see ops.h), compiled once per ISA variant.
 *
 * Contracts (docs/design/kernels.md):
 *   rmsnorm  bit-exact: ss = sum_i (double)x_i^2 in index order, r = float(1/sqrt(ss/D+eps)),
 *            out = float(x*r) * w.  The double products are exact, so fused or not is the same.
 *   rope     bit-exact: x0' = float(x0*c - x1*s), x1' = float(x0*s + x1*c) in double, unfused.
 *   swiglu / gelu_tanh_mul / add: one float32 operation sequence per element, the same in the
 *            vector body and its masked tail, so an element's bits never depend on its index,
 *            on M or on the thread split.
 */
#include "ops.h"
#include "gi_vmath.h"

/* ============================================================================ RMSNorm */

/* out[0:D] = float(x * r) * w for one row */
GI_INLINE void rms_scale_row(const float *GI_RESTRICT xr, const float *GI_RESTRICT w,
                             float *GI_RESTRICT o, int64_t D, double ss, double eps) {
    const float r = (float)(1.0 / sqrt(ss / (double)D + eps));
    const vf rv = vf_set1(r);
    int64_t i = 0;
    for (; i + VF_N <= D; i += VF_N)
        vf_store(o + i, vf_mul(vf_mul(vf_load(xr + i), rv), vf_load(w + i)));
    if (i < D) {
        int n = (int)(D - i);
        vf_store_n(o + i, vf_mul(vf_mul(vf_load_n(xr + i, n), rv), vf_load_n(w + i, n)), n);
    }
}

#if defined(GI_VARIANT_AVX512)
/* VD_N rows at once: lane k accumulates row k (a sequential chain per lane, index order) */
GI_INLINE vd rms_gather(const float *p, __m256i idx) {
    return _mm512_cvtps_pd(_mm256_i32gather_ps(p, idx, 4));
}
GI_INLINE __m256i rms_index(int32_t s) {
    return _mm256_setr_epi32(0, s, 2 * s, 3 * s, 4 * s, 5 * s, 6 * s, 7 * s);
}
/* x[k, i .. i+7] of 8 rows (stride xs) -> col[j] = x[0..7, i+j] as double (an 8 x 8 transpose) */
GI_INLINE void rms_cols(const float *p, int64_t xs, vd col[8]) {
    __m256 r[8], t[8], u[8];
    for (int k = 0; k < 8; k++) r[k] = _mm256_loadu_ps(p + k * xs);
    for (int k = 0; k < 8; k += 2) {
        t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
        t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
    }
    for (int k = 0; k < 8; k += 4) {
        u[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
        u[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xEE);
        u[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
        u[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
    }
    for (int j = 0; j < 4; j++) {
        col[j] = _mm512_cvtps_pd(_mm256_permute2f128_ps(u[j], u[j + 4], 0x20));
        col[j + 4] = _mm512_cvtps_pd(_mm256_permute2f128_ps(u[j], u[j + 4], 0x31));
    }
}
#define GI_RMS_GATHER 1
typedef __m256i rms_idx_t;
#elif defined(GI_VARIANT_AVX2)
GI_INLINE vd rms_gather(const float *p, __m128i idx) {
    return _mm256_cvtps_pd(_mm_i32gather_ps(p, idx, 4));
}
GI_INLINE __m128i rms_index(int32_t s) { return _mm_setr_epi32(0, s, 2 * s, 3 * s); }
/* x[k, i .. i+3] of 4 rows (stride xs) -> col[j] = x[0..3, i+j] as double (a 4 x 4 transpose) */
GI_INLINE void rms_cols(const float *p, int64_t xs, vd col[4]) {
    __m128 r0 = _mm_loadu_ps(p), r1 = _mm_loadu_ps(p + xs), r2 = _mm_loadu_ps(p + 2 * xs), r3 = _mm_loadu_ps(p + 3 * xs);
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
    col[0] = _mm256_cvtps_pd(r0);
    col[1] = _mm256_cvtps_pd(r1);
    col[2] = _mm256_cvtps_pd(r2);
    col[3] = _mm256_cvtps_pd(r3);
}
#define GI_RMS_GATHER 1
typedef __m128i rms_idx_t;
#endif

#define RMS_NG 3  /* row groups of VD_N whose sum chains interleave (the chain's latency) */

static void GI(rmsnorm)(const float *x, int64_t xs, const float *w, float *out, int64_t os,
                        int64_t m0, int64_t m1, int64_t D, double eps) {
    int64_t m = m0;
#if defined(GI_RMS_GATHER)
    /* RMS_NG groups of VD_N rows: columns VD_N at a time by loads and a transpose, each
       lane's chain in index order; the last D % VD_N columns by gathers */
    if (xs <= INT32_MAX / VD_N) {
        const rms_idx_t idx = rms_index((int32_t)xs);
        for (; m + RMS_NG * VD_N <= m1; m += RMS_NG * VD_N) {
            const float *xr = x + m * xs;
            vd ss[RMS_NG];
            for (int q = 0; q < RMS_NG; q++) ss[q] = vd_zero();
            int64_t i = 0;
            for (; i + VD_N <= D; i += VD_N) {
#pragma GCC unroll 4
                for (int q = 0; q < RMS_NG; q++) {
                    vd col[VD_N];
                    rms_cols(xr + q * VD_N * xs + i, xs, col);
#pragma GCC unroll 8
                    for (int j = 0; j < VD_N; j++) ss[q] = vd_fma_exact(col[j], col[j], ss[q]);
                }
            }
            for (; i < D; i++)
                for (int q = 0; q < RMS_NG; q++) {
                    vd v = rms_gather(xr + q * VD_N * xs + i, idx);
                    ss[q] = vd_fma_exact(v, v, ss[q]);
                }
            for (int q = 0; q < RMS_NG; q++) {
                double sv[VD_N];
                vd_store(sv, ss[q]);
                for (int k = 0; k < VD_N; k++)
                    rms_scale_row(xr + (q * VD_N + k) * xs, w, out + (m + q * VD_N + k) * os, D, sv[k], eps);
            }
        }
        for (; m + VD_N <= m1; m += VD_N) {
            const float *xr = x + m * xs;
            vd ss = vd_zero();
            for (int64_t i = 0; i < D; i++) {
                vd v = rms_gather(xr + i, idx); /* x[m+k, i], k = 0..VD_N-1 */
                ss = vd_fma_exact(v, v, ss);    /* v*v exact in double */
            }
            double sv[VD_N];
            vd_store(sv, ss);
            for (int k = 0; k < VD_N; k++)
                rms_scale_row(xr + k * xs, w, out + (m + k) * os, D, sv[k], eps);
        }
    }
#endif
    for (; m < m1; m++) {
        const float *xr = x + m * xs;
        double ss = 0.0;
        for (int64_t i = 0; i < D; i++) {
            double v = (double)xr[i];
            ss = v * v + ss;
        }
        rms_scale_row(xr, w, out + m * os, D, ss, eps);
    }
}

/* ============================================================================ gated activations */

/* silu(g) * u = (g / (1 + exp(-g))) * u */
GI_INLINE vf swiglu_v(vf g, vf u) {
    vf e = gi_vf_exp(vf_sub(vf_set1(0.0f), g));
    return vf_mul(vf_div(g, vf_add(vf_set1(1.0f), e)), u);
}

/* gelu_tanh(g) = 0.5 g (1 + tanh(c (g + 0.044715 g^3))) = g / (1 + exp(-z)),
 * z = g * (K1 + K2 g^2), K1 = 2 sqrt(2/pi), K2 = 0.044715 K1 (no cancellation near 0) */
#define GI_GELU_K1 1.5957691216057308f
#define GI_GELU_K2 0.07135481627159569f
GI_INLINE vf gelu_v(vf g, vf u) {
    vf z = vf_mul(g, vf_add(vf_set1(GI_GELU_K1), vf_mul(vf_set1(GI_GELU_K2), vf_mul(g, g))));
    vf e = gi_vf_exp(vf_sub(vf_set1(0.0f), z));
    return vf_mul(vf_div(g, vf_add(vf_set1(1.0f), e)), u);
}

GI_INLINE vf add_v(vf a, vf b) { return vf_add(a, b); }

/* out[m, c0:c1] = F(a[m, c0:c1], b[m, c0:c1]) for rows m0..m1-1; masked vector tail */
#define GI_BINARY_KERNEL(NAME, F)                                                           \
    static void GI(NAME)(const float *a, int64_t as, const float *b, int64_t bs, float *out, \
                         int64_t os, int64_t m0, int64_t m1, int64_t c0, int64_t c1) {      \
        for (int64_t m = m0; m < m1; m++) {                                                 \
            const float *ar = a + m * as, *br = b + m * bs;                                 \
            float *orow = out + m * os;                                                     \
            int64_t i = c0;                                                                 \
            for (; i + VF_N <= c1; i += VF_N)                                               \
                vf_store(orow + i, F(vf_load(ar + i), vf_load(br + i)));                    \
            if (i < c1) {                                                                   \
                int n = (int)(c1 - i);                                                      \
                vf_store_n(orow + i, F(vf_load_n(ar + i, n), vf_load_n(br + i, n)), n);     \
            }                                                                               \
        }                                                                                   \
    }

/* gpt-oss: x = min(g, limit), y = clamp(u, -limit, limit), (x / (1 + exp(-(alpha x)))) (y + 1).
   The clamps are ordered selects, so a NaN gate or up passes through them and the result is
   NaN (as torch.clamp keeps NaN), in every variant. */
GI_INLINE vf swiglu_oai_v(vf g, vf u, vf alpha, vf lim, vf nlim) {
    vf x = vf_sel_gt(g, lim, lim, g);
    vf y = vf_sel_gt(u, lim, lim, u);
    y = vf_sel_lt(y, nlim, nlim, y);
    vf e = gi_vf_exp(vf_sub(vf_set1(0.0f), vf_mul(alpha, x)));
    return vf_mul(vf_div(x, vf_add(vf_set1(1.0f), e)), vf_add(y, vf_set1(1.0f)));
}

static void GI(swiglu_oai)(const float *a, int64_t as, const float *b, int64_t bs, float *out,
                           int64_t os, int64_t m0, int64_t m1, int64_t c0, int64_t c1,
                           float alpha, float limit) {
    const vf av = vf_set1(alpha), lv = vf_set1(limit), nv = vf_set1(-limit);
    for (int64_t m = m0; m < m1; m++) {
        const float *ar = a + m * as, *br = b + m * bs;
        float *orow = out + m * os;
        int64_t i = c0;
        for (; i + VF_N <= c1; i += VF_N)
            vf_store(orow + i, swiglu_oai_v(vf_load(ar + i), vf_load(br + i), av, lv, nv));
        if (i < c1) {
            int n = (int)(c1 - i);
            vf_store_n(orow + i, swiglu_oai_v(vf_load_n(ar + i, n), vf_load_n(br + i, n), av, lv, nv), n);
        }
    }
}

GI_BINARY_KERNEL(swiglu, swiglu_v)
GI_BINARY_KERNEL(gelu_tanh_mul, gelu_v)
GI_BINARY_KERNEL(add, add_v)

/* ============================================================================ RoPE */

/* pairs (x[i], x[i + half]) */
GI_INLINE void rope_neox(const float *xr, float *o, const double *c, const double *s,
                         int64_t half) {
    int64_t i = 0;
    for (; i + VD_N <= half; i += VD_N) {
        vd x0 = vd_loadps(xr + i), x1 = vd_loadps(xr + half + i);
        vd cv = vd_load(c + i), sv = vd_load(s + i);
        vd y0 = vd_sub(vd_mul(x0, cv), vd_mul(x1, sv));
        vd y1 = vd_add(vd_mul(x0, sv), vd_mul(x1, cv));
        vd_storeps(o + i, y0);
        vd_storeps(o + half + i, y1);
    }
    if (i < half) {
        int n = (int)(half - i);
        vd x0 = vd_loadps_n(xr + i, n), x1 = vd_loadps_n(xr + half + i, n);
        vd cv = vd_load_n(c + i, n), sv = vd_load_n(s + i, n);
        vd y0 = vd_sub(vd_mul(x0, cv), vd_mul(x1, sv));
        vd y1 = vd_add(vd_mul(x0, sv), vd_mul(x1, cv));
        vd_storeps_n(o + i, y0, n);
        vd_storeps_n(o + half + i, y1, n);
    }
}

/* pairs (x[2i], x[2i+1]) */
GI_INLINE void rope_gptj(const float *xr, float *o, const double *c, const double *s,
                         int64_t half) {
    int64_t i = 0;
#if defined(GI_VARIANT_AVX512)
    const __m512i ev = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
    const __m512i od = _mm512_setr_epi64(1, 3, 5, 7, 9, 11, 13, 15);
    const __m512i il = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11);
    const __m512i ih = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
    for (; i + 8 <= half; i += 8) {
        __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(xr + 2 * i));     /* x[2i .. 2i+8) */
        __m512d hi = _mm512_cvtps_pd(_mm256_loadu_ps(xr + 2 * i + 8)); /* x[2i+8 .. 2i+16) */
        __m512d x0 = _mm512_permutex2var_pd(lo, ev, hi), x1 = _mm512_permutex2var_pd(lo, od, hi);
        __m512d cv = _mm512_loadu_pd(c + i), sv = _mm512_loadu_pd(s + i);
        __m512d y0 = _mm512_sub_pd(_mm512_mul_pd(x0, cv), _mm512_mul_pd(x1, sv));
        __m512d y1 = _mm512_add_pd(_mm512_mul_pd(x0, sv), _mm512_mul_pd(x1, cv));
        _mm256_storeu_ps(o + 2 * i, _mm512_cvtpd_ps(_mm512_permutex2var_pd(y0, il, y1)));
        _mm256_storeu_ps(o + 2 * i + 8, _mm512_cvtpd_ps(_mm512_permutex2var_pd(y0, ih, y1)));
    }
#endif
    for (; i < half; i++) {
        double x0 = (double)xr[2 * i], x1 = (double)xr[2 * i + 1];
        double y0 = x0 * c[i] - x1 * s[i];
        double y1 = x0 * s[i] + x1 * c[i];
        o[2 * i] = (float)y0;
        o[2 * i + 1] = (float)y1;
    }
}

static void GI(rope)(const float *x, float *out, const int32_t *pos, const double *cos_t,
                     const double *sin_t, int64_t t0, int64_t t1, int64_t H, int64_t hd,
                     int64_t half, int neox) {
    for (int64_t t = t0; t < t1; t++) {
        const double *c = cos_t + (int64_t)pos[t] * half;
        const double *s = sin_t + (int64_t)pos[t] * half;
        for (int64_t h = 0; h < H; h++) {
            const float *xr = x + (t * H + h) * hd;
            float *o = out + (t * H + h) * hd;
            if (neox)
                rope_neox(xr, o, c, s, half);
            else
                rope_gptj(xr, o, c, s, half);
            if (o != xr) /* dims past n_rot pass through */
                for (int64_t i = 2 * half; i < hd; i++) o[i] = xr[i];
        }
    }
}

/* ============================================================================ test hook */

static void GI(exp_f32)(const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + VF_N <= n; i += VF_N) vf_store(y + i, gi_vf_exp(vf_load(x + i)));
    if (i < n) vf_store_n(y + i, gi_vf_exp(vf_load_n(x + i, (int)(n - i))), (int)(n - i));
}

/* ============================================================================ table */

const gi_ops_ops GI(gi_ops_ops) = {
    GI(rmsnorm), GI(swiglu), GI(gelu_tanh_mul), GI(add), GI(rope), GI(swiglu_oai), GI(exp_f32),
};
