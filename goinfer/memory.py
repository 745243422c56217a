"""How much memory the machine has left, and the check that a model fits before it is loaded.

    available_bytes()                 # MemAvailable, capped by the cgroup's limit
    check_fits(needed, "what")        # InsufficientMemoryError naming both numbers

What "needed" means for a model (docs/design/gguf.md, "Memory"): the bytes of its weights in
goinfer's native layout, which must stay resident for the model to run at any useful speed,
whether they are memory-mapped from the layout cache (shared, file-backed pages: not
"allocated", but evicted and re-read from disk on every token if they do not fit), copied from
it into anonymous huge pages (goinfer/layout.py, place_weights) or held in process memory (no
layout cache).  The KV cache is not counted: it is sized at its creation
(goinfer/kv_cache.py, bounded by half of what is available then) and its pages are touched only
as tokens fill them.
"""

from __future__ import annotations

import os
import threading

from goinfer.errors import InsufficientMemoryError

_UNLIMITED = 1 << 60  # cgroup limits at or above this mean "no limit"


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts and parts[0].isdigit():
                    out[key] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    except OSError:
        pass
    return out


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            s = f.read().strip()
    except OSError:
        return None
    if s == "max":
        return _UNLIMITED
    try:
        return int(s)
    except ValueError:
        return None


def _stat_value(path: str, keys: tuple[str, ...]) -> int:
    try:
        with open(path) as f:
            for line in f:
                k, _, v = line.partition(" ")
                if k in keys:
                    return int(v)
    except (OSError, ValueError):
        pass
    return 0


def _cgroup_available() -> int | None:
    """Bytes the cgroup may still use (limit - usage + its inactive file cache), or None."""
    for limit_f, usage_f, stat_f, keys in (
        (
            "/sys/fs/cgroup/memory.max",
            "/sys/fs/cgroup/memory.current",
            "/sys/fs/cgroup/memory.stat",
            ("inactive_file",),
        ),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
            "/sys/fs/cgroup/memory/memory.stat",
            ("total_inactive_file", "inactive_file"),
        ),
    ):
        limit, usage = _read_int(limit_f), _read_int(usage_f)
        if limit is None or usage is None:
            continue
        if limit >= _UNLIMITED:
            return None
        return max(0, limit - usage + _stat_value(stat_f, keys))
    return None


def available_bytes() -> int | None:
    """Memory a new allocation can get without swapping: the kernel's MemAvailable (free memory
    plus reclaimable page cache), capped by the cgroup's remaining allowance.  None if unknown
    (no /proc/meminfo: not Linux)."""
    avail = _meminfo().get("MemAvailable")
    cg = _cgroup_available()
    if avail is None:
        return cg
    return avail if cg is None else min(avail, cg)


def total_bytes() -> int | None:
    return _meminfo().get("MemTotal")


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"


def check_fits(needed: int, what: str) -> None:
    """Raise InsufficientMemoryError if needed bytes exceed what is available.

    Pages of a memory-mapped file already in the page cache (a layout another process is using)
    count as available: MemAvailable includes reclaimable page cache.  GOINFER_SKIP_MEMORY_CHECK=1
    turns the check off (e.g. to run a model from a memory-mapped file that does not fit,
    re-reading it from disk per token)."""
    if os.environ.get("GOINFER_SKIP_MEMORY_CHECK", "").strip().lower() in (
        "1",
        "true",
        "yes",
        "on",
    ):
        return
    avail = available_bytes()
    if avail is None or needed <= avail:
        return
    total = total_bytes()
    tot = f" of {_gb(total)} total" if total else ""
    raise InsufficientMemoryError(
        f"{what} needs {_gb(needed)} ({needed} bytes) of memory; {_gb(avail)} ({avail} bytes) "
        f"are available{tot}. Close other programs, use a smaller or more quantized model, or set "
        "GOINFER_SKIP_MEMORY_CHECK=1 to try anyway (a memory-mapped model that does not fit is "
        "re-read from disk at every token)",
        needed,
        avail,
    )


def default_max_tokens(context_length: int, bytes_per_token: int) -> int:
    """Tokens a KV cache holds by default: 2 x context_length (room for the context and for
    cached prefixes of other conversations), or as many as fit in half of the memory
    available now if that is fewer (a 128k-context model must not reserve 2 x 131072 tokens;
    at least one token).  Its pages are touched only as blocks fill (np.zeros is lazily mapped)."""
    want = 2 * int(context_length)
    avail = available_bytes()
    if avail is None or bytes_per_token <= 0:
        return want
    return max(1, min(want, (avail // 2) // int(bytes_per_token)))


# ============================================================================ first touch
# The first write to a fresh allocation faults its pages in.  NumPy asks for transparent huge
# pages on large arrays (madvise(MADV_HUGEPAGE)), so the first write into each 2 MB of the KV
# cache zeroes a whole 2 MB page: ~0.1-0.2 ms on bare metal, but up to ~6 ms on this project's
# 2-core KVM guests, where the host backs guest memory lazily too.  A cache's layers are separate
# regions, so the first block of a prompt touches 2 x n_layers of them: a 16-token first prefill
# of SmolLM2 (60 regions) spent 200-450 of its 250-550 ms in kv_write there.  populate() faults
# ranges in ahead of use, in a background thread, without changing their contents
# (MADV_POPULATE_WRITE, Linux >= 5.14; elsewhere it does nothing and the pages fault in on first
# write as before).

_MADV_POPULATE_WRITE = 23
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _madvise():
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        f = libc.madvise
        f.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        f.restype = ctypes.c_int
        return f
    except Exception:  # no C library to open by None (Windows), no madvise
        return None


def _advise(ranges, advice: int) -> bool:
    """madvise(advice) on the whole pages inside each of [(address, nbytes), ...]; False where
    the system has no madvise or refuses it."""
    madvise = _madvise()
    if madvise is None:
        return False
    for addr, n in ranges:
        start = -(-int(addr) // _PAGE) * _PAGE
        stop = (int(addr) + int(n)) // _PAGE * _PAGE
        if stop > start and madvise(start, stop - start, advice) != 0:
            return False
    return True


def populate(ranges) -> bool:
    """Fault in [(address, nbytes), ...] for writing, keeping their contents (the whole pages
    inside each range).  Blocks the caller (ctypes releases the GIL); False where the system
    cannot (not Linux, a kernel before 5.14)."""
    return _advise(ranges, _MADV_POPULATE_WRITE)


def trim() -> bool:
    """Give the C heap's free memory back to the system (glibc's malloc_trim(0), every arena).
    Building a tokenizer of a large vocabulary (Gemma's 262k tokens: half a million merges
    copied into Rust's tables) frees tens of MB it needed only meanwhile, in pieces that the
    allocator keeps unless asked.  False where there is no glibc."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        f = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return False
    f.argtypes = [ctypes.c_size_t]
    f.restype = ctypes.c_int
    f(0)
    return True


_MADV_HUGEPAGE = 14
_MADV_NOHUGEPAGE = 15
_MADV_POPULATE_READ = 22
HUGE_PAGE = 2 << 20  # a transparent huge page on x86-64 (one PMD entry)


def huge_pages_available() -> bool:
    """True when the system gives transparent huge pages to memory that asks for them
    (/sys/kernel/mm/transparent_hugepage/enabled is [always] or [madvise])."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            mode = f.read()
    except OSError:
        return False
    return "[always]" in mode or "[madvise]" in mode


def want_huge_pages(ranges) -> bool:
    """madvise(MADV_HUGEPAGE) on [(address, nbytes), ...], before they are touched: anonymous
    memory then faults in 2 MB at a time, and a file mapping reads the file in 2 MB folios where
    its file system caches files that way (ext4 from Linux 6.16, XFS).  False where the system
    cannot."""
    return _advise(ranges, _MADV_HUGEPAGE)


def populate_read(ranges) -> bool:
    """Fault in [(address, nbytes), ...] for reading (MADV_POPULATE_READ, Linux >= 5.14), without
    the GIL.  False where the system cannot."""
    return _advise(ranges, _MADV_POPULATE_READ)


def huge_share(address: int) -> float | None:
    """The share of the resident pages of the mapping that starts at address which the process
    maps with 2 MB entries (/proc/self/smaps: AnonHugePages, FilePmdMapped, ShmemPmdMapped over
    Rss); None where it cannot be read or nothing is resident."""
    start = f"{address:x}-"
    fields = {}
    try:
        with open("/proc/self/smaps") as f:
            inside = False
            for line in f:
                if not inside:
                    inside = line.startswith(start)
                    continue
                key, _, rest = line.partition(":")
                if " " in key or "-" in key:  # the next mapping's first line
                    break
                parts = rest.split()
                if parts and parts[0].isdigit():
                    fields[key] = int(parts[0])
    except OSError:
        return None
    rss = fields.get("Rss", 0)
    if not rss:
        return None
    huge = sum(fields.get(k, 0) for k in ("AnonHugePages", "FilePmdMapped", "ShmemPmdMapped"))
    return min(1.0, huge / rss)


def no_huge_pages(ranges) -> bool:
    """Back [(address, nbytes), ...] with small pages only (madvise(MADV_NOHUGEPAGE) on the
    whole pages inside each range), before anything touches them.  For regions that are
    written sparsely: NumPy asks for transparent huge pages on large arrays, and there the
    first byte written in each 2 MB faults in the whole 2 MB (a sliding-window layer's KV holds
    a few hundred KB: the window slots a session uses, lowest first).  False where the system
    cannot (not Linux); the pages are then whatever the system gives."""
    return _advise(ranges, _MADV_NOHUGEPAGE)


def populate_async(ranges, keep_alive=None) -> threading.Thread:
    """populate(ranges) in a daemon thread, started; keep_alive: objects owning the memory
    (the thread holds them until it is done)."""
    t = threading.Thread(
        target=lambda: (populate(ranges), keep_alive), daemon=True, name="goinfer-populate"
    )
    t.start()
    return t
