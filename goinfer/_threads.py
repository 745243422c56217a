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


# ============================================================================ OpenMP wait policy

# How long an idle OpenMP thread spins before it sleeps, in libgomp's spin iterations
# (GOMP_SPINCOUNT).  libgomp's default (300,000, about a millisecond) is good for a machine
# that runs nothing else; with any other busy process on a core (even at nice 19) a spinning
# thread keeps its core while its partner waits for a turn on the other one, and every
# barrier of a forward step can cost a scheduler time slice: decode was measured 60-100x
# slower with 2 threads than with 1 (docs/benchmarks.md, "OpenMP wait policy";
# benchmarks/wait_policy.py).  A short spin keeps the quiet-machine speed and sleeps fast
# enough under contention for the scheduler to move the waiting work.
SPIN_COUNT = 100

_wait_policy = "not applied"


def apply_wait_policy() -> str:
    """Set goinfer's OpenMP wait policy in the environment before libgomp loads.

    The user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins; GOINFER_WAIT_POLICY=libgomp keeps
    libgomp's default.  libgomp reads these once when it is loaded, so this must run before
    the kernels' shared library loads; if libgomp is already in the process (another library
    loaded it first) the setting cannot take effect and the returned description says so."""
    global _wait_policy
    env = os.environ
    if "OMP_WAIT_POLICY" in env or "GOMP_SPINCOUNT" in env:
        _wait_policy = "user: " + ", ".join(
            f"{k}={env[k]}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in env
        )
    elif env.get("GOINFER_WAIT_POLICY", "").lower() == "libgomp":
        _wait_policy = "libgomp default (GOINFER_WAIT_POLICY=libgomp)"
    elif _libgomp_loaded():
        _wait_policy = "libgomp default (libgomp was loaded before goinfer; set GOMP_SPINCOUNT)"
    else:
        env["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
        _wait_policy = f"goinfer: GOMP_SPINCOUNT={SPIN_COUNT}"
    return _wait_policy


def wait_policy() -> str:
    return _wait_policy


def _libgomp_loaded() -> bool:
    """True if the libgomp the kernels will use is already in the process.  A wheel repaired by
    auditwheel carries its own copy (goinfer.libs/libgomp-<hash>.so.1.0.0), which only goinfer
    loads; a source build uses the system's libgomp.so.1, which another library may have loaded."""
    libs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "goinfer.libs")
    try:
        own = [
            os.path.realpath(os.path.join(libs, n))
            for n in os.listdir(libs)
            if n.startswith("libgomp")
        ]
    except OSError:
        own = []
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libgomp" in line}
    except OSError:
        return False
    if own:
        return any(p in paths for p in own)
    return any(p.endswith("/libgomp.so.1") for p in paths)
