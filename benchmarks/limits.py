"""How close goinfer runs to this machine's limits: decode bytes per token against memory
bandwidth, prefill matmul operations per second against the int8 dot-product peak.

    python benchmarks/limits.py [MODEL] [--threads 2] [--contexts 64,2048] [--prefill 512,2048]
        [--json out.json]
    python benchmarks/limits.py --smoke     # tiny model, small buffers (the test suite)

Memory bandwidth: a read-only sweep of a 1 GiB float32 buffer (numpy max: AVX-512 compares,
the fastest of numpy's reductions here — sum, dot and integer sums read slower), median of 5,
by one thread and by --threads threads in this process (each its own slice, at once: the
decode's thread count).  A lower bound of the machine's read bandwidth.  Decode bytes per token: every weight a decode step reads
(all layers' matmul weights, the LM head, one embedding row) plus the KV cache read by
attention at that context (float32 K and V of every layer).  Decode tok/s from
goinfer.bench.time_decode; achieved bandwidth = bytes/token x tok/s.

Prefill: `goinfer.profile` times the matmul kernels of one cold prefill; int8 operations =
2 x (weight elements of every matmul) x tokens (the LM head runs for the last position only).
Peak: the running variant's int8 ops per cycle (kernels_matmul.peak_ops_per_cycle:
AVX-512 VNNI 2 VPDPBUSD x 64 MACs, AVX2 2 VPMADDUBSW x 32 MACs) x the nominal clock x
threads; the best GEMM rate of the kernel itself is in
benchmarks/kernels_matmul.py.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date

import numpy as np
from kernels_matmul import cpu_ghz, peak_ops_per_cycle  # benchmarks/ is on sys.path when run as a script

GIB = 2**30


def _sweep(a: np.ndarray, threads: int, reps: int) -> float:
    """Read bandwidth (bytes/s) of `threads` threads each taking max() over its slice of a
    (numpy releases the GIL in the reduction, so the slices are read at once): median of reps."""
    parts = np.array_split(a, threads)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(np.max, parts))  # touch
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            list(pool.map(np.max, parts))
            ts.append(time.perf_counter() - t0)
    return a.nbytes / statistics.median(ts)


def bandwidth(n_bytes: int = GIB, reps: int = 5, threads: int = 2) -> dict:
    """The machine's read bandwidth with one thread and with `threads` threads (the decode's
    own thread count), streaming a buffer larger than the caches."""
    a = np.ones(n_bytes // 4, np.float32)
    return {"one_core_GBs": _sweep(a, 1, reps) / 1e9, "threads": threads,
            "threads_GBs": _sweep(a, threads, reps) / 1e9}


def decode_bytes(model, context: int) -> dict:
    impl, cfg = model.impl, model.config
    weights = [w for w in impl.weights() if w is not impl.tok_embd]
    w_bytes = sum(w.nbytes for w in weights)
    if impl.lm_head is impl.tok_embd:
        w_bytes += impl.tok_embd.nbytes  # tied: the head reads the whole table
    else:
        w_bytes += impl.tok_embd.nbytes // cfg.vocab_size  # one embedding row
    kv = cfg.n_layers * context * cfg.n_kv_heads * cfg.head_dim * 2 * 4
    return {"weights": w_bytes, "kv": kv, "total": w_bytes + kv}


def prefill_ops(model, tokens: int) -> float:
    impl = model.impl
    per_token = sum(w.n_out * w.n_in for L in impl.layers for w in L.weights())
    return 2.0 * (per_token * tokens + impl.lm_head.n_out * impl.lm_head.n_in)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", default="64,2048")
    ap.add_argument("--prefill", default="512,2048")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny model, small buffers (the test suite)")
    a = ap.parse_args(argv)
    import tempfile

    import goinfer
    from goinfer import bench, profile
    from goinfer._kernels import _config

    tmp = tempfile.TemporaryDirectory()
    n_bytes, reps = GIB, 5
    if a.smoke:
        from shapes import smoke_model  # benchmarks/ is on sys.path when run as a script

        a.model, a.contexts, a.prefill = str(smoke_model(tmp.name)), "64", "64"
        n_bytes, reps = 16 << 20, 1
    bw = bandwidth(n_bytes, reps, a.threads)
    print(f"memory read bandwidth: one thread {bw['one_core_GBs']:.1f} GB/s, "
          f"{a.threads} threads {bw['threads_GBs']:.1f} GB/s")
    model = goinfer.Model.load(a.model, threads=a.threads, progress=False)
    res = {"model": str(model.path), "threads": a.threads, "variant": _config.variant(),
           "date": date.today().isoformat(),
           "load_avg_start": os.getloadavg(), "bandwidth": bw, "decode": [], "prefill": []}
    bw_threads = bw["threads_GBs"]
    for ctx in (int(c) for c in a.contexts.split(",")):
        b = decode_bytes(model, ctx)
        tok_s = 1.0 / statistics.median(bench.time_decode(model, ctx, 4 if a.smoke else 32,
                                                          1 if a.smoke else 3))
        gbs = b["total"] * tok_s / 1e9
        row = {"context": ctx, "bytes_per_token": b, "tok_s": tok_s, "GBs": gbs,
               "fraction_of_bandwidth": gbs / bw_threads}
        res["decode"].append(row)
        print(f"decode after {ctx}: {b['total'] / 1e6:.1f} MB/token (weights "
              f"{b['weights'] / 1e6:.1f}, KV {b['kv'] / 1e6:.1f}) x {tok_s:.1f} tok/s = "
              f"{gbs:.1f} GB/s = {100 * gbs / bw_threads:.0f}% of the measured bandwidth")
    ghz = cpu_ghz()
    ops = peak_ops_per_cycle(_config.variant())      # the running variant's int8 ops per cycle
    peak = ops * ghz * a.threads
    for n in (int(c) for c in a.prefill.split(",")):
        p = profile.run(model, n, decode_tokens=1)["prefill"]
        mm = p["matmul"]["seconds"]
        gops = prefill_ops(model, n) / mm / 1e9
        row = {"tokens": n, "tok_s": p["tok_s"], "matmul_seconds": mm,
               "matmul_share": p["matmul"]["share"], "int8_GOPs": gops, "peak_GOPs": peak}
        res["prefill"].append(row)
        print(f"prefill {n}: {p['tok_s']:.0f} tok/s, matmul {100 * p['matmul']['share']:.0f}% of "
              f"the time at {gops:.0f} int8 GOP/s = {100 * gops / peak:.0f}% of the "
              f"{peak:.0f} GOP/s peak of {_config.variant()} ({a.threads} x {ops} ops/cycle x {ghz:.2f} GHz)")
    res["load_avg_end"] = os.getloadavg()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    tmp.cleanup()


if __name__ == "__main__":
    main()
