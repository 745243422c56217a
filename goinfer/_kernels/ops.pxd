# cython: language_level=3
"""C API of the elementwise and normalization kernels (src/ops.h)."""
from libc.stdint cimport int32_t, int64_t

cdef extern from "ops.h" nogil:
    ctypedef struct gi_ops_ops:
        void (*rmsnorm)(const float *x, int64_t xs, const float *w, float *out, int64_t os,
                        int64_t m0, int64_t m1, int64_t D, double eps) noexcept nogil
        void (*swiglu)(const float *g, int64_t gs, const float *u, int64_t us, float *out,
                       int64_t os, int64_t m0, int64_t m1, int64_t c0, int64_t c1) noexcept nogil
        void (*gelu_tanh_mul)(const float *g, int64_t gs, const float *u, int64_t us, float *out,
                              int64_t os, int64_t m0, int64_t m1, int64_t c0,
                              int64_t c1) noexcept nogil
        void (*add)(const float *x, int64_t xs, const float *y, int64_t ys, float *out, int64_t os,
                    int64_t m0, int64_t m1, int64_t c0, int64_t c1) noexcept nogil
        void (*rope)(const float *x, float *out, const int32_t *pos, const double *cos_t,
                     const double *sin_t, int64_t t0, int64_t t1, int64_t H, int64_t hd,
                     int64_t half, int neox) noexcept nogil
        void (*swiglu_oai)(const float *g, int64_t gs, const float *u, int64_t us, float *out,
                           int64_t os, int64_t m0, int64_t m1, int64_t c0, int64_t c1,
                           float alpha, float limit) noexcept nogil
        void (*exp_f32)(const float *x, float *y, int64_t n) noexcept nogil
    const gi_ops_ops gi_ops_ops_portable
    const gi_ops_ops gi_ops_ops_avx2
    const gi_ops_ops gi_ops_ops_avx512
