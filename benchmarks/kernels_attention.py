"""Attention kernel timing (one layer).

    PYTHONPATH=. python benchmarks/kernels_attention.py [--threads 1 2] [--variant NAME]
    PYTHONPATH=. python benchmarks/kernels_attention.py --fast [--lengths 512 1024 ...] \
        [--threads 1] [--shapes 9x3x64 8x2x128 8x4x256] [--kv-dtypes f32 f16 q8_0]
    PYTHONPATH=. python benchmarks/kernels_attention.py --decode [--lengths 4096] \
        [--threads 1 2] [--shapes 9x3x64x30 4x1x256x18] [--kv-dtypes f32 f16 q8_0] \
        [--blocks-in-order] [--capacity 131072]
    PYTHONPATH=. python benchmarks/kernels_attention.py --smoke   # all three tables, tiny (the test suite)

--decode: one decode step's attention (T = 1) over every layer of a model's cache
(HxKVxHDxLAYERS: SmolLM2-135M 9x3x64x30, Gemma 3 270M 4x1x256x18 without its sliding
windows), as big as the real cache so it streams from memory, per storage type and kernel:
median ms per step (alternating calls) and the GB/s of cache it reads; "graph" is the fast
kernel's layers bound into one graph and replayed, as a model's decode step runs them (no
per-call thread start or allocation), bound for a cache of --capacity tokens if given (a
model's graph is bound for its cache's capacity, which sizes the split of its keys).  FMA: the
graph's float operations (4 * hd per query head and key, as below) per second as a share of
the variant's float32 FMA peak measured on the same threads (kernels_matmul.fma_peak; none on
portable): what bounds a step whose cache streams faster than the kernels compute.  f16
floor (f16 rows): the same rate as a share of the f16 mix's (kernels_matmul.f16_fma_peak: a
vector converted from float16 for every 4 multiply-adds, as a GQA group of 4 reads the
cache), the most such a kernel can reach where the conversion takes FMA port time.

Default: the exact kernel at SmolLM2-135M's shape.  --fast: a prefill of n tokens (queries at
positions 0..n-1 over the n keys just written, causal) by the exact and the fast kernel,
alternating, per shape HxKVxHD: median wall ms and CPU ms per call (CPU time is steadier on
a shared machine; with one thread it is the kernel's own time), GFLOP/s from the wall
median, and the speed-up of fast over exact (ratio of medians, wall and CPU).

9 query heads, 3 kv heads, head_dim 64, block 16.  Decode (T=1) at several contexts and
prefill (T queries at positions 0..T-1 over the T keys just written).  Median (and min) of
repeated calls, wall clock, in ms, and GFLOP/s counting 4 * hd flops per (query head, visible key): 2*hd for QK
and 2*hd for AV (the exp and the softmax bookkeeping are not counted).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import regime
from kernels_matmul import f16_fma_peak, fma_peak

from goinfer._kernels import _config, attention, attention_fast, kv_write
from goinfer._kernels.attention import attention_scratch, bind_attention_fast
from goinfer._kernels.graph import Graph
from goinfer.kv_cache import kv_shapes

H, N_KV, HD, BS = 9, 3, 64, 16


def make_cache(n_tokens: int, rng, n_kv=N_KV, hd=HD, dtype="f32", in_order=False):
    nb = (n_tokens + BS - 1) // BS
    ks, vs, npdt = kv_shapes(dtype, nb + 4, n_kv, hd, BS)
    k_cache, v_cache = np.zeros(ks, npdt), np.zeros(vs, npdt)
    # non-contiguous block ids, or the blocks in order (a session's cache filled from empty)
    ids = np.arange(nb + 4) if in_order else rng.permutation(nb + 4)
    block_table = ids[:nb].astype(np.int32)
    k = rng.standard_normal((n_tokens, n_kv, hd)).astype(np.float32)
    v = rng.standard_normal((n_tokens, n_kv, hd)).astype(np.float32)
    pos = np.arange(n_tokens)
    slots = (block_table[pos // BS].astype(np.int64) * BS + pos % BS).astype(np.int64)
    kv_write(k_cache, v_cache, k, v, slots)
    return k_cache, v_cache, block_table


MIN_TIME = 0.4


def bench(fn, min_time=None, max_reps=200):
    """(median, min) wall-clock seconds of repeated calls"""
    fn()  # warm up
    times = []
    t_end = time.perf_counter() + (MIN_TIME if min_time is None else min_time)
    while len(times) < 5 or (time.perf_counter() < t_end and len(times) < max_reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), float(np.min(times))


def fast_vs_exact(args) -> list[dict]:
    rows = []
    rng = np.random.default_rng(0)
    print(
        f"variant {_config.variant()}, block {BS}, causal prefill of n tokens; "
        f"median of {args.reps} alternating calls"
    )
    print(
        f"{'shape':<10}{'dtype':>6}{'n':>6}{'thr':>4}{'exact ms':>10}{'cpu':>9}{'GF/s':>7}"
        f"{'fast ms':>10}{'cpu':>9}{'GF/s':>7}{'x wall':>8}{'x cpu':>7}"
    )
    for shape, dt in ((sh, dt) for sh in args.shapes for dt in args.kv_dtypes or ["f32"]):
        h, n_kv, hd = (int(v) for v in shape.split("x"))
        for n in args.lengths:
            k_cache, v_cache, bt = make_cache(n, rng, n_kv, hd, dt)
            q = rng.standard_normal((n, h, hd)).astype(np.float32)
            q_pos = np.arange(n, dtype=np.int32)
            out = np.empty_like(q)
            flops = 4.0 * hd * h * n * (n + 1) / 2
            for nt in args.threads:
                res = {"exact": [], "fast": []}
                fns = {"exact": attention, "fast": attention_fast}
                for name in res:  # warm up
                    fns[name](q, k_cache, v_cache, bt, q_pos, 1 / np.sqrt(hd), out=out, nthreads=nt)
                for _ in range(args.reps):
                    for name in res:
                        c0, t0 = time.process_time(), time.perf_counter()
                        fns[name](
                            q, k_cache, v_cache, bt, q_pos, 1 / np.sqrt(hd), out=out, nthreads=nt
                        )
                        res[name].append((time.perf_counter() - t0, time.process_time() - c0))
                (we, ce), (wf, cf) = (
                    np.median(np.array(res[k]), axis=0) for k in ("exact", "fast")
                )
                rows.append(
                    {
                        "table": "prefill",
                        "shape": shape,
                        "kv_dtype": dt,
                        "n": n,
                        "threads": nt,
                        "exact_ms": we * 1e3,
                        "exact_cpu_ms": ce * 1e3,
                        "fast_ms": wf * 1e3,
                        "fast_cpu_ms": cf * 1e3,
                        "exact_GFs": flops / we * 1e-9,
                        "fast_GFs": flops / wf * 1e-9,
                        "speedup_wall": we / wf,
                        "speedup_cpu": ce / cf if cf > 0 else None,
                    }
                )
                print(
                    f"{shape:<10}{dt:>6}{n:>6}{nt:>4}{we * 1e3:>10.1f}{ce * 1e3:>9.1f}"
                    f"{flops / we * 1e-9:>7.1f}{wf * 1e3:>10.1f}{cf * 1e3:>9.1f}"
                    f"{flops / wf * 1e-9:>7.1f}{we / wf:>8.2f}{ce / cf if cf > 0 else 0:>7.2f}",
                    flush=True,
                )
    return rows


def decode_graph(layers, q, q_pos, out, nt, capacity=0):
    """the fast kernel over every layer as one bound Graph on nt threads (a decode step's
    attention as a model replays it); one scratch serves every layer.  capacity: bound for
    positions up to capacity - 1, as a model's graph is for its cache's (the block tables
    padded with block 0 past the keys, which no step reads)"""
    hd = q.shape[2]
    max_pos = max(int(q_pos[-1]), capacity - 1)
    need = max_pos // BS + 1
    layers = [
        (kc, vc, np.concatenate([bt, np.zeros(max(0, need - len(bt)), np.int32)]))
        for kc, vc, bt in layers
    ]
    per = max(
        attention_scratch(
            q, kc, vc, bt, q_pos, 1 / np.sqrt(hd), out=out, nthreads=nt, max_pos=max_pos, fast=True
        )
        for kc, vc, bt in layers
    )
    scratch = np.zeros((nt, per), np.float64)
    ops = [
        bind_attention_fast(
            q,
            kc,
            vc,
            bt,
            q_pos,
            1 / np.sqrt(hd),
            out=out,
            nthreads=nt,
            scratch=scratch,
            max_pos=max_pos,
        )
        for kc, vc, bt in layers
    ]
    return Graph(ops, nt)


def decode(args) -> list[dict]:
    """one decode step's attention over every layer, per storage type and kernel"""
    rows = []
    rng = np.random.default_rng(0)
    print(
        f"variant {_config.variant()}, block {BS}, decode (T=1) over all layers; median of "
        f"{args.reps} alternating steps; GB/s: bytes of K and V read per step / time"
    )
    print(
        f"{'shape':<14}{'n':>6}{'dtype':>6}{'thr':>4}{'exact ms':>10}{'GB/s':>7}{'fast ms':>10}"
        f"{'GB/s':>7}{'graph ms':>10}{'GB/s':>7}{'FMA':>6}{'f16 floor':>10}"
    )
    peaks = {nt: fma_peak(nt) for nt in args.threads}  # GFLOP/s (0.0: portable)
    f16_peaks = {nt: f16_fma_peak(nt) for nt in args.threads}  # the f16 mix's, likewise
    for shape in args.shapes:
        h, n_kv, hd, n_layers = (int(v) for v in shape.split("x"))
        for n in args.lengths:
            for dt in args.kv_dtypes or ["f32", "f16", "q8_0"]:
                layers = [
                    make_cache(n, rng, n_kv, hd, dt, args.blocks_in_order) for _ in range(n_layers)
                ]
                nbytes = (
                    n_layers * n * sum(c.nbytes / c.shape[0] / BS for c in layers[0][:2])
                )  # K and V of n tokens
                q = rng.standard_normal((1, h, hd)).astype(np.float32)
                q_pos = np.array([n - 1], np.int32)
                out = np.empty_like(q)
                for nt in args.threads:
                    res = {"exact": [], "fast": [], "graph": []}
                    fns = {"exact": attention, "fast": attention_fast}
                    graph = decode_graph(layers, q, q_pos, out, nt, args.capacity)

                    def step(name):
                        if name == "graph":
                            graph.run()
                            return
                        for kc, vc, bt in layers:
                            fns[name](q, kc, vc, bt, q_pos, 1 / np.sqrt(hd), out=out, nthreads=nt)

                    for name in res:
                        step(name)  # warm up
                    for _ in range(args.reps):
                        for name in res:
                            t0 = time.perf_counter()
                            step(name)
                            res[name].append(time.perf_counter() - t0)
                    we, wf, wg = (float(np.median(res[k])) for k in ("exact", "fast", "graph"))
                    flops = 4 * h * hd * n * n_layers  # QK and AV of every query head and key
                    share = flops / wg * 1e-9 / peaks[nt] if peaks[nt] else None
                    f16p = f16_peaks[nt] if dt == "f16" else None
                    floor = flops / wg * 1e-9 / f16p if f16p else None
                    rows.append(
                        {
                            "table": "decode",
                            "shape": shape,
                            "n": n,
                            "kv_dtype": dt,
                            "threads": nt,
                            "capacity": max(n, args.capacity),
                            "exact_ms": we * 1e3,
                            "exact_GBs": nbytes / we * 1e-9,
                            "fast_ms": wf * 1e3,
                            "fast_GBs": nbytes / wf * 1e-9,
                            "graph_ms": wg * 1e3,
                            "graph_GBs": nbytes / wg * 1e-9,
                            "fma_peak_GFLOPs": peaks[nt],
                            "graph_fma_share": share,
                            "f16_fma_peak_GFLOPs": f16p,
                            "graph_f16_floor_share": floor,
                        }
                    )
                    print(
                        f"{shape:<14}{n:>6}{dt:>6}{nt:>4}{we * 1e3:>10.2f}{nbytes / we * 1e-9:>7.1f}"
                        f"{wf * 1e3:>10.2f}{nbytes / wf * 1e-9:>7.1f}"
                        f"{wg * 1e3:>10.2f}{nbytes / wg * 1e-9:>7.1f}"
                        + (f"{100 * share:>5.0f}%" if share is not None else f"{'-':>6}")
                        + (f"{100 * floor:>9.0f}%" if floor is not None else f"{'-':>10}"),
                        flush=True,
                    )
                layers.clear()  # free this shape's caches before the next one
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--variant", default=None)
    ap.add_argument("--fast", action="store_true", help="exact vs fast prefill table")
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192])
    ap.add_argument("--shapes", nargs="+", default=["9x3x64", "8x2x128", "8x4x256"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--decode", action="store_true", help="decode attention over all layers")
    ap.add_argument(
        "--kv-dtypes",
        nargs="+",
        default=None,
        help="KV cache storage types (default: f32 for --fast, f32 f16 q8_0 for --decode)",
    )
    ap.add_argument(
        "--blocks-in-order",
        action="store_true",
        help="--decode: block table 0, 1, 2, ... (default: a random permutation)",
    )
    ap.add_argument(
        "--capacity",
        type=int,
        default=0,
        help="--decode: bind the graph for a cache of this many tokens (default: the length)",
    )
    ap.add_argument(
        "--smoke", action="store_true", help="all three tables at 64 tokens (the test suite)"
    )
    regime.add_json_arg(ap)
    args = ap.parse_args(argv)
    global MIN_TIME
    cases = [
        ("decode", 64),
        ("decode", 512),
        ("decode", 2048),
        ("decode", 8192),
        ("prefill", 512),
        ("prefill", 2048),
    ]
    if args.variant:
        _config.set_variant(args.variant)
    res = {"benchmark": "kernels_attention", "regime": regime.header(None, argv=argv), "rows": []}
    if args.smoke:
        args.threads, args.lengths, args.shapes, args.reps = [1], [64], ["9x3x64"], 1
        cases, MIN_TIME = [("decode", 64), ("prefill", 64)], 0.0
        res["rows"] += fast_vs_exact(args)
        res["rows"] += decode(argparse.Namespace(**{**vars(args), "shapes": ["9x3x64x2"]}))
    elif args.fast:
        res["rows"] += fast_vs_exact(args)
        return regime.finish(res, args.json)
    elif args.decode:
        if args.shapes == ["9x3x64", "8x2x128", "8x4x256"]:
            args.shapes = ["9x3x64x30", "4x1x256x18"]
        if args.lengths == [512, 1024, 2048, 4096, 8192]:
            args.lengths = [4096]
        res["rows"] += decode(args)
        return regime.finish(res, args.json)
    rng = np.random.default_rng(0)
    scale = 1.0 / np.sqrt(HD)
    print(f"variant {_config.variant()}, H={H} n_kv={N_KV} hd={HD} bs={BS}")
    print(f"{'case':<16}{'threads':>8}{'median ms':>11}{'GFLOP/s':>9}{'min ms':>9}{'GFLOP/s':>9}")
    for kind, n in cases:
        k_cache, v_cache, bt = make_cache(n, rng)
        if kind == "decode":
            T = 1
            q_pos = np.array([n - 1], np.int32)
            keys = n
        else:
            T = n
            q_pos = np.arange(n, dtype=np.int32)
            keys = n * (n + 1) // 2
        q = rng.standard_normal((T, H, HD)).astype(np.float32)
        out = np.empty_like(q)
        flops = 4.0 * HD * keys * H
        for nt in args.threads:
            t, tmin = bench(
                lambda: attention(q, k_cache, v_cache, bt, q_pos, scale, out=out, nthreads=nt)
            )
            res["rows"].append(
                {
                    "table": "exact",
                    "case": kind,
                    "n": n,
                    "threads": nt,
                    "median_ms": t * 1e3,
                    "min_ms": tmin * 1e3,
                    "GFs": flops / t * 1e-9,
                }
            )
            print(
                f"{kind + ' ' + str(n):<16}{nt:>8}{t * 1e3:>11.3f}{flops / t * 1e-9:>9.2f}"
                f"{tmin * 1e3:>9.3f}{flops / tmin * 1e-9:>9.2f}"
            )
    return regime.finish(res, args.json)


if __name__ == "__main__":
    main()
