/* Matrix-multiply kernels in plain C (the portable variant): activation quantization, int and
 * float matmul, one row block and one activation row at a time.
 * Included by matmul_impl.c only (see matmul_impl.h for the contracts and the helpers).
 */
#if !defined(GI_MATMUL_IMPL_H) || !defined(GI_VARIANT_PORTABLE)
#error "matmul_portable.c is part of matmul_impl.c's portable variant, not a translation unit of its own"
#endif

#define MR_Q 4           /* gi_matmul_ops.mr_q, mr_f: a hint for splitting M */
#define FG_MR 4
#define PROBE_OPS 0      /* int8 peak probe: no SIMD dot-product instruction, no peak stated */
#define FPROBE_OPS 0     /* float32 FMA peak probe: none either */


/* ============================================================================ activation quantization */

static void GI(quantize_act)(const float *x, int64_t K, int64_t m0, int64_t m1,
                             int8_t *qa, float *da, int32_t *asum, float *sa) {
    const int64_t G = K / GI_GROUP;
    for (int64_t m = m0; m < m1; m++) {
        for (int64_t g = 0; g < G; g++) {
            const float *xg = x + m * K + g * GI_GROUP;        /* (32,) */
            int8_t *qg = qa + m * K + g * GI_GROUP;
            float amax = 0.0f;
            for (int k = 0; k < GI_GROUP; k++) {
                float a = fabsf(xg[k]);
                amax = a > amax ? a : amax;
            }
            float d = amax / 127.0f;
            float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            int32_t s = 0;
            for (int k = 0; k < GI_GROUP; k++) {
                int q = quant_one(xg[k], inv);
                qg[k] = (int8_t)q;
                s += q;
            }
            da[m * G + g] = d;
            asum[m * G + g] = s;
            sa[m * G + g] = d * (float)s;
        }
    }
}



/* ============================================================================ matmul */

static void GI(matmul_q)(const gi_weight *w, const gi_qact *a, int64_t m0, int64_t m1,
                         int64_t rb0, int64_t rb1, float *out, int64_t ldo) {
    const int kind = w->kind;
    const int64_t K = w->n_in, G = K / GI_GROUP;
    const int NL = LINES(kind);
    for (int64_t rb = rb0; rb < rb1; rb++) {
        const uint8_t *wq = (const uint8_t *)w->qs + rb * G * NL * 64;   /* (G, NL, 16, 4) */
        const uint16_t *wd = kind == GI_MXFP4 ? 0 : kind == GI_Q6_K ? w->d + rb * (G / 8) * 16
                           : IS_QK(kind) ? w->d + rb * (G / 8) * 32 : w->d + rb * G * 16;  /* (G, 16), (G/8, [2,] 16) */
        const uint16_t *wm = HAS_MIN(kind) ? w->m + rb * G * 16 : 0;
        const uint8_t *we = kind == GI_MXFP4 ? w->e + rb * G * 16 : 0;   /* (G, 16) */
        const int64_t cnt = cols_left(w, rb * GI_ROWS) < GI_ROWS ? cols_left(w, rb * GI_ROWS) : GI_ROWS;
        for (int64_t m = m0; m < m1; m++) {
            float acc[GI_ROWS] = {0};
            for (int64_t g = 0; g < G; g++) {
                const int8_t *ag = a->qa + m * K + g * GI_GROUP;      /* (32,) */
                const uint8_t *lg = wq + g * NL * 64;
                int32_t is[GI_ROWS] = {0};
                if (IS_QK(kind) || IS_Q5(kind)) {  /* codes 0..15 / 0..31 */
                    for (int r = 0; r < GI_ROWS; r++)
                        for (int k = 0; k < GI_GROUP; k++) is[r] += qk_code(kind, lg, r, k) * ag[k];
                } else if (kind == GI_Q6_K) {
                    const int8_t *sg = w->sc + (rb * G + g) * 32;                  /* (16, 2) */
                    for (int r = 0; r < GI_ROWS; r++) {
                        int32_t h[2] = {0, 0};
                        for (int k = 0; k < GI_GROUP; k++) h[k >> 4] += (q6_code(lg, r, k) - 32) * ag[k];
                        is[r] = sg[2 * r] * h[0] + sg[2 * r + 1] * h[1];
                    }
                } else if (kind == GI_MXFP4) {
                    for (int c = 0; c < 4; c++)
                        for (int r = 0; r < GI_ROWS; r++)
                            for (int j = 0; j < 4; j++) {
                                int b = lg[c * 64 + r * 4 + j];
                                is[r] += KV_MXFP4[b & 15] * ag[c * 4 + j] + KV_MXFP4[b >> 4] * ag[16 + c * 4 + j];
                            }
                } else if (kind != GI_Q8_0) {
                    for (int c = 0; c < 4; c++)
                        for (int r = 0; r < GI_ROWS; r++)
                            for (int j = 0; j < 4; j++) {
                                int b = lg[c * 64 + r * 4 + j];
                                is[r] += (b & 15) * ag[c * 4 + j] + (b >> 4) * ag[16 + c * 4 + j];
                            }
                } else {
                    for (int c = 0; c < 8; c++)
                        for (int r = 0; r < GI_ROWS; r++)
                            for (int j = 0; j < 4; j++)
                                is[r] += (int8_t)lg[c * 64 + r * 4 + j] * ag[c * 4 + j];
                }
                const float dam = a->da[m * G + g];
                const int32_t corr = CODE_OFF(kind) * a->asum[m * G + g];
                if (IS_QK(kind)) {  /* the super-block's d, dmin times the 6-bit scale, min: exact */
                    const uint8_t *ks = w->ks + (rb * (G / 8) + g / 8) * 12 * 16;
                    for (int r = 0; r < GI_ROWS; r++) {
                        int sc, mn;
                        qk_scale_min(ks, r, (int)(g & 7), &sc, &mn);
                        const float ds = f16_to_f32(wd[(g >> 3) * 32 + r]) * (float)sc;
                        const float dm = f16_to_f32(wd[(g >> 3) * 32 + 16 + r]) * (float)mn;
                        acc[r] = fmaf((float)is[r], ds * dam, acc[r]);
                        acc[r] = fmaf(-dm, a->sa[m * G + g], acc[r]);
                    }
                    continue;
                }
                for (int r = 0; r < GI_ROWS; r++) {
                    float dd = (kind == GI_MXFP4 ? e8m0_half(we[g * 16 + r])
                                : f16_to_f32(wd[(kind == GI_Q6_K ? g >> 3 : g) * 16 + r])) * dam;
                    acc[r] = fmaf((float)(is[r] - corr), dd, acc[r]);
                    if (HAS_MIN(kind)) acc[r] = fmaf(f16_to_f32(wm[g * 16 + r]), a->sa[m * G + g], acc[r]);
                }
            }
            for (int64_t r = 0; r < cnt; r++) out[m * ldo + rb * GI_ROWS + r] = acc[r];
        }
    }
}

static void GI(matmul_f)(const gi_weight *w, const float *x, int64_t m0, int64_t m1,
                         int64_t rb0, int64_t rb1, float *out, int64_t ldo) {
    const int kind = w->kind;
    const int64_t K = w->n_in;
    for (int64_t rb = rb0; rb < rb1; rb++) {
        const int64_t cnt = cols_left(w, rb * GI_ROWS) < GI_ROWS ? cols_left(w, rb * GI_ROWS) : GI_ROWS;
        for (int64_t m = m0; m < m1; m++) {
            const float *xm = x + m * K;
            float acc[GI_ROWS] = {0};
            for (int64_t k = 0; k < K; k++) {
                float wv[GI_ROWS];
                const int64_t off = (rb * K + k) * GI_ROWS;                /* (16,) */
                if (kind == GI_F32) memcpy(wv, (const float *)w->qs + off, sizeof wv);
                else if (kind == GI_F16)
                    for (int r = 0; r < GI_ROWS; r++) wv[r] = f16_to_f32(((const uint16_t *)w->qs)[off + r]);
                else
                    for (int r = 0; r < GI_ROWS; r++) wv[r] = bf16_to_f32(((const uint16_t *)w->qs)[off + r]);
                for (int r = 0; r < GI_ROWS; r++) acc[r] = fmaf(wv[r], xm[k], acc[r]);
            }
            for (int64_t r = 0; r < cnt; r++) out[m * ldo + rb * GI_ROWS + r] = acc[r];
        }
    }
}
