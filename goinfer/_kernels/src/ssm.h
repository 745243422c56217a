/* Linear-attention kernels of hybrid models (Qwen3.5's Gated DeltaNet layers): the short causal
 * depthwise convolution with its state, the gated delta rule (recurrent form) with its state,
 * and the sigmoid gate of the full-attention output.
 *
 * Compiled once per ISA variant (ssm_impl.c); the Cython layer (ssm.pyx) splits the work over
 * OpenMP threads.  Every function works on a slice (columns, rows or (head, column) items), and
 * an output element's operation sequence never depends on the slice, the thread count or the
 * number of tokens in the call: the recurrence runs token by token in every case, so a prefill
 * of T tokens and T single-token decode steps give the same bits (docs/design/qwen35.md).
 * No fused multiply-add anywhere (compiled with -ffp-contract=off, no fmaf): the conv and the
 * recurrence give the same bits in every variant; the SiLU / sigmoid use gi_vf_exp.
 */
#ifndef GI_SSM_H
#define GI_SSM_H
#include "gi.h"

typedef struct {
    /* Columns [c0, c1) of the causal conv over T rows of x (row stride xs), K taps:
     *   out[t, c] = silu(sum_{j<K} wT[j, c] * xx[t + j, c]),  xx = state (K-1 rows) ++ x
     * (sum in j order, float32, unfused), out row stride os.  Then for each snapshot s,
     * rows snap_rows[s]-K+2 .. snap_rows[s] of x (earlier ones from state) are written to
     * snap + s*snap_stride ((K-1, C)), and finally the state becomes the last K-1 rows of xx. */
    void (*conv)(const float *x, int64_t xs, const float *wT, float *state, float *out,
                 int64_t os, int64_t T, int64_t C, int64_t K, int64_t c0, int64_t c1,
                 const int32_t *snap_rows, int64_t n_snap, float *snap, int64_t snap_stride);
    /* Columns [j0, j1) of value head h, all T tokens in order (the recurrent form):
     *   kv = decay * (S^T k) ; delta = (v - kv) * beta ; S = decay*S + k delta^T ; o = S^T q
     * S (dk, dv) float32 at state + h*dk*dv, k/q the normalized key/query of key head h % Hk
     * (rows of qn/kn: (T, Hk, dk)), v row t at v + t*vs + h*dv, beta/decay (T, Hv), out row t
     * at out + t*os + h*dv.  After token snap_rows[s], S's columns go to snap + s*snap_stride
     * ((Hv, dk, dv)). */
    void (*delta)(const float *qn, const float *kn, const float *v, int64_t vs,
                  const float *beta, const float *decay, float *state, float *out, int64_t os,
                  int64_t T, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, int64_t h,
                  int64_t j0, int64_t j1, const int32_t *snap_rows, int64_t n_snap, float *snap,
                  int64_t snap_stride);
    /* rows [m0, m1), columns [0, N): out = x / (1 + exp(-g)) (x * sigmoid(g)) */
    void (*sigmoid_mul)(const float *g, int64_t gs, const float *x, int64_t xs, float *out,
                        int64_t os, int64_t m0, int64_t m1, int64_t N);
} gi_ssm_ops;

/* Rows [t0, t1) (ssm_common.c, scalar double, libm: the same bits in every variant):
 *   qn = q * (1/sqrt(sum q^2 + eps)) / sqrt(dk), kn = k * (1/sqrt(sum k^2 + eps)) per key head
 *   (sums of doubles in index order, one rounding to float);
 *   decay = exp(A[h] * softplus(alpha + dt_bias[h])), beta = 1 / (1 + exp(-b)) per value head.
 * qkv row t: q (Hk*dk) | k (Hk*dk) | ... at qkv + t*qs; ab row t: b (Hv) | alpha (Hv). */
void gi_ssm_prep(const float *qkv, int64_t qs, const float *ab, int64_t abs_, const float *A,
                 const float *dt_bias, float *qn, float *kn, float *beta, float *decay,
                 int64_t t0, int64_t t1, int64_t Hk, int64_t Hv, int64_t dk, double eps);

extern const gi_ssm_ops gi_ssm_ops_portable;
extern const gi_ssm_ops gi_ssm_ops_avx2;
extern const gi_ssm_ops gi_ssm_ops_avx512;

#endif
