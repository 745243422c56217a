/* Exact attention over the paged KV cache, and the KV-cache write.
 *
 * Per layer the cache holds (docs/design/kernels.md; other storage types: kv_types.h):
 *   k_cache (n_blocks, n_kv, hd, bs) float32 / float16    keys transposed per block
 *   v_cache (n_blocks, n_kv, bs, hd) float32 / float16
 * A token's slot is block_id * bs + offset; a sequence's blocks are listed in block_table.
 *
 * Work is split in items (a tile of consecutive queries x a set of query heads of ONE kv head);
 * plan() chooses the tiling and the per-thread scratch size, run() computes one item.  The
 * Cython layer (attention.pyx) runs the items in an OpenMP loop, one scratch per thread.
 * Each output row is computed by one thread with one fixed operation sequence, so it does not
 * depend on the tiling, on the other queries in the batch or on the thread count.
 *
 * The fast kernel (attention_fast_impl.c) has the same arguments with its own plan (an item
 * may cover several kv heads, or one chunk of keys): float32 throughout, not bit-exact with
 * the exact kernel (see that file).
 */
#ifndef GI_ATTENTION_H
#define GI_ATTENTION_H
#include "gi.h"

#define GI_ATTN_RMAX 12 /* query rows (query x head) of one item */

typedef struct {
    /* ---- inputs (C-contiguous float32 / int32) */
    const float *q;              /* (T, H, hd) */
    const void *k_cache;         /* (n_blocks, n_kv, hd, bs), kv_dtype (kv_types.h) */
    const void *v_cache;         /* (n_blocks, n_kv, bs, hd) */
    int kv_dtype;                /* GI_KV_F32 / GI_KV_F16 / GI_KV_Q8_0 */
    const int32_t *block_table;  /* (n_blocks_seq,) block ids of the sequence */
    const int32_t *q_pos;        /* (T,) absolute positions */
    float *out;                  /* (T, H, hd) */
    int64_t T, H, n_kv, hd, bs;
    double scale;
    double softcap;              /* <= 0: off */
    int64_t window;              /* <= 0: off; else keys p > q_pos - window */
    const float *sinks;          /* (H,) a sink logit per query head (gpt-oss), or NULL: it
                                    joins the softmax's denominator only (not scaled or
                                    soft-capped; -inf: no sink) */
    /* ---- plan, filled by plan() */
    int64_t tq;                  /* queries per tile */
    int64_t nh;                  /* query heads (of one kv group) per item */
    int64_t nparts;              /* ceil(G / nh), G = H / n_kv */
    int64_t n_items;             /* ceil(T / tq) * n_kv * nparts */
    int64_t scratch_doubles;     /* scratch per thread, in doubles */
    /* ---- fast kernel only: keys split over items (plan sets kchunks > 1 only when the
     * caller set split_ok and max_pos; the caller then provides shared_bytes of zeroed memory
     * in shared, the same for every run of the plan) */
    int split_ok;
    int64_t max_pos;             /* largest query position any run will see */
    int64_t kchunks;             /* items per (query block, head group); 1: not split */
    int64_t kvspan;              /* fast kernel: kv heads per item (1: one, as the exact
                                    kernel; more for a few queries over many keys) */
    int64_t shared_bytes;
    void *shared;
} gi_attn_args;

typedef struct {
    void (*plan)(gi_attn_args *a, int nthreads);
    void (*run)(const gi_attn_args *a, int64_t item, double *scratch);
    /* kv heads [h0, h1) of all T tokens, in token order (a repeated slot: the last wins) */
    void (*kv_write)(void *k_cache, void *v_cache, int kv_dtype, const float *k,
                     const float *v, const int64_t *slots, int64_t T, int64_t n_kv, int64_t hd,
                     int64_t bs, int64_t h0, int64_t h1);
    /* test hooks: the float64 exp and tanh of the kernel, and the attention weight
     * trunc29(exp(x)) (significand cut to 29 bits) */
    void (*exp_f64)(const double *x, double *y, int64_t n);
    void (*tanh_f64)(const double *x, double *y, int64_t n);
    void (*weight_f64)(const double *x, double *y, int64_t n);
} gi_attn_ops;

/* Fast attention (attention_fast_impl.c): float32, tiled, online softmax.  Same arguments;
 * plan() fills tq / nh / nparts / n_items / scratch_doubles (8-byte units) for its own tiling. */
typedef struct {
    void (*plan)(gi_attn_args *a, int nthreads);
    void (*run)(const gi_attn_args *a, int64_t item, double *scratch);
    /* a bound op's share s of nshares: runs its items (items == NULL) or lists them */
    int64_t (*share)(const gi_attn_args *a, int64_t s, int64_t nshares, double *scratch,
                     int64_t *items);
} gi_attn_fast_ops;

/* a run()'s scratch rounded up to 64 bytes (each plan() leaves 64 bytes for it): a bound op's
 * scratch is the caller's buffer (a NumPy array), aligned only to its allocator's 16 */
static inline double *gi_attn_scratch64(double *p) {
    return (double *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
}

extern const gi_attn_fast_ops gi_attn_fast_ops_portable;
extern const gi_attn_fast_ops gi_attn_fast_ops_avx2;
extern const gi_attn_fast_ops gi_attn_fast_ops_avx512;

/* Phase timers (goinfer profile): while gi_attn_timing is non-zero, every run() of either
 * kernel adds the nanoseconds its thread spends in each phase to gi_attn_phase_ns:
 * [0] QK (with the key gather), [1] softmax, [2] AV.  Summed over threads (thread time, not
 * wall time); reading the clock never changes a result.  Defined in attention_common.c. */
extern int gi_attn_timing;
extern int64_t gi_attn_phase_ns[3];
int64_t gi_attn_now_ns(void);
#define GI_ATTN_PHASE_ADD(i, ns) __atomic_fetch_add(&gi_attn_phase_ns[i], (ns), __ATOMIC_RELAXED)

extern const gi_attn_ops gi_attn_ops_portable;
extern const gi_attn_ops gi_attn_ops_avx2;
extern const gi_attn_ops gi_attn_ops_avx512;

#endif
