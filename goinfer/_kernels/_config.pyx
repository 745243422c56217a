# cython: language_level=3
"""Build and runtime facts of the compiled kernels: ISA variant and OpenMP."""
import operator

from goinfer._kernels.dispatch cimport (gi_variant_supported, gi_best_variant, gi_variant,
                                        gi_set_variant, gi_variant_name, GI_N_VARIANTS,
                                        gi_gemv_prefetch, gi_set_gemv_prefetch,
                                        gi_gemv_prefetch_setting, GI_PF_NEAR, GI_PF_FAR,
                                        gi_gemv_streams, gi_set_gemv_streams,
                                        gi_gemv_streams_setting, GI_GEMV_STREAMS_MAX,
                                        gi_gemv_warm_kb, gi_set_gemv_warm_kb,
                                        gi_gemv_warm_kb_setting, GI_GEMV_WARM_MAX_KB,
                                        gi_avxvnni_supported,
                                        gi_avxvnni_enabled, gi_avxvnni_set)

cdef extern from *:
    """
    #ifdef GI_HAVE_OPENMP
    #include <omp.h>
    static int gi_openmp_enabled(void) { return 1; }
    static int gi_omp_max_threads(void) { return omp_get_max_threads(); }
    static int gi_openmp_version(void) { return _OPENMP; }
    #else
    static int gi_openmp_enabled(void) { return 0; }
    static int gi_omp_max_threads(void) { return 1; }
    static int gi_openmp_version(void) { return 0; }
    #endif
    """
    int gi_openmp_enabled()
    int gi_omp_max_threads()
    int gi_openmp_version()

VARIANTS = tuple(gi_variant_name(v).decode() for v in range(GI_N_VARIANTS))


def openmp_enabled():
    return bool(gi_openmp_enabled())


def openmp_version():
    return int(gi_openmp_version())


def omp_max_threads():
    return int(gi_omp_max_threads())


def supported_variants():
    return tuple(VARIANTS[v] for v in range(GI_N_VARIANTS) if gi_variant_supported(v))


def best_variant():
    return VARIANTS[gi_best_variant()]


def variant():
    return VARIANTS[gi_variant()]


def set_variant(name):
    """Select a kernel variant by name ('portable', 'avx2', 'avx512-vnni')."""
    if name not in VARIANTS:
        raise ValueError(f"unknown kernel variant {name!r}; known: {', '.join(VARIANTS)}")
    if gi_set_variant(VARIANTS.index(name)) != 0:
        raise RuntimeError(f"kernel variant {name!r} is not supported by this CPU; "
                           f"supported: {', '.join(supported_variants())}")


# ---------------------------------------------------------------- GEMV software prefetch
_PF_MAX = {GI_PF_NEAR: 64, GI_PF_FAR: 1024}
# the integer weight kinds in the order of matmul.h's GI_Q4_0 .. (goinfer.quant.INT_KINDS)
_INT_KINDS = ("q4_0", "q4_1", "q8_0", "mxfp4", "q6_k", "q4_k", "q5_k", "q5_0", "q5_1")


def _kind_index(kind):
    if kind not in _INT_KINDS:
        raise ValueError(f"no GEMV prefetch for kind {kind!r}; integer kinds: "
                         f"{', '.join(_INT_KINDS)}")
    return _INT_KINDS.index(kind)


def _setting(int which, int k):
    cdef int old = gi_gemv_prefetch_setting(which, k)
    return None if old < 0 else old


def _check_distance(int which, groups, str name):
    if groups is None:
        return
    try:
        ok = 0 <= operator.index(groups) <= _PF_MAX[which]
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(
            f"{name} distance must be 0..{_PF_MAX[which]} groups or None, got {groups!r}"
        )


def _set_prefetch(int which, groups, str name, kind=None):
    """set one kind's distance (kind), every kind's (kind None), or each named kind's (groups a
    dict); returns the old setting in a form this takes back"""
    if isinstance(groups, dict):
        if kind is not None:
            raise ValueError(f"{name}: a dict of distances names its kinds; no kind= beside it")
        idx = {k: _kind_index(k) for k in groups}
        for g in groups.values():
            _check_distance(which, g, name)
        old = {k: _setting(which, i) for k, i in idx.items()}
        for k, g in groups.items():
            gi_set_gemv_prefetch(which, idx[k], -1 if g is None else operator.index(g))
        return old
    _check_distance(which, groups, name)
    g = -1 if groups is None else operator.index(groups)
    if kind is not None:
        i = _kind_index(kind)
        old = _setting(which, i)
        gi_set_gemv_prefetch(which, i, g)
        return old
    olds = {k: _setting(which, i) for i, k in enumerate(_INT_KINDS)}
    gi_set_gemv_prefetch(which, -1, g)
    return olds[_INT_KINDS[0]] if len(set(olds.values())) == 1 else olds


def gemv_prefetch(kind=None):
    """The decode GEMV's near software prefetch distance (prefetcht0, into L1) in groups of 32
    weights (0: none) for the variant in use and a weight kind ("q4_k"): the one
    set_gemv_prefetch set for it, else GOINFER_PREFETCH, else the default of the variant and
    kind on this CPU (src/dispatch_common.c).  kind None: {kind: distance} for every integer
    kind."""
    if kind is None:
        return {k: int(gi_gemv_prefetch(GI_PF_NEAR, i)) for i, k in enumerate(_INT_KINDS)}
    return int(gi_gemv_prefetch(GI_PF_NEAR, _kind_index(kind)))


def set_gemv_prefetch(groups, kind=None):
    """Set the GEMV's near prefetch distance (0..64 groups, 0 turns it off; None: back to the
    default): of every kind, of one kind (kind="q4_0"), or of each kind a dict names
    ({"q4_0": 8, "q6_k": None}).  Returns the old setting in a form this takes back: one kind's
    (None if it was the default); every kind's as one value when they were alike, else as a
    dict.  The results are the same bits at every distance: only when the weights load
    changes."""
    return _set_prefetch(GI_PF_NEAR, groups, "GEMV prefetch", kind)


def gemv_prefetch_far():
    """The decode GEMV's far software prefetch distance (prefetcht2: the outer caches, not L1)
    in groups of 32 weights (0: none) for the variant in use: the one set_gemv_prefetch_far
    set, else GOINFER_PREFETCH_FAR, else the default on this CPU (src/dispatch_common.c)."""
    return int(gi_gemv_prefetch(GI_PF_FAR, 0))  # alike for every kind


def set_gemv_prefetch_far(groups):
    """Set the GEMV's far prefetch distance (0..1024 groups, 0 turns it off; None: back to the
    default); returns the old setting (None if it was the default).  The same bits at every
    distance."""
    return _set_prefetch(GI_PF_FAR, groups, "GEMV far prefetch")


def _check_count(n, lo, hi, what):
    """n an integer in lo..hi, or None (back to the default); else a ValueError."""
    if n is None:
        return
    try:
        ok = lo <= operator.index(n) <= hi
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"{what} must be {lo}..{hi} or None, got {n!r}")


# ---------------------------------------------------------------- GEMV streams
def gemv_streams():
    """The row blocks (16 output rows each) the decode GEMV reads per call for the variant in
    use, each front to back as its own stream: the count set_gemv_streams set, else
    GOINFER_GEMV_STREAMS, else the default on this CPU (1 on AMD, 4 elsewhere:
    src/dispatch_common.c)."""
    return int(gi_gemv_streams())


def set_gemv_streams(n):
    """Set the GEMV's row blocks per call (1..4; None: back to the default); returns the old
    setting (None if it was the default).  The same bits at every count."""
    _check_count(n, 1, GI_GEMV_STREAMS_MAX, "GEMV streams")
    cdef int old = gi_gemv_streams_setting()
    gi_set_gemv_streams(-1 if n is None else operator.index(n))
    return None if old < 0 else old


# ---------------------------------------------------------------- GEMV warm
def gemv_warm():
    """The KB of each decode matmul's weight that graph replay's threads prefetch while they
    wait at a barrier before it (the heads of its shares' rows; 0: none): the KB
    set_gemv_warm set, else GOINFER_GEMV_WARM, else the default (512: src/dispatch_common.c).
    The same for every variant."""
    return int(gi_gemv_warm_kb())


def set_gemv_warm(kb):
    """Set the KB of a decode matmul's weight warmed while threads wait (0..16384, 0 turns it
    off; None: back to the default); returns the old setting (None if it was the default).
    The same bits at every setting."""
    _check_count(kb, 0, GI_GEMV_WARM_MAX_KB, "GEMV warm")
    cdef int old = gi_gemv_warm_kb_setting()
    gi_set_gemv_warm_kb(-1 if kb is None else operator.index(kb))
    return None if old < 0 else old


# ---------------------------------------------------------------- AMX int8 GEMM (matmul_amx.c)
cdef extern from "matmul_amx.h":
    int gi_amx_supported()
    int gi_amx_enabled()
    int gi_amx_set(int on)


def amx_supported():
    """True if this build has the AMX GEMM and the CPU/OS grant AMX tile data."""
    return bool(gi_amx_supported())


def amx_in_use():
    """True if int GEMMs of >= 16 rows run on AMX now (avx512 variant, AMX on)."""
    return bool(gi_amx_enabled()) and variant() == "avx512-vnni"


def set_amx(on):
    """Turn the AMX GEMM on or off (GOINFER_AMX=0 turns it off at start); returns the old
    setting.  Turning it on where AMX is unsupported raises RuntimeError."""
    cdef int was = gi_amx_enabled()
    return _switch(was, gi_amx_set(1 if on else 0),
                   "AMX is not supported here (CPU without AMX-INT8, OS without tile data, or a "
                   "build without AMX)")


cdef _switch(int was, int rc, str unsupported):
    """An optional kernel path's setter's result: the old setting, or RuntimeError(unsupported)
    when the set failed (turning it on where unsupported)."""
    if rc != 0:
        raise RuntimeError(unsupported)
    return bool(was)


# ---------------------------------------------------------------- AVX-VNNI (avx2 variant's matmuls)
def avxvnni_supported():
    """True if this build has the avx2 variant's AVX-VNNI matmuls and the CPU has AVX-VNNI."""
    return bool(gi_avxvnni_supported())


def avxvnni_in_use():
    """True if the int matmuls run with AVX-VNNI now (avx2 variant, AVX-VNNI on).  The same
    bits as without it: only the speed differs."""
    return bool(gi_avxvnni_enabled()) and variant() == "avx2"


def set_avxvnni(on):
    """Turn the avx2 variant's AVX-VNNI matmuls on or off (GOINFER_AVXVNNI=0 turns them off at
    start); returns the old setting.  Turning them on where unsupported raises RuntimeError."""
    cdef int was = gi_avxvnni_enabled()
    return _switch(was, gi_avxvnni_set(1 if on else 0),
                   "AVX-VNNI is not supported here (a CPU without AVX-VNNI, or a build whose "
                   "compiler could not emit it)")


def dispatch_key():
    """What selects the kernel tables now: (variant, AMX in use, AVX-VNNI in use).  A plan
    bound to kernel function pointers (goinfer/graph.py) is valid while this is unchanged."""
    return (variant(), amx_in_use(), avxvnni_in_use())
