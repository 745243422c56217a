/* Storage types of the KV cache (docs/design/kernels.md "Layouts of the KV cache"):
 *
 *   GI_KV_F32   float32
 *   GI_KV_F16   IEEE binary16, rounded to nearest even once when written (the default)
 *   GI_KV_Q8_0  blocks of 32 consecutive values of one token along head_dim: int8 q and one
 *               float16 scale s (like llama.cpp's q8_0); the stored value is s * q
 *
 * Every stored value converts EXACTLY to float32 (an f16 has 11 significant bits, s * q has
 * at most 11 + 8 = 19), so both attention kernels compute on the stored values themselves:
 * a kernel over a cache of any type gives the bits it gives over a float32 cache holding the
 * same values (tests/test_kernels_attention.py).
 *
 * Per layer, block b, kv head h (bs = block size, hd = head dim, G = hd / 32):
 *   f32 / f16  K (hd, bs) transposed, V (bs, hd)              elements of 4 / 2 bytes
 *   q8_0       K (hd + hd/16, bs) int8: rows [0, hd) the q of key j at d (transposed), then
 *                  G rows pairs holding bs float16 scales each: scale(g, j) at
 *                  ((uint16 *)(base + hd * bs))[g * bs + j]
 *              V (bs, hd + hd/16) int8: per key hd q, then G float16 scales
 * Included by the *_impl.c files after gi_vmath.h (vector loaders per variant).
 */
#ifndef GI_KV_TYPES_H
#define GI_KV_TYPES_H
#include <math.h>
#include <string.h>

#include "gi.h"

enum { GI_KV_F32 = 0, GI_KV_F16 = 1, GI_KV_Q8_0 = 2 };
#define GI_KV_QB 32 /* q8_0 block: values per scale */

/* bytes of one (block, kv head) of K or of V */
GI_INLINE int64_t gi_kv_head_bytes(int dt, int64_t hd, int64_t bs) {
    return dt == GI_KV_F32 ? 4 * hd * bs : dt == GI_KV_F16 ? 2 * hd * bs : (hd + hd / 16) * bs;
}

/* bytes of one V row (one key) */
GI_INLINE int64_t gi_kv_vrow_bytes(int dt, int64_t hd) {
    return dt == GI_KV_F32 ? 4 * hd : dt == GI_KV_F16 ? 2 * hd : hd + hd / 16;
}

/* ============================================================================ scalar f16 */

/* exact */
GI_INLINE float gi_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (m << 13); /* inf, NaN (payload kept) */
    } else if (e != 0) {
        u = sign | ((e + 112u) << 23) | (m << 13);
    } else { /* zero or subnormal: m * 2^-24, exact in float */
        float f = (float)m * 0x1p-24f;
        memcpy(&u, &f, 4);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* round to nearest even (as F16C's vcvtps2ph with imm 0 and NumPy's astype(float16));
 * overflow gives inf, NaN stays NaN (quiet, payload truncated) */
GI_INLINE uint16_t gi_f32_to_f16(float x) {
    uint32_t f;
    memcpy(&f, &x, 4);
    const uint32_t sign = f & 0x80000000u;
    f ^= sign;
    uint16_t o;
    if (f >= 0x47800000u) { /* >= 65536, inf or NaN */
        o = f > 0x7f800000u ? (uint16_t)(0x7e00u | ((f >> 13) & 0x3ffu)) : 0x7c00u;
    } else if (f < 0x38800000u) { /* below 2^-14: f16 subnormal or zero, by a float add */
        const uint32_t magic_bits = ((127u - 15u) + (23u - 10u) + 1u) << 23;
        float ff, magic;
        memcpy(&ff, &f, 4);
        memcpy(&magic, &magic_bits, 4);
        ff += magic; /* the add rounds to nearest even at 2^-24 */
        uint32_t u;
        memcpy(&u, &ff, 4);
        o = (uint16_t)(u - magic_bits);
    } else {
        const uint32_t odd = (f >> 13) & 1u;
        f += ((uint32_t)(15 - 127) << 23) + 0xfffu + odd; /* rebias and round (may carry to inf) */
        o = (uint16_t)(f >> 13);
    }
    return (uint16_t)(o | (sign >> 16));
}

/* q8_0 of 32 values: amax = max |x| (NaN if any x is NaN), s = f16(amax / 127),
 * q = clamp(rint(x / float(s)), -127, 127); q = 0 when s is 0, inf or NaN (then s * q is 0 or
 * NaN: a non-finite input makes its block NaN).  Returns s; q written with stride qstride. */
GI_INLINE uint16_t gi_q8_0_block(const float *x, int8_t *q, int64_t qstride) {
    float amax = 0.0f;
    int nan = 0;
    for (int i = 0; i < GI_KV_QB; i++) {
        const float a = fabsf(x[i]);
        nan |= a != a;
        amax = a > amax ? a : amax;
    }
    if (nan) amax = NAN;
    const uint16_t sh = gi_f32_to_f16(amax / 127.0f);
    const float s = gi_f16_to_f32(sh);
    const int ok = s > 0.0f && s <= 65504.0f;
    for (int i = 0; i < GI_KV_QB; i++) {
        float r = ok ? rintf(x[i] / s) : 0.0f;
        r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
        q[i * qstride] = (int8_t)r;
    }
    return sh;
}

/* ============================================================================ vector loaders */
/* vf_load_f16 / vd_load_f16: VF_N / VD_N halves -> float / double (exact).
 * vf_load_i8 / vd_load_i8: VF_N / VD_N int8 -> float / double.
 * _n: the first n lanes (others 0), reading only n elements. */

#if defined(GI_VARIANT_AVX512)
GI_INLINE vf vf_load_f16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
GI_INLINE vd vd_load_f16(const uint16_t *p) {
    return _mm512_cvtps_pd(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)));
}
GI_INLINE vf vf_load_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
GI_INLINE vd vd_load_i8(const int8_t *p) {
    return _mm512_cvtepi32_pd(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
#elif defined(GI_VARIANT_AVX2)
GI_INLINE vf vf_load_f16(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
GI_INLINE vd vd_load_f16(const uint16_t *p) {
    return _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)p)));
}
GI_INLINE vf vf_load_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
GI_INLINE vd vd_load_i8(const int8_t *p) {
    int32_t w;
    memcpy(&w, p, 4);
    return _mm256_cvtepi32_pd(_mm_cvtepi8_epi32(_mm_cvtsi32_si128(w)));
}
#else
GI_INLINE vf vf_load_f16(const uint16_t *p) { return gi_f16_to_f32(*p); }
GI_INLINE vd vd_load_f16(const uint16_t *p) { return (double)gi_f16_to_f32(*p); }
GI_INLINE vf vf_load_i8(const int8_t *p) { return (float)*p; }
GI_INLINE vd vd_load_i8(const int8_t *p) { return (double)*p; }
#endif

/* one f16 -> float (exact; F16C where the variant has it) */
#if defined(GI_VARIANT_AVX512) || defined(GI_VARIANT_AVX2)
GI_INLINE float gi_f16_load1(const uint16_t *p) { return _cvtsh_ss(*p); }
#else
GI_INLINE float gi_f16_load1(const uint16_t *p) { return gi_f16_to_f32(*p); }
#endif

GI_INLINE vf vf_load_f16_n(const uint16_t *p, int n) {
    uint16_t t[VF_N < 16 ? 16 : VF_N];
    memset(t, 0, sizeof t);
    memcpy(t, p, (size_t)n * 2);
    return vf_load_f16(t);
}
GI_INLINE vd vd_load_f16_n(const uint16_t *p, int n) {
    uint16_t t[VD_N < 8 ? 8 : VD_N];
    memset(t, 0, sizeof t);
    memcpy(t, p, (size_t)n * 2);
    return vd_load_f16(t);
}
GI_INLINE vf vf_load_i8_n(const int8_t *p, int n) {
    int8_t t[VF_N < 16 ? 16 : VF_N];
    memset(t, 0, sizeof t);
    memcpy(t, p, (size_t)n);
    return vf_load_i8(t);
}
GI_INLINE vd vd_load_i8_n(const int8_t *p, int n) {
    int8_t t[16];
    memset(t, 0, sizeof t);
    memcpy(t, p, (size_t)n);
    return vd_load_i8(t);
}

/* VD_N scales (f16) of consecutive keys -> double */
GI_INLINE vd vd_load_scales(const uint16_t *p, int n) {
    return n == VD_N ? vd_load_f16(p) : vd_load_f16_n(p, n);
}

#endif
