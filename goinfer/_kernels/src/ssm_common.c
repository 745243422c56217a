/* Scalar pre-pass of the gated delta rule (see ssm.h): compiled once, libm in double. */
#include "ssm.h"
#include <math.h>

void gi_ssm_prep(const float *qkv, int64_t qs, const float *ab, int64_t abs_, const float *A,
                 const float *dt_bias, float *qn, float *kn, float *beta, float *decay,
                 int64_t t0, int64_t t1, int64_t Hk, int64_t Hv, int64_t dk, double eps) {
    const double qscale = 1.0 / sqrt((double)dk);
    for (int64_t t = t0; t < t1; t++) {
        const float *row = qkv + t * qs;
        for (int64_t part = 0; part < 2; part++) { /* 0: q, 1: k */
            const float *src = row + part * Hk * dk;
            float *dst = (part == 0 ? qn : kn) + t * Hk * dk;
            for (int64_t h = 0; h < Hk; h++) {
                const float *x = src + h * dk;
                double ss = 0.0;
                for (int64_t i = 0; i < dk; i++) ss = ss + (double)x[i] * (double)x[i];
                double r = 1.0 / sqrt(ss + eps);
                if (part == 0) r = r * qscale;
                for (int64_t i = 0; i < dk; i++) dst[h * dk + i] = (float)((double)x[i] * r);
            }
        }
        const float *b = ab + t * abs_, *a = b + Hv;
        for (int64_t h = 0; h < Hv; h++) {
            double x = (double)a[h] + (double)dt_bias[h];
            double sp = x > 20.0 ? x : log1p(exp(x));
            decay[t * Hv + h] = (float)exp((double)A[h] * sp);
            beta[t * Hv + h] = (float)(1.0 / (1.0 + exp(-(double)b[h])));
        }
    }
}
