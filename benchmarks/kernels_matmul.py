"""Benchmark of the matmul kernels on SmolLM2-135M shapes.

    PYTHONPATH=. python benchmarks/kernels_matmul.py [--threads 1 2] [--variant avx512-vnni]
                                                     [--M 1 16 64 512] [--kinds q4_0 q8_0]

For every (shape, kind, M, threads) it prints the median time of one matmul call (the
activation already quantized), and
  GEMV (M = 1): GB/s of weight bytes streamed (qs + scales).  "hot" re-reads one weight
                (it stays in L2 for the small shapes); "cold" cycles through enough copies
                that every call reads its weight from DRAM / far L3, as a decode step does.
  GEMM (M > 1): int8 GOP/s = 2*M*N*K / time.  One core's VNNI peak is 64 MACs (128 ops)
                per cycle: ~128 * GHz GOP/s.
quantize_act is timed separately (it is shared by all the matmuls that read one activation).
Column thr: requested threads, "2>1" when the work is too small and the kernel uses fewer.
Times are medians of 7 samples; on a shared machine 2-thread rows suffer most from noise.
--smoke: one shape, M 1 and 16, one thread, minimal timing (the test suite).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import goinfer._kernels  # noqa: F401
from goinfer._kernels import _config
from goinfer.quant import quantize_weight

K = sys.modules["goinfer._kernels.matmul"]

# (name, n_in, n_out, kinds)
SHAPES = [
    ("attn q/o 576->576", 576, 576, ("q4_0", "q4_1", "q8_0")),
    ("attn k/v 576->192", 576, 192, ("q4_0", "q4_1", "q8_0")),
    ("ffn up   576->1536", 576, 1536, ("q4_0", "q4_1", "q8_0")),
    ("ffn down 1536->576", 1536, 576, ("q4_0", "q4_1", "q8_0")),
    ("lm head  576->49152", 576, 49152, ("q8_0",)),
]


def median_time(fn, min_time=0.15, reps=7):
    """Median over `reps` samples of the time per call; each sample loops >= min_time/reps."""
    fn()
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, int(min_time / reps / once))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    return float(np.median(samples))


def cpu_ghz():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("cpu MHz"):
                    return float(line.split(":")[1]) / 1000
    except OSError:
        pass
    return float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--M", type=int, nargs="+", default=[1, 16, 64, 512])
    ap.add_argument("--kinds", nargs="+", default=["q4_0", "q4_1", "q8_0"])
    ap.add_argument("--variant", default=None)
    ap.add_argument("--shapes", type=int, nargs="+", default=None, help="indices into SHAPES")
    ap.add_argument("--cold-mb", type=float, default=256.0, help="bytes of weight copies for cold GEMV")
    ap.add_argument("--min-time", type=float, default=0.15)
    ap.add_argument("--smoke", action="store_true", help="one shape, minimal timing (the test suite)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.threads, args.M, args.shapes, args.kinds = [1], [1, 16], [1], ["q4_0", "q8_0"]
        args.cold_mb, args.min_time = 1.0, 0.001
    if args.variant:
        _config.set_variant(args.variant)
    ghz = cpu_ghz()
    print(f"variant {_config.variant()}, OpenMP {_config.openmp_enabled()}, cpu ~{ghz:.2f} GHz (nominal): "
          f"VNNI peak per core ~{128 * ghz:.0f} GOP/s at 1 vpdpbusd/cycle, ~{256 * ghz:.0f} at 2/cycle "
          f"(Sapphire Rapids issues 2)")
    rng = np.random.default_rng(0)
    hdr = (f"{'shape':21s} {'kind':5s} {'M':>4s} {'thr':>5s} {'us':>10s}  "
           f"{'GB/s hot':>8s} {'us cold':>9s} {'GB/s cold':>9s} {'GOP/s':>7s}")
    print(hdr)
    print("-" * len(hdr))
    shapes = [SHAPES[i] for i in args.shapes] if args.shapes else SHAPES
    for name, n_in, n_out, kinds in shapes:
        W = rng.standard_normal((n_out, n_in)).astype(np.float32)
        for kind in kinds:
            if kind not in args.kinds:
                continue
            w = quantize_weight(W, kind)
            copies = None
            for M in args.M:
                x = rng.standard_normal((M, n_in)).astype(np.float32)
                xq = K.quantize_act(x)
                out = np.empty((M, n_out), np.float32)
                for nt in args.threads:
                    used = K._threads_used(w, M, nt)
                    thr = f"{nt}" if used == nt else f"{nt}>{used}"
                    t = median_time(lambda: K.matmul(xq, w, out, nthreads=nt), args.min_time)
                    gops = 2.0 * M * n_out * n_in / t / 1e9
                    if M == 1:
                        if copies is None:
                            n = max(2, int(args.cold_mb * 2**20 / w.nbytes))
                            copies = [quantize_weight(W, kind) if i == 0 else
                                      type(w)(w.kind, w.n_out, w.n_in, w.qs.copy(), w.d.copy(),
                                              None if w.m is None else w.m.copy())
                                      for i in range(n)]
                        it = iter(range(10**12))

                        def cold():
                            K.matmul(xq, copies[next(it) % len(copies)], out, nthreads=nt)

                        tc = median_time(cold, args.min_time)
                        print(f"{name:21s} {kind:5s} {M:4d} {thr:>5s} {t * 1e6:10.1f}  "
                              f"{w.nbytes / t / 1e9:8.1f} {tc * 1e6:9.1f} {w.nbytes / tc / 1e9:9.1f} {gops:7.1f}")
                    else:
                        print(f"{name:21s} {kind:5s} {M:4d} {thr:>5s} {t * 1e6:10.1f}  "
                              f"{'':8s} {'':9s} {'':9s} {gops:7.1f}")
            copies = None
    # activation quantization
    for M, n_in in [(1, 576), (512, 576), (512, 1536)]:
        x = rng.standard_normal((M, n_in)).astype(np.float32)
        qa = K.quantize_act(x)
        for nt in args.threads:
            t = median_time(lambda: K.quantize_act(x, qa, nthreads=nt), args.min_time)
            print(f"quantize_act {M}x{n_in}, {nt} thr: {t * 1e6:.1f} us ({x.nbytes / t / 1e9:.1f} GB/s of float32 in)")


if __name__ == "__main__":
    main()
