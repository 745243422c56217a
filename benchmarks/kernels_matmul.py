"""Benchmark of the matmul kernels on SmolLM2-135M shapes (or the 1B / 8B shapes of --set; and
one gpt-oss-20b expert shape).

    PYTHONPATH=. python benchmarks/kernels_matmul.py [--threads 1 2] [--variant avx512-vnni]
                                                     [--M 1 16 64 512] [--kinds q4_0 q8_0]
    PYTHONPATH=. python benchmarks/kernels_matmul.py --set llama-1b --M 512 2048 --kinds q4_0
    PYTHONPATH=. python benchmarks/kernels_matmul.py --set q6k-1b --M 1 512 --kinds q6_k q8_0 --clock cpu
    PYTHONPATH=. python benchmarks/kernels_matmul.py --set q4km-1b --M 1 512 --kinds q4_k q4_1 q6_k q8_0
    PYTHONPATH=. python benchmarks/kernels_matmul.py --set q5-270m --M 1 64 --kinds q5_0 q8_0
    PYTHONPATH=. python benchmarks/kernels_matmul.py --set gemv-l2 --M 1 --threads 1 --min-time 1
    PYTHONPATH=. python benchmarks/kernels_matmul.py --peaks 8 --threads 1 2 --M   # peaks only

For every (shape, kind, M, threads) it prints the median time of one matmul call (the
activation already quantized), and
  GEMV (M = 1): GB/s of weight bytes streamed (qs + scales).  "hot" re-reads one weight
                (it stays in L2 for the small shapes); "cold" cycles through enough copies
                that every call reads its weight from DRAM / far L3, as a decode step does.
  GEMM (M > 1): int8 GOP/s = 2*M*N*K / time, and "peak": that rate over the variant's int8
                peak measured on the threads used (int8_peak: its dot-product instruction
                alone, every thread at once).
quantize_act is timed separately (it is shared by all the matmuls that read one activation).
Column thr: requested threads, "2>1" when the work is too small and the kernel uses fewer.
Times are medians of 7 samples; on a shared machine 2-thread rows suffer most from noise.
--peaks R: first the variant's float32 FMA peak and the f16 attention mix's rate (f16_fma_peak)
on each --threads, R alternating rounds: medians and the median ratio of the mix to the FMA
peak (what an f16 decode attention can reach at most); an empty --M times no matmul.
--prefetch-sweep D1,D2,.. --sweep-rounds R: instead of the table, the decode GEMV's near
software prefetch distances (groups; "default": the variant's and kind's default) on the cold
GEMVs (M = 1) of the --set shapes and --kinds, as a decode step runs them: the copies of
--cold-mb bound into one graph and replayed on the last --threads, GB/s of weight read.  R
rounds, the settings in a shuffled order each round, the machine's read bandwidth (limits.py,
the same threads) sampled before and after each round; medians over the rounds, and apart
over the rounds whose samples all lie in the upper or the lower half of the bandwidths seen
(a host whose bandwidth switches between phases).
--smoke: one shape, M 1 and 16, one thread, minimal timing, 2 rounds of --peaks, and a
2-round sweep of q4_0 at 0 and 16 groups (the test suite).
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import time

import numpy as np
import regime

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
    ("gpt-oss expert 2880", 2880, 2880, ("q4_0", "q8_0", "mxfp4")),  # gpt-oss-20b gate/up/down
]
# The prefill matmuls of Llama 3.2 1B and Llama 3.1 8B (fused q/k/v and gate/up, as goinfer runs them)
SETS = {
    "smollm2": SHAPES,
    "llama-1b": [
        ("qkv    2048->3072", 2048, 3072, ("q4_0", "q4_1", "q8_0")),
        ("o      2048->2048", 2048, 2048, ("q4_0", "q4_1", "q8_0")),
        ("gate/up 2048->16384", 2048, 16384, ("q4_0", "q4_1", "q8_0")),
        ("down   8192->2048", 8192, 2048, ("q4_0", "q4_1", "q8_0", "q6_k")),
    ],
    # the tensors a Q4_K_M file of Llama-3.2-1B stores as Q6_K: q6_k as it is, or q8_0
    "q6k-1b": [
        ("v      2048->512", 2048, 512, ("q6_k", "q8_0")),
        ("down   8192->2048", 8192, 2048, ("q6_k", "q8_0")),
        ("output 2048->128256", 2048, 128256, ("q6_k", "q8_0")),
    ],
    # a Q4_K_M file of Llama-3.2-1B: its k-quants as they are (q4_k, q6_k) against the kinds
    # they used to be converted to (q4_1, and q8_0 on avx512-vnni)
    "q4km-1b": [
        ("qkv    2048->3072", 2048, 3072, ("q4_k", "q4_1")),
        ("gate/up 2048->16384", 2048, 16384, ("q4_k", "q4_1")),
        ("down   8192->2048", 8192, 2048, ("q4_k", "q4_1", "q6_k", "q8_0")),
        ("v      2048->512", 2048, 512, ("q6_k", "q8_0")),
        ("output 2048->128256", 2048, 128256, ("q6_k", "q8_0")),
    ],
    # the tensors a Q4_K_M file of Gemma 3 270M stores as Q5_0: q5_0 as it is, or q8_0
    "q5-270m": [
        ("q      640->1024", 640, 1024, ("q5_0", "q8_0")),
        ("k/v    640->256", 640, 256, ("q5_0", "q8_0")),
        ("gate/up 640->2048", 640, 2048, ("q5_0", "q8_0")),
        ("down   2048->640", 2048, 640, ("q5_0", "q8_0")),
    ],
    # GEMV compute rate: weights of ~0.6 MB that stay in a 1 MB L2, so "hot" is what a core
    # computes per second, not what memory delivers (1B shapes cut to a few row blocks)
    "gemv-l2": [
        ("k/v    2048->512", 2048, 512, ("q4_0", "q4_1", "q4_k", "q6_k", "q8_0")),
        ("down   8192->128", 8192, 128, ("q4_0", "q4_1", "q4_k", "q6_k", "q8_0")),
    ],
    # one weight in every integer kind: the Qwen2.5-3B shape's gate (or up) projection
    # (--prefetch-sweep)
    "gemv-kinds": [
        (
            "ffn 2048->11008",
            2048,
            11008,
            ("q4_0", "q4_1", "q8_0", "mxfp4", "q6_k", "q4_k", "q5_k", "q5_0", "q5_1"),
        ),
    ],
    "llama-8b": [
        ("qkv    4096->6144", 4096, 6144, ("q4_0", "q4_1", "q8_0")),
        ("o      4096->4096", 4096, 4096, ("q4_0", "q4_1", "q8_0")),
        ("gate/up 4096->28672", 4096, 28672, ("q4_0", "q4_1", "q8_0")),
        ("down   14336->4096", 14336, 4096, ("q4_0", "q4_1", "q8_0")),
    ],
}


def int8_peak(threads: int) -> float:
    """The running variant's int8 peak in GOP/s (2 operations per multiply-add), measured on
    `threads` threads at once: its dot-product instruction alone, 12 independent accumulators
    per thread (AVX-512: vpdpbusd zmm, AVX2: vpmaddubsw ymm, whose widening vpaddw / vpmaddwd
    come on top in a real kernel; matmul._int8_peak).  No clock or issue rate is assumed, so
    it holds for a turbo clock, a VM's, and cores that split 512-bit work in two halves.
    0.0 for the portable variant (no peak stated)."""
    import importlib

    return importlib.import_module("goinfer._kernels.matmul")._int8_peak(threads) / 1e9


def fma_peak(threads: int) -> float:
    """The running variant's float32 FMA peak in GFLOP/s (2 operations per lane), measured on
    `threads` threads at once: fused multiply-adds on its float vector alone (AVX-512: zmm,
    AVX2: ymm), 12 independent accumulators per thread (matmul._fma_peak); what bounds the
    float kernels (attention).  No clock assumed.  0.0 for the portable variant."""
    import importlib

    return importlib.import_module("goinfer._kernels.matmul")._fma_peak(threads) / 1e9


def f16_fma_peak(threads: int) -> float:
    """The FMA rate of the fast attention's mix over an f16 cache in GFLOP/s, measured on
    `threads` threads at once: fma_peak's loop with a vector converted from float16 (from L1)
    for every 4 fused multiply-adds, as QK and AV convert a key or value vector once for the 4
    query heads of a GQA group (matmul._f16_fma_peak); only the multiply-adds are counted.  The
    most an f16 decode attention can reach where the conversion shares the FMA ports.  0.0 for
    the portable variant."""
    import importlib

    return importlib.import_module("goinfer._kernels.matmul")._f16_fma_peak(threads) / 1e9


def float_peaks(threads, rounds: int, min_time: float) -> list[dict]:
    """--peaks: per thread count, `rounds` alternating measurements of fma_peak and
    f16_fma_peak (GFLOP/s, medians) and the median of their paired ratios (None on portable,
    whose probes state no peak); printed as measured."""
    import importlib

    m = importlib.import_module("goinfer._kernels.matmul")
    rows = []
    for t in threads if rounds > 0 else []:
        fma, mix = [], []
        for _ in range(rounds):
            fma.append(m._fma_peak(t, min_time=min_time) / 1e9)
            mix.append(m._f16_fma_peak(t, min_time=min_time) / 1e9)
        ratio = float(np.median(np.array(mix) / np.array(fma))) if fma[0] > 0 else None
        rows.append(
            {
                "threads": t,
                "rounds": rounds,
                "fma_GFLOPs": float(np.median(fma)),
                "f16_mix_GFLOPs": float(np.median(mix)),
                "mix_over_fma": ratio,
            }
        )
        th = f"{t} thread{'s' if t > 1 else ''}"
        if ratio is None:
            print(f"{th}: no float peak probes (portable)", flush=True)
            continue
        print(
            f"{th}: float32 FMA peak {np.median(fma):.1f} GFLOP/s, f16 attention mix "
            f"{np.median(mix):.1f} GFLOP/s, ratio {ratio:.3f} ({rounds} alternating rounds, medians)",
            flush=True,
        )
    return rows


def median_time(fn, min_time=0.15, reps=7, clock=time.perf_counter):
    """Median over `reps` samples of the time per call; each sample loops >= min_time/reps."""
    fn()
    t0 = clock()
    fn()
    once = max(clock() - t0, 1e-7)
    inner = max(1, int(min_time / reps / once))
    samples = []
    for _ in range(reps):
        t0 = clock()
        for _ in range(inner):
            fn()
        samples.append((clock() - t0) / inner)
    return float(np.median(samples))


def prefetch_sweep(shapes, kinds, distances, rounds, threads, cold_mb, bw_bytes=None) -> dict:
    """GB/s of graph-replayed cold GEMVs at each near prefetch distance (see the module doc)."""
    import limits

    graph_mod = sys.modules["goinfer._kernels.graph"]
    rng = np.random.default_rng(0)
    cases = []  # (label, kind, graph, bytes per replay)
    for name, n_in, n_out, shape_kinds in shapes:
        W = rng.standard_normal((n_out, n_in)).astype(np.float32)
        xq = K.quantize_act(rng.standard_normal((1, n_in)).astype(np.float32))
        for kind in (k for k in shape_kinds if k in kinds):
            w0 = quantize_weight(W, kind)
            ws = [w0] + [copy.deepcopy(w0) for _ in range(int(cold_mb * 2**20 / w0.nbytes))]
            ops = [
                K.bind_matmul(xq, w, np.empty((1, n_out), np.float32), nthreads=threads) for w in ws
            ]
            g = graph_mod.Graph(ops, threads)
            g.run()
            cases.append((f"{name.strip()} {kind}", kind, g, sum(w.nbytes for w in ws)))
    settings = [None if d == "default" else int(d) for d in distances]
    old = _config.set_gemv_prefetch(None)
    out_rounds = []
    try:
        for r in range(rounds):
            bw = [limits.read_bandwidth(threads, n_bytes=bw_bytes, reps=3)["GBs"]]
            row = {}
            order = [(c, s) for c in cases for s in settings]
            random.Random(r).shuffle(order)
            for (label, kind, g, nbytes), dist in order:
                _config.set_gemv_prefetch(dist)
                groups = _config.gemv_prefetch(kind)
                t0 = time.perf_counter()
                for _ in range(3):
                    g.run()
                gbs = 3 * nbytes / (time.perf_counter() - t0) / 1e9
                row[f"{label} @ {'default' if dist is None else dist}"] = {
                    "groups": groups,
                    "GBs": gbs,
                }
            bw.append(limits.read_bandwidth(threads, n_bytes=bw_bytes, reps=3)["GBs"])
            out_rounds.append({"bandwidth_GBs": bw, "gemv": row})
            print(
                f"round {r + 1}: bandwidth {bw[0]:.1f}, {bw[1]:.1f} GB/s; "
                + ", ".join(f"{k} {v['GBs']:.1f}" for k, v in sorted(row.items())),
                flush=True,
            )
    finally:
        _config.set_gemv_prefetch(old)
    samples = [b for r in out_rounds for b in r["bandwidth_GBs"]]
    mid = (min(samples) + max(samples)) / 2
    phases = {
        "all": out_rounds,
        "upper": [r for r in out_rounds if min(r["bandwidth_GBs"]) >= mid],
        "lower": [r for r in out_rounds if max(r["bandwidth_GBs"]) < mid],
    }
    medians = {
        ph: {
            "rounds": len(rs),
            "bandwidth_GBs": statistics.median(b for r in rs for b in r["bandwidth_GBs"])
            if rs
            else None,
            "GBs": {
                k: statistics.median(r["gemv"][k]["GBs"] for r in rs) if rs else None
                for k in out_rounds[0]["gemv"]
            },
        }
        for ph, rs in phases.items()
    }
    for ph, m in medians.items():
        if m["rounds"]:
            print(
                f"medians, {ph} ({m['rounds']} rounds, bandwidth {m['bandwidth_GBs']:.1f} GB/s): "
                + ", ".join(f"{k} {v:.1f}" for k, v in sorted(m["GBs"].items()))
            )
    return {
        "threads": threads,
        "distances": list(distances),
        "cold_mb": cold_mb,
        "bandwidth_mid_GBs": mid,
        "rounds": out_rounds,
        "medians": medians,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--M", type=int, nargs="*", default=[1, 16, 64, 512])
    ap.add_argument(
        "--kinds",
        nargs="+",
        default=["q4_0", "q4_1", "q8_0", "mxfp4", "q6_k", "q4_k", "q5_k", "q5_0", "q5_1"],
    )
    ap.add_argument("--variant", default=None)
    ap.add_argument("--set", default="smollm2", choices=sorted(SETS), help="which model's shapes")
    ap.add_argument(
        "--clock",
        default="wall",
        choices=["wall", "cpu"],
        help="cpu: CPU seconds of the process divided by the threads used (a shared, "
        "loaded machine: the rate per core while running, not what a user sees)",
    )
    ap.add_argument("--shapes", type=int, nargs="+", default=None, help="indices into SHAPES")
    ap.add_argument(
        "--cold-mb", type=float, default=256.0, help="bytes of weight copies for cold GEMV"
    )
    ap.add_argument("--min-time", type=float, default=0.15)
    ap.add_argument(
        "--peaks", type=int, default=0, metavar="ROUNDS", help="FMA and f16 mix peaks first"
    )
    ap.add_argument(
        "--prefetch-sweep",
        default=None,
        metavar="D1,D2",
        help="near prefetch distances (groups, or 'default') on replayed cold GEMVs",
    )
    ap.add_argument("--sweep-rounds", type=int, default=10)
    ap.add_argument(
        "--smoke", action="store_true", help="one shape, minimal timing (the test suite)"
    )
    regime.add_json_arg(ap)
    args = ap.parse_args(argv)
    if args.smoke:
        args.threads, args.M, args.kinds = [1], [1, 16], ["q4_0", "q8_0", "q6_k", "q4_k"]
        args.cold_mb, args.min_time, args.peaks = 1.0, 0.001, 2
    if args.variant:
        _config.set_variant(args.variant)
    if args.prefetch_sweep and not args.smoke:
        res = {
            "benchmark": "kernels_matmul",
            "regime": regime.header(None, argv=argv),
            "set": args.set,
            "rows": [],
            "prefetch_sweep": prefetch_sweep(
                SETS[args.set],
                args.kinds,
                args.prefetch_sweep.split(","),
                args.sweep_rounds,
                args.threads[-1],
                args.cold_mb,
            ),
        }
        return regime.finish(res, args.json)
    peaks = {t: int8_peak(t) for t in range(1, max(args.threads) + 1)}  # GOP/s, measured
    res = {
        "benchmark": "kernels_matmul",
        "regime": regime.header(None, argv=argv),
        "set": args.set,
        "clock": args.clock,
        "peak_GOPs": {str(t): p for t, p in peaks.items()},
        "float_peaks": [],
        "rows": [],
        "quantize_act": [],
    }
    print(
        f"variant {_config.variant()}, OpenMP {_config.openmp_enabled()}, measured int8 peak: "
        + ", ".join(f"{p:.0f} GOP/s on {t} thread{'s' if t > 1 else ''}" for t, p in peaks.items())
    )
    res["float_peaks"] = float_peaks(args.threads, args.peaks, 0.005 if args.smoke else 0.3)
    rng = np.random.default_rng(0)
    hdr = (
        f"{'shape':21s} {'kind':5s} {'M':>4s} {'thr':>5s} {'us':>10s}  "
        f"{'GB/s hot':>8s} {'us cold':>9s} {'GB/s cold':>9s} {'GOP/s':>7s} {'peak':>5s}"
    )
    print(hdr)
    print("-" * len(hdr))
    SHAPES_ = SETS[args.set]
    shapes = [SHAPES_[i] for i in args.shapes] if args.shapes else SHAPES_
    if args.smoke:
        shapes = [SHAPES_[1], ("k-quants 256->64", 256, 64, ("q6_k", "q4_k"))]
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
                    clock = time.perf_counter
                    if args.clock == "cpu":
                        clock = lambda used=used: time.process_time() / used  # noqa: E731
                    t = median_time(
                        lambda: K.matmul(xq, w, out, nthreads=nt), args.min_time, clock=clock
                    )
                    gops = 2.0 * M * n_out * n_in / t / 1e9
                    if M == 1:
                        if copies is None:
                            n = max(2, int(args.cold_mb * 2**20 / w.nbytes))
                            copies = [
                                quantize_weight(W, kind)
                                if i == 0
                                else type(w)(
                                    w.kind,
                                    w.n_out,
                                    w.n_in,
                                    w.qs.copy(),
                                    w.d.copy(),
                                    None if w.m is None else w.m.copy(),
                                )
                                for i in range(n)
                            ]
                        it = iter(range(10**12))

                        def cold():
                            K.matmul(xq, copies[next(it) % len(copies)], out, nthreads=nt)

                        tc = median_time(cold, args.min_time)
                        res["rows"].append(
                            {
                                "shape": name.strip(),
                                "kind": kind,
                                "M": M,
                                "threads": nt,
                                "threads_used": used,
                                "us": t * 1e6,
                                "hot_GBs": w.nbytes / t / 1e9,
                                "cold_us": tc * 1e6,
                                "cold_GBs": w.nbytes / tc / 1e9,
                                "GOPs": gops,
                            }
                        )
                        print(
                            f"{name:21s} {kind:5s} {M:4d} {thr:>5s} {t * 1e6:10.1f}  "
                            f"{w.nbytes / t / 1e9:8.1f} {tc * 1e6:9.1f} {w.nbytes / tc / 1e9:9.1f} {gops:7.1f}"
                        )
                    else:
                        peak = peaks.get(used, 0.0)
                        frac = f"{100 * gops / peak:4.0f}%" if peak > 0 else ""
                        res["rows"].append(
                            {
                                "shape": name.strip(),
                                "kind": kind,
                                "M": M,
                                "threads": nt,
                                "threads_used": used,
                                "us": t * 1e6,
                                "GOPs": gops,
                                "peak_GOPs": peak,  # the share of it: GOPs / peak_GOPs
                            }
                        )
                        print(
                            f"{name:21s} {kind:5s} {M:4d} {thr:>5s} {t * 1e6:10.1f}  "
                            f"{'':8s} {'':9s} {'':9s} {gops:7.1f} {frac:>5s}"
                        )
            copies = None
    # activation quantization
    for M, n_in in [(1, 576), (512, 576), (512, 1536)]:
        x = rng.standard_normal((M, n_in)).astype(np.float32)
        qa = K.quantize_act(x)
        for nt in args.threads:
            t = median_time(lambda: K.quantize_act(x, qa, nthreads=nt), args.min_time)
            res["quantize_act"].append(
                {"M": M, "n_in": n_in, "threads": nt, "us": t * 1e6, "GBs": x.nbytes / t / 1e9}
            )
            print(
                f"quantize_act {M}x{n_in}, {nt} thr: {t * 1e6:.1f} us ({x.nbytes / t / 1e9:.1f} GB/s of float32 in)"
            )
    if args.smoke:
        res["prefetch_sweep"] = prefetch_sweep(
            [SHAPES[1]], ["q4_0"], ["0", "16"], 2, 1, 1.0, bw_bytes=16 << 20
        )
    return regime.finish(res, args.json)


if __name__ == "__main__":
    main()
