"""How close goinfer runs to this machine's limits: decode bytes per token against memory
bandwidth, prefill matmul operations per second against the int8 dot-product peak.

    python benchmarks/limits.py [MODEL] [--threads 2] [--contexts 64,2048] [--prefill 512,2048]
        [--json out.json]
    python benchmarks/limits.py --smoke     # tiny model, small buffers (the test suite)

Memory bandwidth (read_bandwidth): a read-only sweep of a float32 buffer larger than the caches
(numpy max: one core, vector compares, the fastest of numpy's reductions here — sum, dot and
integer sums read slower), median of 5, in one process, and in as many processes at once as
--threads (each its own buffer of max(256 MiB, 4 x L3 / threads)): the summed rate.  A lower
bound of the machine's read bandwidth; peers.py --measure-bandwidth uses the same sweep.  Decode bytes per token: every weight a decode step reads
(all layers' matmul weights in goinfer's layout, the LM head, one embedding row) plus the
KV cache read by attention at that context (K and V of every layer in the cache's type).  Decode tok/s from
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
import multiprocessing as mp
import statistics
import time

import numpy as np

import regime
from kernels_matmul import cpu_ghz, peak_ops_per_cycle


def _l3_bytes() -> int:
    """The last-level cache's size from lscpu ("32 MiB (1 instance)"), 32 MiB if unknown."""
    from goinfer.bench import machine

    text = machine()["caches"].get("L3 cache", "")
    units = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    try:
        num, unit = text.split()[:2]
        return int(float(num) * units[unit])
    except (ValueError, KeyError):
        return 32 << 20


def _sweep(n_bytes: int, reps: int) -> float:
    a = np.ones(n_bytes // 4, np.float32)
    a.max()  # touch
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a.max()
        ts.append(time.perf_counter() - t0)
    return n_bytes / statistics.median(ts)


def _sweep_child(n_bytes, reps, q):
    q.put(_sweep(n_bytes, reps))


def read_bandwidth(threads: int, n_bytes: int | None = None, reps: int = 5) -> dict:
    """GB/s of `threads` processes sweeping their own buffers at once (summed); n_bytes per
    process (default max(256 MiB, 4 x L3 / threads))."""
    if n_bytes is None:
        n_bytes = max(256 << 20, 4 * _l3_bytes() // threads)
    if threads == 1:
        rates = [_sweep(n_bytes, reps)]
    else:
        q = mp.Queue()
        ps = [mp.Process(target=_sweep_child, args=(n_bytes, reps, q)) for _ in range(threads)]
        for p in ps:
            p.start()
        rates = [q.get() for _ in ps]
        for p in ps:
            p.join()
    return {"GBs": sum(rates) / 1e9, "processes": threads, "buffer_bytes_per_process": n_bytes,
            "per_process_GBs": [r / 1e9 for r in rates], "reps": reps}


def decode_bytes(model, context: int) -> dict:
    impl, cfg = model.impl, model.config
    weights = [w for w in impl.weights() if w is not impl.tok_embd]
    w_bytes = sum(w.nbytes for w in weights)
    if impl.lm_head is impl.tok_embd:
        w_bytes += impl.tok_embd.nbytes  # tied: the head reads the whole table
    else:
        w_bytes += impl.tok_embd.nbytes // cfg.vocab_size  # one embedding row
    kv = model.cache.stats().bytes_per_token * context  # K and V of every layer, stored type
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
    ap.add_argument("--smoke", action="store_true", help="tiny model, small buffers (the test suite)")
    regime.add_json_arg(ap)
    a = ap.parse_args(argv)
    import tempfile

    import goinfer
    from goinfer import bench, profile
    from goinfer._kernels import _config

    tmp = tempfile.TemporaryDirectory()
    n_bytes, reps = None, 5
    if a.smoke:
        from shapes import smoke_model

        a.model, a.contexts, a.prefill = str(smoke_model(tmp.name)), "64", "64"
        n_bytes, reps = 16 << 20, 1
    bw = {"one_core": read_bandwidth(1, n_bytes, reps)}
    bw["threads"] = read_bandwidth(a.threads, n_bytes, reps) if a.threads > 1 else bw["one_core"]
    print(f"memory read bandwidth: one core {bw['one_core']['GBs']:.1f} GB/s, "
          f"{a.threads} processes {bw['threads']['GBs']:.1f} GB/s")
    model = goinfer.Model.load(a.model, threads=a.threads, progress=False)
    res = {"benchmark": "limits", "regime": regime.header(a.threads, argv=argv),
           "model": regime.model(model.path), "bandwidth": bw, "decode": [], "prefill": []}
    bw_threads = bw["threads"]["GBs"]
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
        share = f"{100 * gops / peak:.0f}%" if peak else "(no peak stated)"
        print(f"prefill {n}: {p['tok_s']:.0f} tok/s, matmul {100 * p['matmul']['share']:.0f}% of "
              f"the time at {gops:.0f} int8 GOP/s = {share} of the "
              f"{peak:.0f} GOP/s peak of {_config.variant()} ({a.threads} x {ops} ops/cycle x {ghz:.2f} GHz)")
    tmp.cleanup()
    return regime.finish(res, a.json)


if __name__ == "__main__":
    main()
