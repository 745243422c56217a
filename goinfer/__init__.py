"""goinfer: fast CPU inference of open-weight LLMs for agentic workloads.

import goinfer
model = goinfer.Model.load("smollm2-135m")
s = model.session()
r = s.chat([{"role": "user", "content": "Hi!"}], max_tokens=64)
print(r.text, r.timings)
"""

from __future__ import annotations

import sys

from goinfer._version import __version__
from goinfer.chat.session import ChatSession
from goinfer.errors import (
    CacheFileError,
    CacheFullError,
    ChatTemplateError,
    ContextLengthError,
    DownloadError,
    GoinferError,
    GrammarError,
    InsufficientMemoryError,
    ModelFormatError,
    ModelNotFoundError,
    RequestError,
    TokenizerError,
    ToolError,
    UnsupportedArchitectureError,
    UnsupportedTensorTypeError,
)
from goinfer.generation import GenerationResult, Timings
from goinfer.kv_cache import KVCache
from goinfer.model import LoadOptions, Model
from goinfer.sampling import SamplingParams
from goinfer.session import Session


def config() -> dict:
    """Version, kernel variant, OpenMP and thread facts, as a dict."""
    from goinfer._kernels import _config
    from goinfer._threads import default_threads, wait_policy

    return {
        "version": __version__,
        "kernel_variant": _config.variant(),
        "supported_variants": list(_config.supported_variants()),
        "amx": _config.amx_in_use(),
        "avxvnni": _config.avxvnni_in_use(),
        "gemv_prefetch": _config.gemv_prefetch(),
        "gemv_prefetch_far": _config.gemv_prefetch_far(),
        "gemv_streams": _config.gemv_streams(),
        "gemv_warm_kb": _config.gemv_warm(),
        "openmp": _config.openmp_enabled(),
        "openmp_version": _config.openmp_version(),
        "threads": default_threads(),
        "wait_policy": wait_policy(),
        "python": sys.version.split()[0],
    }


def _amx_supported() -> bool:
    from goinfer._kernels import _config

    return _config.amx_supported()


def _avxvnni_supported() -> bool:
    from goinfer._kernels import _config

    return _config.avxvnni_supported()


def _prefetch_text(by_kind: dict) -> str:
    """'16 groups for q4_0, q6_k, none for q4_k': the kinds of one distance together, the most
    common distance first (one distance for every kind: no kinds named)."""
    groups: dict[int, list[str]] = {}
    for kind, d in by_kind.items():
        groups.setdefault(d, []).append(kind)
    order = sorted(groups, key=lambda d: -len(groups[d]))
    parts = [f"{d} groups" if d else "none" for d in order]
    if len(order) == 1:
        return parts[0]
    return ", ".join(f"{p} for {', '.join(groups[d])}" for p, d in zip(parts, order))


def show_config(file=None) -> dict:
    """Print (and return) the version, the kernel variant in use, OpenMP on/off, threads."""
    c = config()
    out = file or sys.stdout
    print(f"goinfer {c['version']}", file=out)
    print(
        f"  kernel variant : {c['kernel_variant']} (supported: {', '.join(c['supported_variants'])})",
        file=out,
    )
    amx = "on" if c["amx"] else ("off" if _amx_supported() else "off (not supported here)")
    print(f"  AMX int8 GEMM  : {amx} (prefill matmuls; GOINFER_AMX=0 turns it off)", file=out)
    if c["kernel_variant"] == "avx2":
        vnni = (
            "on"
            if c["avxvnni"]
            else ("off" if _avxvnni_supported() else "off (not supported here)")
        )
        print(f"  AVX-VNNI       : {vnni} (int matmuls; GOINFER_AVXVNNI=0 turns it off)", file=out)
    far = c["gemv_prefetch_far"]
    pf_text = (
        f"near (prefetcht0) {_prefetch_text(c['gemv_prefetch'])}; "
        f"far (prefetcht2) {f'{far} groups' if far else 'none'}"
    )
    print(
        f"  GEMV prefetch  : {pf_text} (decode matmuls; GOINFER_PREFETCH=<groups> and "
        "GOINFER_PREFETCH_FAR=<groups> set them)",
        file=out,
    )
    print(
        f"  GEMV streams   : {c['gemv_streams']} row block{'s' if c['gemv_streams'] > 1 else ''}"
        " per call (decode matmuls; GOINFER_GEMV_STREAMS=<1..4> sets it)",
        file=out,
    )
    warm = f"{c['gemv_warm_kb']} KB per matmul" if c["gemv_warm_kb"] else "off"
    print(
        f"  GEMV warm      : {warm} (prefetched by threads waiting in a decode step;"
        " GOINFER_GEMV_WARM=<KB> sets it)",
        file=out,
    )
    omp = f"on (OpenMP {c['openmp_version']})" if c["openmp"] else "OFF: kernels run on one thread"
    print(f"  OpenMP         : {omp}", file=out)
    print(
        f"  threads        : {c['threads']} (physical cores, cgroup-aware; OMP_NUM_THREADS or "
        "threads= override)",
        file=out,
    )
    print(f"  wait policy    : {c['wait_policy']}", file=out)
    return c


__all__ = [
    "Model",
    "LoadOptions",
    "Session",
    "ChatSession",
    "KVCache",
    "SamplingParams",
    "GenerationResult",
    "Timings",
    "show_config",
    "config",
    "GoinferError",
    "ModelFormatError",
    "UnsupportedArchitectureError",
    "UnsupportedTensorTypeError",
    "ModelNotFoundError",
    "DownloadError",
    "ContextLengthError",
    "CacheFullError",
    "CacheFileError",
    "TokenizerError",
    "ChatTemplateError",
    "RequestError",
    "GrammarError",
    "ToolError",
    "InsufficientMemoryError",
]
