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
