# cython: language_level=3
"""Runtime ISA dispatch (src/dispatch.h): which variant's kernel tables the modules call."""

cdef extern from "dispatch.h" nogil:
    enum:
        GI_PORTABLE
        GI_AVX2
        GI_AVX512
        GI_N_VARIANTS
    int gi_variant_supported(int v)
    int gi_best_variant()
    int gi_variant()
    int gi_set_variant(int v)
    const char *gi_variant_name(int v)
    enum:
        GI_PF_NEAR
        GI_PF_FAR
    int gi_gemv_prefetch(int which, int kind)
    int gi_set_gemv_prefetch(int which, int kind, int groups)
    int gi_gemv_prefetch_setting(int which, int kind)
    enum:
        GI_GEMV_STREAMS_MAX
    int gi_gemv_streams()
    int gi_set_gemv_streams(int n)
    int gi_gemv_streams_setting()
    enum:
        GI_GEMV_WARM_MAX_KB
    int gi_gemv_warm_kb()
    int gi_set_gemv_warm_kb(int kb)
    int gi_gemv_warm_kb_setting()
    int gi_avxvnni_supported()
    int gi_avxvnni_enabled()
    int gi_avxvnni_set(int on)


cdef inline const void *variant_table(const void *portable, const void *avx2,
                                      const void *avx512) noexcept nogil:
    """Of one concern's three tables (gi_<concern>_ops_<variant>), the variant in use's.  The
    kernel library holds one dispatch state for every module (_config.set_variant)."""
    cdef int v = gi_variant()
    if v == GI_AVX512:
        return avx512
    if v == GI_AVX2:
        return avx2
    return portable


cdef inline str table_variant(const void *table, const void *portable, const void *avx2,
                              const void *avx512):
    """The variant name ('portable', 'avx2', 'avx512-vnni') of table among the three (the
    modules' _variant_used test hooks)."""
    cdef int v = GI_AVX512 if table == avx512 else GI_AVX2 if table == avx2 else GI_PORTABLE
    return gi_variant_name(v).decode()
