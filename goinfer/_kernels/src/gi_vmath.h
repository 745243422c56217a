/* Vector math for the elementwise and attention kernels (ops_impl.c, attention_impl.c).
 *
 * A thin layer over the ISA of the variant being compiled:
 *   vf: VF_N float32 lanes   (avx512: 16, avx2: 8, portable: 1 = plain float)
 *   vd: VD_N float64 lanes   (avx512: 8,  avx2: 4, portable: 1 = plain double)
 * Every operation is lane-wise IEEE (add, sub, mul, div, compare/select, integer bit
 * arithmetic), so one function written against this layer gives the same bits in every
 * lane, in every variant, and in the scalar (portable) build.  Tails are handled by masked
 * loads/stores of the same vector code, never by a different scalar formula.
 *
 * vf_muladd(a, b, c) = a*b + c in float32, fused on AVX2/AVX-512 and unfused in the portable
 * build: only for the fast attention kernel, whose results are not bit-exact across variants.
 *
 * vd_fma_exact(a, b, c) = a*b + c is fused where the ISA has FMA and unfused in the portable
 * build.  It may ONLY be used where the product a*b is exact in double (float*float, or a
 * double with <= 29 significant bits times a float): then fused and unfused round once, at
 * the same place, and give the same bits.
 *
 * exp:  gi_vf_exp (float32, <= 1.5 ulp over [-86.9, 88.7]) and gi_vd_exp (float64, <= 1.6 ulp
 * measured on [-600, 700]) share one recipe: n = rint(x*log2 e) by the 1.5*2^p "magic" add,
 * r = x - n*ln2 (ln2 split in two, the high part short so n*hi is exact), a polynomial for
 * e^r on |r| <= ln2/2, then * 2^(n-1) * 2 built from exponent bits (so n = max+1 does not
 * need an infinite scale).  Below XMIN the result is flushed to +0, above XMAX it is +inf,
 * NaN propagates.  No libm call, no table: the same instructions for every element.
 */
#ifndef GI_VMATH_H
#define GI_VMATH_H
#include "gi.h"
#include <math.h>
#include <string.h>

#if defined(GI_VARIANT_AVX512) || defined(GI_VARIANT_AVX2)
#include <immintrin.h>
#endif

/* ============================================================================ constants */

#define GI_LOG2E 1.4426950408889634
/* float32: ln2 = LN2HI_F + LN2LO_F, LN2HI_F = 355/512 has 9 significant bits */
#define GI_LN2HI_F 0.693359375f
#define GI_LN2LO_F (-0x1.bd0106p-13f) /* float32(ln2 - LN2HI_F) */
#define GI_MAGIC_F 12582912.0f /* 1.5 * 2^23 */
#define GI_EXPF_XMIN (-86.9f)  /* below: flushed to 0 (exp(-86.9) ~ 2e-38, near FLT_MIN) */
#define GI_EXPF_XMAX 88.72283f /* above: +inf (ln FLT_MAX = 88.7228391...) */
/* e^r = 1 + r + r^2 * P(r), P fitted (Chebyshev nodes, rounded to float32) on |r| <= ln2/2 */
#define GI_EXPF_P0 0.5f
#define GI_EXPF_P1 0x1.5554dcp-3f
#define GI_EXPF_P2 0x1.5554eap-5f
#define GI_EXPF_P3 0x1.120b66p-7f
#define GI_EXPF_P4 0x1.6d431ap-10f

/* float64: LN2HI_D is ln2 with the low 21 significand bits cleared (n*hi exact for |n|<2^21) */
#define GI_LN2HI_D 0x1.62e42fee00000p-1
#define GI_LN2LO_D 0x1.a39ef35793c76p-33
#define GI_MAGIC_D 6755399441055744.0 /* 1.5 * 2^52 */
#define GI_EXPD_XMIN (-600.0)         /* below: flushed to 0 (see attention_impl.c) */
#define GI_EXPD_XMAX 709.782712893384 /* above: +inf */
/* e^r = 1 + r + r^2 * P(r), P = Taylor 1/2! .. 1/12! (truncation < 2e-16 on |r| <= ln2/2) */
#define GI_EXPD_C2 (1.0 / 2.0)
#define GI_EXPD_C3 (1.0 / 6.0)
#define GI_EXPD_C4 (1.0 / 24.0)
#define GI_EXPD_C5 (1.0 / 120.0)
#define GI_EXPD_C6 (1.0 / 720.0)
#define GI_EXPD_C7 (1.0 / 5040.0)
#define GI_EXPD_C8 (1.0 / 40320.0)
#define GI_EXPD_C9 (1.0 / 362880.0)
#define GI_EXPD_C10 (1.0 / 3628800.0)
#define GI_EXPD_C11 (1.0 / 39916800.0)
#define GI_EXPD_C12 (1.0 / 479001600.0)

/* ============================================================================ AVX-512 */
#if defined(GI_VARIANT_AVX512)
#define VF_N 16
#define VD_N 8
typedef __m512 vf;
typedef __m512d vd;
typedef __m512i vfi; /* 32-bit integer lanes of a vf */
typedef __m512i vdi; /* 64-bit integer lanes of a vd */

GI_INLINE vf vf_set1(float a) { return _mm512_set1_ps(a); }
GI_INLINE vf vf_load(const float *p) { return _mm512_loadu_ps(p); }
GI_INLINE vf vf_load_n(const float *p, int n) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1u), p);
}
GI_INLINE void vf_store(float *p, vf v) { _mm512_storeu_ps(p, v); }
GI_INLINE void vf_store_n(float *p, vf v, int n) {
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1u), v);
}
GI_INLINE vf vf_add(vf a, vf b) { return _mm512_add_ps(a, b); }
GI_INLINE vf vf_sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
GI_INLINE vf vf_mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
GI_INLINE vf vf_div(vf a, vf b) { return _mm512_div_ps(a, b); }
/* (x > c) ? a : b  and  (x < c) ? a : b, ordered compares (false for NaN) */
GI_INLINE vf vf_sel_gt(vf x, vf c, vf a, vf b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, c, _CMP_GT_OQ), b, a);
}
GI_INLINE vf vf_sel_lt(vf x, vf c, vf a, vf b) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, c, _CMP_LT_OQ), b, a);
}
GI_INLINE vfi vf_bits(vf a) { return _mm512_castps_si512(a); }
GI_INLINE vf vf_from_bits(vfi a) { return _mm512_castsi512_ps(a); }
GI_INLINE vfi vfi_add(vfi a, int32_t b) { return _mm512_add_epi32(a, _mm512_set1_epi32(b)); }
GI_INLINE vfi vfi_shl(vfi a, int s) { return _mm512_slli_epi32(a, (unsigned)s); }
GI_INLINE vf vf_zero(void) { return _mm512_setzero_ps(); }
GI_INLINE vf vf_max(vf a, vf b) { return _mm512_max_ps(a, b); }
GI_INLINE float vf_hmax(vf a) { return _mm512_reduce_max_ps(a); }
GI_INLINE float vf_hsum(vf a) { return _mm512_reduce_add_ps(a); }
/* a*b + c, fused (the fast attention kernel only: its results may differ between variants) */
GI_INLINE vf vf_muladd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
GI_INLINE vfi vfi_and(vfi a, uint32_t m) {
    return _mm512_and_si512(a, _mm512_set1_epi32((int)m));
}
GI_INLINE vfi vfi_or(vfi a, vfi b) { return _mm512_or_si512(a, b); }

GI_INLINE vd vd_zero(void) { return _mm512_setzero_pd(); }
GI_INLINE vd vd_set1(double a) { return _mm512_set1_pd(a); }
GI_INLINE vd vd_load(const double *p) { return _mm512_loadu_pd(p); }
GI_INLINE vd vd_load_n(const double *p, int n) {
    return _mm512_maskz_loadu_pd((__mmask8)((1u << n) - 1u), p);
}
GI_INLINE void vd_store(double *p, vd v) { _mm512_storeu_pd(p, v); }
GI_INLINE void vd_store_n(double *p, vd v, int n) {
    _mm512_mask_storeu_pd(p, (__mmask8)((1u << n) - 1u), v);
}
GI_INLINE vd vd_loadps(const float *p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }
GI_INLINE vd vd_loadps_n(const float *p, int n) {
    return _mm512_cvtps_pd(_mm256_maskz_loadu_ps((__mmask8)((1u << n) - 1u), p));
}
GI_INLINE void vd_storeps(float *p, vd v) { _mm256_storeu_ps(p, _mm512_cvtpd_ps(v)); }
GI_INLINE void vd_storeps_n(float *p, vd v, int n) {
    _mm256_mask_storeu_ps(p, (__mmask8)((1u << n) - 1u), _mm512_cvtpd_ps(v));
}
GI_INLINE vd vd_add(vd a, vd b) { return _mm512_add_pd(a, b); }
GI_INLINE vd vd_sub(vd a, vd b) { return _mm512_sub_pd(a, b); }
GI_INLINE vd vd_mul(vd a, vd b) { return _mm512_mul_pd(a, b); }
GI_INLINE vd vd_div(vd a, vd b) { return _mm512_div_pd(a, b); }
GI_INLINE vd vd_fma_exact(vd a, vd b, vd c) { return _mm512_fmadd_pd(a, b, c); }
/* (a > b) ? a : b, lane-wise, as the x86 max instruction */
GI_INLINE vd vd_max(vd a, vd b) { return _mm512_max_pd(a, b); }
GI_INLINE double vd_hmax(vd a) { return _mm512_reduce_max_pd(a); }
GI_INLINE double vd_lane0(vd a) { return _mm512_cvtsd_f64(a); }
GI_INLINE vd vd_sel_gt(vd x, vd c, vd a, vd b) {
    return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(x, c, _CMP_GT_OQ), b, a);
}
GI_INLINE vd vd_sel_lt(vd x, vd c, vd a, vd b) {
    return _mm512_mask_blend_pd(_mm512_cmp_pd_mask(x, c, _CMP_LT_OQ), b, a);
}
GI_INLINE vdi vd_bits(vd a) { return _mm512_castpd_si512(a); }
GI_INLINE vd vd_from_bits(vdi a) { return _mm512_castsi512_pd(a); }
GI_INLINE vdi vdi_add(vdi a, int64_t b) { return _mm512_add_epi64(a, _mm512_set1_epi64(b)); }
GI_INLINE vdi vdi_shl(vdi a, int s) { return _mm512_slli_epi64(a, (unsigned)s); }
GI_INLINE vdi vdi_and(vdi a, uint64_t m) {
    return _mm512_and_si512(a, _mm512_set1_epi64((long long)m));
}
GI_INLINE vdi vdi_or(vdi a, vdi b) { return _mm512_or_si512(a, b); }
GI_INLINE vdi vdi_xor(vdi a, vdi b) { return _mm512_xor_si512(a, b); }

/* ============================================================================ AVX2 */
#elif defined(GI_VARIANT_AVX2)
#define VF_N 8
#define VD_N 4
typedef __m256 vf;
typedef __m256d vd;
typedef __m256i vfi;
typedef __m256i vdi;

GI_INLINE __m256i gi_mask32x8(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
GI_INLINE __m128i gi_mask32x4(int n) {
    return _mm_cmpgt_epi32(_mm_set1_epi32(n), _mm_setr_epi32(0, 1, 2, 3));
}
GI_INLINE __m256i gi_mask64x4(int n) {
    return _mm256_cmpgt_epi64(_mm256_set1_epi64x(n), _mm256_setr_epi64x(0, 1, 2, 3));
}

GI_INLINE vf vf_set1(float a) { return _mm256_set1_ps(a); }
GI_INLINE vf vf_load(const float *p) { return _mm256_loadu_ps(p); }
GI_INLINE vf vf_load_n(const float *p, int n) { return _mm256_maskload_ps(p, gi_mask32x8(n)); }
GI_INLINE void vf_store(float *p, vf v) { _mm256_storeu_ps(p, v); }
GI_INLINE void vf_store_n(float *p, vf v, int n) { _mm256_maskstore_ps(p, gi_mask32x8(n), v); }
GI_INLINE vf vf_add(vf a, vf b) { return _mm256_add_ps(a, b); }
GI_INLINE vf vf_sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
GI_INLINE vf vf_mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
GI_INLINE vf vf_div(vf a, vf b) { return _mm256_div_ps(a, b); }
GI_INLINE vf vf_sel_gt(vf x, vf c, vf a, vf b) {
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, c, _CMP_GT_OQ));
}
GI_INLINE vf vf_sel_lt(vf x, vf c, vf a, vf b) {
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, c, _CMP_LT_OQ));
}
GI_INLINE vfi vf_bits(vf a) { return _mm256_castps_si256(a); }
GI_INLINE vf vf_from_bits(vfi a) { return _mm256_castsi256_ps(a); }
GI_INLINE vfi vfi_add(vfi a, int32_t b) { return _mm256_add_epi32(a, _mm256_set1_epi32(b)); }
GI_INLINE vfi vfi_shl(vfi a, int s) { return _mm256_slli_epi32(a, s); }
GI_INLINE vf vf_zero(void) { return _mm256_setzero_ps(); }
GI_INLINE vf vf_max(vf a, vf b) { return _mm256_max_ps(a, b); }
GI_INLINE float vf_hmax(vf a) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}
GI_INLINE float vf_hsum(vf a) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
}
GI_INLINE vf vf_muladd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
GI_INLINE vfi vfi_and(vfi a, uint32_t m) {
    return _mm256_and_si256(a, _mm256_set1_epi32((int)m));
}
GI_INLINE vfi vfi_or(vfi a, vfi b) { return _mm256_or_si256(a, b); }

GI_INLINE vd vd_zero(void) { return _mm256_setzero_pd(); }
GI_INLINE vd vd_set1(double a) { return _mm256_set1_pd(a); }
GI_INLINE vd vd_load(const double *p) { return _mm256_loadu_pd(p); }
GI_INLINE vd vd_load_n(const double *p, int n) { return _mm256_maskload_pd(p, gi_mask64x4(n)); }
GI_INLINE void vd_store(double *p, vd v) { _mm256_storeu_pd(p, v); }
GI_INLINE void vd_store_n(double *p, vd v, int n) { _mm256_maskstore_pd(p, gi_mask64x4(n), v); }
GI_INLINE vd vd_loadps(const float *p) { return _mm256_cvtps_pd(_mm_loadu_ps(p)); }
GI_INLINE vd vd_loadps_n(const float *p, int n) {
    return _mm256_cvtps_pd(_mm_maskload_ps(p, gi_mask32x4(n)));
}
GI_INLINE void vd_storeps(float *p, vd v) { _mm_storeu_ps(p, _mm256_cvtpd_ps(v)); }
GI_INLINE void vd_storeps_n(float *p, vd v, int n) {
    _mm_maskstore_ps(p, gi_mask32x4(n), _mm256_cvtpd_ps(v));
}
GI_INLINE vd vd_add(vd a, vd b) { return _mm256_add_pd(a, b); }
GI_INLINE vd vd_sub(vd a, vd b) { return _mm256_sub_pd(a, b); }
GI_INLINE vd vd_mul(vd a, vd b) { return _mm256_mul_pd(a, b); }
GI_INLINE vd vd_div(vd a, vd b) { return _mm256_div_pd(a, b); }
GI_INLINE vd vd_fma_exact(vd a, vd b, vd c) { return _mm256_fmadd_pd(a, b, c); }
GI_INLINE vd vd_max(vd a, vd b) { return _mm256_max_pd(a, b); }
GI_INLINE double vd_lane0(vd a) { return _mm256_cvtsd_f64(a); }
GI_INLINE double vd_hmax(vd a) {
    double t[4];
    _mm256_storeu_pd(t, a);
    double m = t[0];
    for (int i = 1; i < 4; i++) m = t[i] > m ? t[i] : m;
    return m;
}
GI_INLINE vd vd_sel_gt(vd x, vd c, vd a, vd b) {
    return _mm256_blendv_pd(b, a, _mm256_cmp_pd(x, c, _CMP_GT_OQ));
}
GI_INLINE vd vd_sel_lt(vd x, vd c, vd a, vd b) {
    return _mm256_blendv_pd(b, a, _mm256_cmp_pd(x, c, _CMP_LT_OQ));
}
GI_INLINE vdi vd_bits(vd a) { return _mm256_castpd_si256(a); }
GI_INLINE vd vd_from_bits(vdi a) { return _mm256_castsi256_pd(a); }
GI_INLINE vdi vdi_add(vdi a, int64_t b) { return _mm256_add_epi64(a, _mm256_set1_epi64x(b)); }
GI_INLINE vdi vdi_shl(vdi a, int s) { return _mm256_slli_epi64(a, s); }
GI_INLINE vdi vdi_and(vdi a, uint64_t m) {
    return _mm256_and_si256(a, _mm256_set1_epi64x((long long)m));
}
GI_INLINE vdi vdi_or(vdi a, vdi b) { return _mm256_or_si256(a, b); }
GI_INLINE vdi vdi_xor(vdi a, vdi b) { return _mm256_xor_si256(a, b); }

/* ============================================================================ portable */
#else
#define VF_N 1
#define VD_N 1
typedef float vf;
typedef double vd;
typedef uint32_t vfi;
typedef uint64_t vdi;

GI_INLINE vf vf_set1(float a) { return a; }
GI_INLINE vf vf_load(const float *p) { return *p; }
GI_INLINE vf vf_load_n(const float *p, int n) { return n > 0 ? *p : 0.0f; }
GI_INLINE void vf_store(float *p, vf v) { *p = v; }
GI_INLINE void vf_store_n(float *p, vf v, int n) { if (n > 0) *p = v; }
GI_INLINE vf vf_add(vf a, vf b) { return a + b; }
GI_INLINE vf vf_sub(vf a, vf b) { return a - b; }
GI_INLINE vf vf_mul(vf a, vf b) { return a * b; }
GI_INLINE vf vf_div(vf a, vf b) { return a / b; }
/* selects as bit masks from quiet compares: no branch, so compilers can vectorize the
 * portable loops even under -ftrapping-math */
GI_INLINE vf vf_blend(uint32_t m, vf a, vf b) {
    uint32_t ua, ub, r;
    memcpy(&ua, &a, 4);
    memcpy(&ub, &b, 4);
    r = (ua & m) | (ub & ~m);
    vf f;
    memcpy(&f, &r, 4);
    return f;
}
GI_INLINE vf vf_sel_gt(vf x, vf c, vf a, vf b) {
    return vf_blend(-(uint32_t)__builtin_isgreater(x, c), a, b);
}
GI_INLINE vf vf_sel_lt(vf x, vf c, vf a, vf b) {
    return vf_blend(-(uint32_t)__builtin_isless(x, c), a, b);
}
GI_INLINE vfi vf_bits(vf a) { vfi u; memcpy(&u, &a, 4); return u; }
GI_INLINE vf vf_from_bits(vfi a) { vf f; memcpy(&f, &a, 4); return f; }
GI_INLINE vfi vfi_add(vfi a, int32_t b) { return a + (uint32_t)b; }
GI_INLINE vfi vfi_shl(vfi a, int s) { return a << s; }
GI_INLINE vf vf_zero(void) { return 0.0f; }
GI_INLINE vf vf_max(vf a, vf b) { return vf_blend(-(uint32_t)__builtin_isgreater(a, b), a, b); }
GI_INLINE float vf_hmax(vf a) { return a; }
GI_INLINE float vf_hsum(vf a) { return a; }
GI_INLINE vf vf_muladd(vf a, vf b, vf c) { return a * b + c; } /* unfused (no FMA flags) */
GI_INLINE vfi vfi_and(vfi a, uint32_t m) { return a & m; }
GI_INLINE vfi vfi_or(vfi a, vfi b) { return a | b; }

GI_INLINE vd vd_zero(void) { return 0.0; }
GI_INLINE vd vd_set1(double a) { return a; }
GI_INLINE vd vd_load(const double *p) { return *p; }
GI_INLINE vd vd_load_n(const double *p, int n) { return n > 0 ? *p : 0.0; }
GI_INLINE void vd_store(double *p, vd v) { *p = v; }
GI_INLINE void vd_store_n(double *p, vd v, int n) { if (n > 0) *p = v; }
GI_INLINE vd vd_loadps(const float *p) { return (double)*p; }
GI_INLINE vd vd_loadps_n(const float *p, int n) { return n > 0 ? (double)*p : 0.0; }
GI_INLINE void vd_storeps(float *p, vd v) { *p = (float)v; }
GI_INLINE void vd_storeps_n(float *p, vd v, int n) { if (n > 0) *p = (float)v; }
GI_INLINE vd vd_add(vd a, vd b) { return a + b; }
GI_INLINE vd vd_sub(vd a, vd b) { return a - b; }
GI_INLINE vd vd_mul(vd a, vd b) { return a * b; }
GI_INLINE vd vd_div(vd a, vd b) { return a / b; }
GI_INLINE vd vd_fma_exact(vd a, vd b, vd c) { return a * b + c; } /* exact product: = fma */
GI_INLINE vd vd_blend(uint64_t m, vd a, vd b) {
    uint64_t ua, ub, r;
    memcpy(&ua, &a, 8);
    memcpy(&ub, &b, 8);
    r = (ua & m) | (ub & ~m);
    vd f;
    memcpy(&f, &r, 8);
    return f;
}
GI_INLINE vd vd_max(vd a, vd b) { return vd_blend(-(uint64_t)__builtin_isgreater(a, b), a, b); }
GI_INLINE double vd_hmax(vd a) { return a; }
GI_INLINE double vd_lane0(vd a) { return a; }
GI_INLINE vd vd_sel_gt(vd x, vd c, vd a, vd b) {
    return vd_blend(-(uint64_t)__builtin_isgreater(x, c), a, b);
}
GI_INLINE vd vd_sel_lt(vd x, vd c, vd a, vd b) {
    return vd_blend(-(uint64_t)__builtin_isless(x, c), a, b);
}
GI_INLINE vdi vd_bits(vd a) { vdi u; memcpy(&u, &a, 8); return u; }
GI_INLINE vd vd_from_bits(vdi a) { vd f; memcpy(&f, &a, 8); return f; }
GI_INLINE vdi vdi_add(vdi a, int64_t b) { return a + (uint64_t)b; }
GI_INLINE vdi vdi_shl(vdi a, int s) { return a << s; }
GI_INLINE vdi vdi_and(vdi a, uint64_t m) { return a & m; }
GI_INLINE vdi vdi_or(vdi a, vdi b) { return a | b; }
GI_INLINE vdi vdi_xor(vdi a, vdi b) { return a ^ b; }
#endif

/* ============================================================================ exp, float32 */

GI_INLINE vf gi_vf_exp(vf x) {
    vf t = vf_add(vf_mul(x, vf_set1((float)GI_LOG2E)), vf_set1(GI_MAGIC_F)); /* magic + n */
    vf n = vf_sub(t, vf_set1(GI_MAGIC_F));
    vf r = vf_sub(x, vf_mul(n, vf_set1(GI_LN2HI_F)));
    r = vf_sub(r, vf_mul(n, vf_set1(GI_LN2LO_F)));
    vf p = vf_set1(GI_EXPF_P4);
    p = vf_add(vf_mul(p, r), vf_set1(GI_EXPF_P3));
    p = vf_add(vf_mul(p, r), vf_set1(GI_EXPF_P2));
    p = vf_add(vf_mul(p, r), vf_set1(GI_EXPF_P1));
    p = vf_add(vf_mul(p, r), vf_set1(GI_EXPF_P0));
    vf y = vf_add(vf_mul(vf_mul(r, r), p), r);
    y = vf_add(y, vf_set1(1.0f));
    /* bits(t) = bits(magic) + n and bits(magic) has 9 zero low bits: (bits+126)<<23 = 2^(n-1) */
    vf s = vf_from_bits(vfi_shl(vfi_add(vf_bits(t), 126), 23));
    y = vf_mul(vf_mul(y, s), vf_set1(2.0f));
    y = vf_sel_gt(x, vf_set1(GI_EXPF_XMAX), vf_set1(INFINITY), y);
    y = vf_sel_lt(x, vf_set1(GI_EXPF_XMIN), vf_set1(0.0f), y);
    return y;
}

/* tanh(u) in float32 = sign(u) * (1 - e) / (1 + e), e = exp(-2|u|) (fast attention softcap;
 * absolute error ~1e-7) */
GI_INLINE vf gi_vf_tanh(vf u) {
    const uint32_t sign = 0x80000000u;
    vfi ub = vf_bits(u);
    vf a = vf_from_bits(vfi_and(ub, ~sign));
    vf e = gi_vf_exp(vf_mul(a, vf_set1(-2.0f)));
    vf t = vf_div(vf_sub(vf_set1(1.0f), e), vf_add(vf_set1(1.0f), e));
    return vf_from_bits(vfi_or(vf_bits(t), vfi_and(ub, sign)));
}

/* ============================================================================ exp, float64 */

GI_INLINE vd gi_vd_exp(vd x) {
    vd t = vd_add(vd_mul(x, vd_set1(GI_LOG2E)), vd_set1(GI_MAGIC_D));
    vd n = vd_sub(t, vd_set1(GI_MAGIC_D));
    vd r = vd_sub(x, vd_mul(n, vd_set1(GI_LN2HI_D)));
    r = vd_sub(r, vd_mul(n, vd_set1(GI_LN2LO_D)));
    vd p = vd_set1(GI_EXPD_C12);
    p = vd_add(vd_mul(p, r), vd_set1(GI_EXPD_C11));
    p = vd_add(vd_mul(p, r), vd_set1(GI_EXPD_C10));
    p = vd_add(vd_mul(p, r), vd_set1(GI_EXPD_C9));
    p = vd_add(vd_mul(p, r), vd_set1(GI_EXPD_C8));
    p = vd_add(vd_mul(p, r), vd_set1(GI_EXPD_C7));
    p = vd_add(vd_mul(p, r), vd_set1(GI_EXPD_C6));
    p = vd_add(vd_mul(p, r), vd_set1(GI_EXPD_C5));
    p = vd_add(vd_mul(p, r), vd_set1(GI_EXPD_C4));
    p = vd_add(vd_mul(p, r), vd_set1(GI_EXPD_C3));
    p = vd_add(vd_mul(p, r), vd_set1(GI_EXPD_C2));
    vd y = vd_add(vd_mul(vd_mul(r, r), p), r);
    y = vd_add(y, vd_set1(1.0));
    /* bits(t) = bits(magic) + n, low 12 bits of bits(magic) are 0: (bits+1022)<<52 = 2^(n-1) */
    vd s = vd_from_bits(vdi_shl(vdi_add(vd_bits(t), 1022), 52));
    y = vd_mul(vd_mul(y, s), vd_set1(2.0));
    y = vd_sel_gt(x, vd_set1(GI_EXPD_XMAX), vd_set1(INFINITY), y);
    y = vd_sel_lt(x, vd_set1(GI_EXPD_XMIN), vd_set1(0.0), y);
    return y;
}

/* tanh(u) = sign(u) * (1 - e) / (1 + e), e = exp(-2|u|) in (0, 1]: no overflow; absolute
 * error ~1e-16 (relative error grows near 0 by cancellation, absolute stays ~1e-16). */
GI_INLINE vd gi_vd_tanh(vd u) {
    const uint64_t sign = 0x8000000000000000ull;
    vdi ub = vd_bits(u);
    vd a = vd_from_bits(vdi_and(ub, ~sign));
    vd e = gi_vd_exp(vd_mul(a, vd_set1(-2.0)));
    vd t = vd_div(vd_sub(vd_set1(1.0), e), vd_add(vd_set1(1.0), e));
    return vd_from_bits(vdi_or(vd_bits(t), vdi_and(ub, sign)));
}

#endif
