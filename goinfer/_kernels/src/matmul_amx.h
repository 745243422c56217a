/* AMX int8 GEMM for the int weight kinds but mxfp4 (q4_0, q4_1, q8_0, q6_k, q4_k, q5_k, q5_0,
 * q5_1): an accelerator of the avx512 variant's matmul_q for M >= 16 activation rows.  It
 * computes the same bits as the VNNI kernel (docs/design/kernels.md "AMX prefill GEMM").
 * Compiled once (matmul_amx.c, with -mamx-tile -mamx-int8 on top of the avx512 flags); its AMX
 * instructions run only when gi_amx_enabled() says so.
 */
#ifndef GI_MATMUL_AMX_H
#define GI_MATMUL_AMX_H
#include "matmul.h"

/* 1 if this build has the AMX kernel and the CPU, the OS (XCR0 bits 17/18) and the kernel's
   permission request (arch_prctl ARCH_REQ_XCOMP_PERM) allow tile data; probed once. */
int gi_amx_supported(void);
/* 1 if matmul_q of the avx512 variant uses AMX now: supported, and not turned off by
   GOINFER_AMX=0 in the environment (read once) or gi_amx_set(0). */
int gi_amx_enabled(void);
/* Turn AMX use on (1) or off (0).  Returns 0, or -1 when turning on an unsupported AMX. */
int gi_amx_set(int on);

/* Int weights x QAct with AMX: computes out rows [m0, m0 + 16*t) for the largest t with
   m0 + 16*t <= m1, row blocks [rb0, rb1), and returns the number of rows done (a multiple
   of 16; 0 when nothing was done, e.g. on an allocation failure).  Same tile convention as
   gi_matmul_ops.matmul_q.  Call only when gi_amx_enabled(). */
int64_t gi_matmul_q_amx(const gi_weight *w, const gi_qact *a, int64_t m0, int64_t m1,
                        int64_t rb0, int64_t rb1, float *out, int64_t ldo);

#endif
