/* goinfer C kernel helpers: shared macros.
 *
 * Every *_impl.c file is compiled once per ISA variant (portable, avx2, avx512) with
 * GI_SUFFIX set to _portable / _avx2 / _avx512 and GI_VARIANT_<NAME>=1 defined.  Functions
 * defined with GI(name) get the variant suffix; each concern exports a table of function
 * pointers per variant (see matmul.h, attention.h, ops.h) and the Cython layer picks the
 * table of the variant chosen at import (dispatch.h).
 *
 * Numerics: compiled with -ffp-contract=off, so a*b+c is never silently fused.  Where a
 * kernel wants a fused multiply-add it calls fmaf()/fma() explicitly, in every variant.
 */
#ifndef GI_H
#define GI_H
#include <stdint.h>
#include <stddef.h>

#define GI_CAT2(a, b) a##b
#define GI_CAT(a, b) GI_CAT2(a, b)
#define GI(name) GI_CAT(name, GI_SUFFIX)

#define GI_GROUP 32   /* quantization group: weights and activations */
#define GI_ROWS 16    /* output rows interleaved per row block in repacked weights */

#if defined(__GNUC__)
#define GI_INLINE static inline __attribute__((always_inline))
#define GI_RESTRICT __restrict__
#else
#define GI_INLINE static inline
#define GI_RESTRICT
#endif

#endif
