/* Elementwise and normalization kernels: RMSNorm, SwiGLU, GeGLU (tanh), RoPE, residual add.
 *
 * Compiled once per ISA variant (ops_impl.c); the Cython layer (ops.pyx) picks the table of
 * the variant in use and splits rows (or columns of a single row) across OpenMP threads.
 * Every function works on a sub-range so a thread gets a slice; an element's value never
 * depends on the slice, the variant or the thread count (see docs/design/kernels.md).
 *
 * 2-D operands are given as (pointer, row stride in elements); the last axis is contiguous.
 */
#ifndef GI_OPS_H
#define GI_OPS_H
#include "gi.h"

typedef struct {
    /* rows [m0, m1) of x (M, D): out = float(x * r) * w, r = float(1/sqrt(sum(x^2)/D + eps)) */
    void (*rmsnorm)(const float *x, int64_t xs, const float *w, float *out, int64_t os,
                    int64_t m0, int64_t m1, int64_t D, double eps);
    /* rows [m0, m1), columns [c0, c1): out = silu(g) * u, silu(g) = g / (1 + exp(-g)) */
    void (*swiglu)(const float *g, int64_t gs, const float *u, int64_t us, float *out,
                   int64_t os, int64_t m0, int64_t m1, int64_t c0, int64_t c1);
    /* same ranges: out = gelu_tanh(g) * u, gelu_tanh(g) = g / (1 + exp(-2c(g + 0.044715 g^3))) */
    void (*gelu_tanh_mul)(const float *g, int64_t gs, const float *u, int64_t us, float *out,
                          int64_t os, int64_t m0, int64_t m1, int64_t c0, int64_t c1);
    /* same ranges: out = x + y */
    void (*add)(const float *x, int64_t xs, const float *y, int64_t ys, float *out, int64_t os,
                int64_t m0, int64_t m1, int64_t c0, int64_t c1);
    /* tokens [t0, t1) of x (T, H, hd) contiguous; out may be x (in place).  cos/sin
     * (max_pos, half) float64; the first 2*half dims rotate, the rest are copied. */
    void (*rope)(const float *x, float *out, const int32_t *pos, const double *cos_t,
                 const double *sin_t, int64_t t0, int64_t t1, int64_t H, int64_t hd,
                 int64_t half, int neox);
    /* same ranges: gpt-oss's clamped SwiGLU, x = min(g, limit), y = clamp(u, -limit, limit),
     * out = (x / (1 + exp(-(alpha * x)))) * (y + 1) */
    void (*swiglu_oai)(const float *g, int64_t gs, const float *u, int64_t us, float *out,
                       int64_t os, int64_t m0, int64_t m1, int64_t c0, int64_t c1, float alpha,
                       float limit);
    /* test hook: y[i] = gi_vf_exp(x[i]) (the float32 exp used by swiglu / gelu_tanh_mul) */
    void (*exp_f32)(const float *x, float *y, int64_t n);
} gi_ops_ops;

extern const gi_ops_ops gi_ops_ops_portable;
extern const gi_ops_ops gi_ops_ops_avx2;
extern const gi_ops_ops gi_ops_ops_avx512;

#endif
