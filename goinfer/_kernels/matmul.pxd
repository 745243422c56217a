# cython: language_level=3
"""C API of the matmul kernels (src/matmul.h)."""
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t

cdef extern from "gi.h" nogil:
    enum:
        GI_GROUP   # 32: quantization group along K
        GI_ROWS    # 16: output rows per row block

cdef extern from "matmul.h" nogil:
    enum:
        GI_Q4_0
        GI_Q4_1
        GI_Q8_0
        GI_MXFP4
        GI_Q6_K
        GI_Q4_K
        GI_Q5_K
        GI_Q5_0
        GI_Q5_1
        GI_F32
        GI_F16
        GI_BF16

    ctypedef struct gi_weight:
        int kind
        int64_t n_out, n_in, n_rb
        const void *qs
        const uint16_t *d
        const uint16_t *m
        const uint8_t *e
        const int8_t *sc
        const uint8_t *ks
        const float *kdec
        int64_t kdec_u0
        const int32_t *q6lo
        int64_t q6lo_m0

    ctypedef struct gi_qact:
        const int8_t *qa
        const float *da
        const int32_t *asum
        const float *sa
        int64_t K

    ctypedef struct gi_matmul_ops:
        void (*quantize_act)(const float *x, int64_t K, int64_t m0, int64_t m1,
                             int8_t *qa, float *da, int32_t *asum, float *sa) noexcept nogil
        void (*matmul_q)(const gi_weight *w, const gi_qact *a, int64_t m0, int64_t m1,
                         int64_t rb0, int64_t rb1, float *out, int64_t ldo) noexcept nogil
        void (*matmul_f)(const gi_weight *w, const float *x, int64_t m0, int64_t m1,
                         int64_t rb0, int64_t rb1, float *out, int64_t ldo) noexcept nogil
        void (*get_rows)(const gi_weight *w, const int64_t *ids, int64_t t0, int64_t t1,
                         float *out) noexcept nogil
        int mr_q, mr_f
        int64_t (*int8_probe)(int64_t reps) noexcept nogil
        int64_t (*fma_probe)(int64_t reps) noexcept nogil
        int64_t (*f16_fma_probe)(int64_t reps) noexcept nogil

    const gi_matmul_ops gi_matmul_ops_portable
    const gi_matmul_ops gi_matmul_ops_avx2
    const gi_matmul_ops gi_matmul_ops_avx512
    const gi_matmul_ops gi_matmul_ops_avx2vnni
