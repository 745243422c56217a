"""How many threads the kernels use: physical cores, cgroup-aware, OMP_NUM_THREADS honoured."""
from __future__ import annotations

import os


def _physical_cores() -> int | None:
    """Distinct (package, core) pairs among the CPUs this process may run on (Linux sysfs)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        cpus = list(range(os.cpu_count() or 1))
    seen = set()
    for c in cpus:
        base = f"/sys/devices/system/cpu/cpu{c}/topology"
        try:
            with open(f"{base}/core_id") as f:
                core = f.read().strip()
            with open(f"{base}/physical_package_id") as f:
                pkg = f.read().strip()
        except OSError:
            return len(cpus) or None
        seen.add((pkg, core))
    return len(seen) or None


def _cgroup_cpu_limit() -> int | None:
    """CPU quota of the cgroup (v2 cpu.max, or v1 cfs quota), rounded up; None if unlimited."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            return max(1, -(-int(quota) // int(period)))
        return None
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            period = int(f.read())
        if quota > 0:
            return max(1, -(-quota // period))
    except (OSError, ValueError):
        pass
    return None


def default_threads() -> int:
    """OMP_NUM_THREADS if set, else physical cores capped by the cgroup's CPU quota."""
    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if env:
        try:
            n = int(env)
            if n > 0:
                return n
        except ValueError:
            pass
    n = _physical_cores() or os.cpu_count() or 1
    lim = _cgroup_cpu_limit()
    if lim is not None:
        n = min(n, lim)
    return max(1, n)


def resolve_threads(threads: int | None) -> int:
    """threads= argument -> thread count (None means the default above)."""
    if threads is None:
        return default_threads()
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    return threads
