/* Mixture-of-Experts kernels: routing (softmax / top-k), grouping the routed rows by expert,
 * and folding each row's expert outputs back in the router's rank order.
 *
 * Compiled once per ISA variant (moe_impl.c); the Cython layer (moe.pyx) splits rows across
 * OpenMP threads.  Every output row depends only on its own inputs, in one fixed operation
 * order, so the results do not depend on the number of rows, the split or the variant
 * (see docs/design/kernels.md, "Mixture of Experts").
 */
#ifndef GI_MOE_H
#define GI_MOE_H
#include "gi.h"

/* Routing modes. */
enum {
    GI_MOE_SOFTMAX_TOPK = 0, /* p = softmax over all E logits, then the k largest p
                                (qwen2moe, qwen3moe, olmoe); optionally renormalized */
    GI_MOE_TOPK_SOFTMAX = 1  /* the k largest logits, then softmax over those k (mixtral) */
};

typedef struct gi_moe_ops {
    /* Rows [t0, t1) of logits (T, E) -> ids (T, k) int32 and weights (T, k) float32.
       Ties go to the lower expert index; a NaN ranks below every number (in softmax_topk a
       NaN logit makes the whole row's p NaN: the weights are NaN).
       softmax_topk: e_j = exp(l_j - max), S = sum_j e_j (double, index order), p_j = e_j / S;
         norm: w_r = p_r / (sum of the chosen p in rank order), else w_r = p_r.
       topk_softmax: e_r = exp(l_r - l_0) over the chosen, w_r = e_r / (sum in rank order).
       Then w_r = (float)(w_r * scale).  work: E doubles of scratch per call. */
    void (*route)(const float *logits, int64_t E, int64_t t0, int64_t t1, int k, int mode,
                  int norm, double scale, int32_t *ids, float *w, double *work);
    /* Rows [t0, t1), columns [c0, c1) of out (T, D), row stride ldo; in float64 (every
       product of two floats is exact), rounded once to float at the end:
         acc = w[t,0] * y[pos[t*k+0]];  acc = acc + w[t,r] * y[pos[t*k+r]], r = 1..k-1
         renorm:  acc = acc / (w[t,0] + ... + w[t,k-1])       (sum in rank order)
         shared:  acc = acc + g * sh[t],  g = (float)(1 / (1 + exp(-sh_logit[t])))
         out = (float)acc
       renorm cancels the float32 rounding of weights meant to sum to 1 (k identical experts
       then give exactly the expert's output).  y rows have stride ldy, sh rows stride lds;
       sh == NULL: no shared expert. */
    void (*fold)(const float *y, int64_t ldy, const float *w, const int32_t *pos, int k,
                 int renorm, const float *sh, int64_t lds, const float *sh_logit, int64_t t0,
                 int64_t t1, int64_t c0, int64_t c1, float *out, int64_t ldo);
} gi_moe_ops;

extern const gi_moe_ops gi_moe_ops_portable;
extern const gi_moe_ops gi_moe_ops_avx2;
extern const gi_moe_ops gi_moe_ops_avx512;

/* Stable counting sort of the T*k routed entries by expert (compiled once, no ISA code):
   entries (t, r) in order of expert, then of t*k + r.
   rows[i] = t of sorted entry i; pos[t*k + r] = i; offsets[e] .. offsets[e+1] are expert e's.
   Returns -1 (and writes nothing) if an id is outside [0, E), else 0.
   count: E int64 of scratch. */
int gi_moe_group(const int32_t *ids, int64_t T, int k, int64_t E, int32_t *rows, int32_t *pos,
                 int64_t *offsets, int64_t *count);

#endif
