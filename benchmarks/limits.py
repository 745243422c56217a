"""How close goinfer runs to this machine's limits: decode bytes per token against memory
bandwidth, prefill matmul operations per second against the int8 dot-product peak.

    python benchmarks/limits.py [MODEL] [--threads 2] [--contexts 64,2048] [--prefill 512,2048]
        [--json out.json]
    python benchmarks/limits.py --bytes MODEL [MODEL ...]   # bytes per token only: no timing
    python benchmarks/limits.py --smoke     # tiny model, small buffers (the test suite)

Bytes per token per file (every run, and alone with --bytes): the file's own bytes of the
tensors a decode step reads (every matrix, the LM head, one embedding row; the whole table when
the head is tied to it) against the bytes goinfer's decode reads for them (its repacked layout,
weight_bytes below), per weight kind and the GGUF type it came from.  Every type goinfer loads
as it is (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, MXFP4, Q4_K, Q5_K, Q6_K, F16, BF16, F32) has the file's bytes per
row block of 16 rows, so the two are equal up to rows padded to a multiple of 16; a type
converted at load (docs/design/gguf.md) shows its conversion's cost here.  Deterministic.

Memory bandwidth (read_bandwidth): a read-only sweep of a float32 buffer larger than the caches
(numpy max: one core, vector compares, the fastest of numpy's reductions here — sum, dot and
integer sums read slower), median of 5, in one process, and in as many processes at once as
--threads (each its own buffer of max(256 MiB, 4 x L3 / threads)), every rep started at a
barrier: all their bytes over the span from the first start to the last end.  A lower
bound of the machine's read bandwidth; peers.py --measure-bandwidth uses the same sweep.  Decode bytes per token: every weight a decode step reads
(all layers' matmul weights in goinfer's layout, the LM head, one embedding row) plus the
KV cache read by attention at that context (K and V of every layer in the cache's type).  Decode tok/s from
goinfer.bench.time_decode; achieved bandwidth = bytes/token x tok/s, a fraction of the mean of
two sweeps with --threads processes, just before and just after the row (a shared host's
bandwidth moved by up to 2x within minutes).  Where the weights are mapped from goinfer's
layout cache, the row also sweeps those very pages (read_bandwidth with pages=, after the row)
and gives its fraction of their bandwidth: in a virtual machine the same file's page-cache
pages read up to 25% slower or faster than a fresh buffer, depending on where they landed.

Prefill: `goinfer.profile` times the matmul kernels of one cold prefill; int8 operations =
2 x (weight elements of every matmul) x tokens (the LM head runs for the last position only).
Peak: the running variant's int8 peak measured on --threads threads at once
(kernels_matmul.int8_peak: its dot-product instruction alone, AVX-512 vpdpbusd or AVX2
vpmaddubsw, no clock assumed); the best GEMM rate of the kernel itself is in
benchmarks/kernels_matmul.py.
"""

from __future__ import annotations

import argparse
import bisect
import multiprocessing as mp
import statistics
import time
from pathlib import Path

import numpy as np
import regime
from kernels_matmul import int8_peak


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


def _arrays(n_bytes: int, pages: tuple | None = None) -> list[np.ndarray]:
    """What one process sweeps: a fresh float32 buffer of n_bytes, or with pages = (path,
    [(lo, hi), ...]) float32 views of those ranges of a file, mapped read-only (its pages in the
    page cache, the very memory a process mapping the file reads)."""
    if pages is None:
        return [np.ones(n_bytes // 4, np.float32)]
    path, pieces = pages
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    return [mm[lo : lo + (hi - lo) // 4 * 4].view(np.float32) for lo, hi in pieces if hi - lo >= 4]


def _spans(n_bytes: int, reps: int, barrier=None, pages=None) -> list[tuple[float, float]]:
    """(start, end) of each of reps sweeps of the process's arrays (_arrays) on the monotonic
    clock (shared across processes); with a barrier (a concurrent sweep), every rep starts when
    all the processes reach it, so they read at the same time."""
    arrays = _arrays(n_bytes, pages)
    for a in arrays:
        a.max()  # touch
    spans = []
    for _ in range(reps):
        if barrier is not None:
            barrier.wait()
        t0 = time.monotonic()
        for a in arrays:
            a.max()
        spans.append((t0, time.monotonic()))
    return spans


def _rate(n_bytes: int, spans: list[tuple[float, float]]) -> float:
    """bytes/s of one process's median rep"""
    return n_bytes / statistics.median(e - b for b, e in spans)


def _sweep_child(n_bytes, reps, barrier, q, pages=None):
    q.put((n_bytes, _spans(n_bytes, reps, barrier, pages)))


def concurrent_rates(spans: list[list[tuple[float, float]]], n_bytes: list[int]) -> list[float]:
    """Bytes/s of each rep of a concurrent sweep: spans[p][r] = (start, end) of process p's rep
    r, reading n_bytes[p]; all the rep's bytes over its first start to its last end."""
    return [
        sum(n_bytes) / (max(s[r][1] for s in spans) - min(s[r][0] for s in spans))
        for r in range(len(spans[0]))
    ]


def shares(pieces: list[tuple[int, int]], n: int) -> list[list[tuple[int, int]]]:
    """[lo, hi) ranges cut into n shares of (nearly) equal bytes: share k holds, in order, the
    bytes from k/n to (k+1)/n of the ranges laid end to end, cut at 64-byte boundaries (as
    decode splits the rows of a weight between its threads)."""
    total = sum(hi - lo for lo, hi in pieces)
    cuts = [total * k // n // 64 * 64 for k in range(1, n)]  # positions in the ranges end to end
    out: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    pos = 0  # where the current range starts, end to end
    for lo, hi in pieces:
        a = lo
        while a < hi:
            k = bisect.bisect_right(cuts, pos + a - lo)  # the share of byte a
            end = hi if k == n - 1 else min(hi, lo + cuts[k] - pos)
            out[k].append((a, end))
            a = end
        pos += hi - lo
    return out


def read_bandwidth(
    threads: int, n_bytes: int | None = None, reps: int = 5, pages: tuple | None = None
) -> dict:
    """GB/s of `threads` processes sweeping their own buffers at once; n_bytes per process
    (default max(256 MiB, 4 x L3 / threads)).  Each rep starts every process at a barrier and
    counts all their bytes over the span from the first start to the last end (so a process
    that ran alone for part of the rep cannot inflate the sum); the median rep.

    pages = (path, [(lo, hi), ...]): the bandwidth of those pages of a file instead, each
    process sweeping its share of the ranges (shares) in the page cache: the memory a model's
    mapped weights occupy.  Where a virtual machine's memory is not uniformly fast, the same
    bytes read at different speeds depending on which physical pages hold them, and a fresh
    buffer does not tell which."""
    if pages is not None:
        parts = [(pages[0], share) for share in shares(pages[1], threads)]
        sizes = [sum((hi - lo) // 4 * 4 for lo, hi in share) for _, share in parts]
        if min(sizes) < 4:
            raise ValueError(
                f"{sum(sizes)} bytes of pages are too few to share among {threads} processes"
            )
    else:
        if n_bytes is None:
            n_bytes = max(256 << 20, 4 * _l3_bytes() // threads)
        parts, sizes = [None] * threads, [n_bytes] * threads
    where = {} if pages is None else {"pages_of": str(pages[0]), "bytes": sum(sizes)}
    if threads == 1:
        rate = _rate(sizes[0], _spans(sizes[0], reps, pages=parts[0]))
        return {
            "GBs": rate / 1e9,
            "processes": 1,
            "buffer_bytes_per_process": sizes[0],
            "per_process_GBs": [rate / 1e9],
            "reps": reps,
            **where,
        }
    ctx = mp.get_context("spawn")
    q, barrier = ctx.Queue(), ctx.Barrier(threads)
    ps = [
        ctx.Process(target=_sweep_child, args=(sizes[i], reps, barrier, q, parts[i]))
        for i in range(threads)
    ]
    for p in ps:
        p.start()
    got = [q.get() for _ in ps]  # (bytes, (reps, 2) spans) of each process as it finished
    for p in ps:
        p.join()
    spans = [s for _, s in got]
    per = [_rate(n, s) for n, s in got]
    return {
        "GBs": statistics.median(concurrent_rates(spans, [n for n, _ in got])) / 1e9,
        "processes": threads,
        "buffer_bytes_per_process": max(sizes),
        "per_process_GBs": [r / 1e9 for r in per],
        "reps": reps,
        "sync": "barrier per rep; all bytes over the first start to the last end",
        **where,
    }


def weight_bytes(model) -> dict[str, int]:
    """Bytes of goinfer's weights a decode step reads, per kind ("q4_k from Q4_K"): every
    matrix, the LM head, one embedding row (the whole table when the head is tied to it)."""
    impl, cfg = model.impl, model.config
    by_kind: dict[str, int] = {}
    for w in impl.weights():
        n = w.nbytes
        if w is impl.tok_embd and impl.lm_head is not impl.tok_embd:
            n //= cfg.vocab_size  # one embedding row
        key = w.kind + (f" from {w.source_type}" if w.source_type else "")
        by_kind[key] = by_kind.get(key, 0) + n
    return by_kind


def decode_bytes(model, context: int) -> dict:
    w_bytes = sum(weight_bytes(model).values())
    kv = model.cache.stats().bytes_per_token * context  # K and V of every layer, stored type
    return {"weights": w_bytes, "kv": kv, "total": w_bytes + kv}


def file_decode_bytes(path) -> dict:
    """The file's own bytes of what a decode step reads: every tensor of 2 or more dimensions
    (matrices, stacked experts) but the token embedding, of which one row, or the whole table
    when there is no output.weight (the head tied to it).  Norms and other vectors left out,
    as decode_bytes leaves them out."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from goinfer.gguf import GGUFFile

    total, per_type = 0, {}
    with GGUFFile(str(path)) as g:
        tied = not g.has_tensor("output.weight")
        for name in g.tensor_names:
            tname, shape = g.tensor_info(name)
            if len(shape) < 2:
                continue
            bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType[tname]]
            n = int(np.prod(shape, dtype=np.int64)) * ts // bs
            if name == "token_embd.weight" and not tied:
                n //= shape[0]  # one row of (vocab, d)
            total += n
            per_type[tname] = per_type.get(tname, 0) + n
    return {"bytes": total, "by_type": per_type, "head_tied": tied}


def bytes_per_token(model) -> dict:
    """Weight bytes a decode step reads: the file's against goinfer's, with goinfer's per kind."""
    f = file_decode_bytes(model.path)
    by_kind = weight_bytes(model)
    mine = sum(by_kind.values())
    return {
        "file": Path(model.path).name,
        "file_bytes": f["bytes"],
        "file_by_type": f["by_type"],
        "head_tied": f["head_tied"],
        "goinfer_bytes": mine,
        "goinfer_by_kind": by_kind,
        "goinfer_over_file": mine / f["bytes"],
    }


def print_bytes(rows: list[dict]) -> None:
    print(
        "| file | file's bytes a decode step reads | goinfer's decode reads | ratio | goinfer's kinds |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        kinds = ", ".join(
            f"{k} {v / 1e6:.1f} MB"
            for k, v in sorted(r["goinfer_by_kind"].items(), key=lambda kv: -kv[1])
        )
        print(
            f"| {r['file']} | {r['file_bytes'] / 1e6:.1f} MB | {r['goinfer_bytes'] / 1e6:.1f} MB | "
            f"{r['goinfer_over_file']:.4f} | {kinds} |"
        )


def prefill_ops(model, tokens: int) -> float:
    impl = model.impl
    per_token = sum(w.n_out * w.n_in for L in impl.layers for w in L.weights())
    return 2.0 * (per_token * tokens + impl.lm_head.n_out * impl.lm_head.n_in)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "model",
        nargs="*",
        default=["smollm2-135m"],
        help="a model name or GGUF path (several with --bytes)",
    )
    ap.add_argument(
        "--bytes",
        action="store_true",
        help="only the bytes per token of each model (no timing, no bandwidth)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", default="64,2048")
    ap.add_argument("--prefill", default="512,2048")
    ap.add_argument(
        "--smoke", action="store_true", help="tiny model, small buffers (the test suite)"
    )
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

        a.model, a.contexts, a.prefill = [str(smoke_model(tmp.name))], "64", "64"
        n_bytes, reps = 16 << 20, 1
    if a.bytes:
        res = {
            "benchmark": "limits",
            "regime": regime.header(a.threads, argv=argv),
            "bytes_per_token": [],
        }
        for name in a.model:
            model = goinfer.Model.load(name, threads=a.threads, progress=False)
            res["bytes_per_token"].append(
                {**bytes_per_token(model), "model": regime.model(model.path)}
            )
            del model
        print_bytes(res["bytes_per_token"])
        tmp.cleanup()
        return regime.finish(res, a.json)
    if len(a.model) != 1:
        ap.error("one model per timed run (several only with --bytes)")
    bw = {"one_core": read_bandwidth(1, n_bytes, reps)}
    bw["threads"] = read_bandwidth(a.threads, n_bytes, reps) if a.threads > 1 else bw["one_core"]
    print(
        f"memory read bandwidth: one core {bw['one_core']['GBs']:.1f} GB/s, "
        f"{a.threads} processes {bw['threads']['GBs']:.1f} GB/s"
    )
    model = goinfer.Model.load(a.model[0], threads=a.threads, progress=False)
    res = {
        "benchmark": "limits",
        "regime": regime.header(a.threads, argv=argv),
        "model": regime.model(model.path),
        "weight_pages": bench.weight_pages(model),
        "bytes_per_token": [bytes_per_token(model)],
        "bandwidth": bw,
        "decode": [],
        "prefill": [],
    }
    print_bytes(res["bytes_per_token"])
    for ctx in (int(c) for c in a.contexts.split(",")):
        b = decode_bytes(model, ctx)
        # the bandwidth just before and just after the row (a shared host's moves within
        # minutes): the row is set against their mean
        around = [read_bandwidth(a.threads, n_bytes, reps)["GBs"]]
        tok_s = 1.0 / statistics.median(
            bench.time_decode(model, ctx, 4 if a.smoke else 32, 1 if a.smoke else 3)
        )
        around.append(read_bandwidth(a.threads, n_bytes, reps)["GBs"])
        bw_threads = sum(around) / 2
        gbs = b["total"] * tok_s / 1e9
        row = {
            "context": ctx,
            "bytes_per_token": b,
            "tok_s": tok_s,
            "GBs": gbs,
            "bandwidth_around_GBs": around,
            "fraction_of_bandwidth": gbs / bw_threads,
        }
        pages = bench.mapped_pages(model)  # and the memory the weights occupy (module docstring)
        if pages is not None:
            row["weight_pages_GBs"] = read_bandwidth(a.threads, reps=reps, pages=pages)["GBs"]
            row["fraction_of_weight_pages"] = gbs / row["weight_pages_GBs"]
        res["decode"].append(row)
        print(
            f"decode after {ctx}: {b['total'] / 1e6:.1f} MB/token (weights "
            f"{b['weights'] / 1e6:.1f}, KV {b['kv'] / 1e6:.1f}) x {tok_s:.1f} tok/s = "
            f"{gbs:.1f} GB/s = {100 * gbs / bw_threads:.0f}% of the bandwidth measured around it "
            f"({around[0]:.1f}, {around[1]:.1f} GB/s)"
            + (
                f", {100 * row['fraction_of_weight_pages']:.0f}% of its weight pages' "
                f"{row['weight_pages_GBs']:.1f} GB/s"
                if pages is not None
                else ""
            )
        )
    peak = int8_peak(a.threads)  # GOP/s, measured (0.0: portable, no peak stated)
    for n in (int(c) for c in a.prefill.split(",")):
        p = profile.run(model, n, decode_tokens=1)["prefill"]
        mm = p["matmul"]["seconds"]
        gops = prefill_ops(model, n) / mm / 1e9
        row = {
            "tokens": n,
            "tok_s": p["tok_s"],
            "matmul_seconds": mm,
            "matmul_share": p["matmul"]["share"],
            "int8_GOPs": gops,
            "peak_GOPs": peak,
            "peak_measured": True,
        }
        res["prefill"].append(row)
        share = f"{100 * gops / peak:.0f}%" if peak else "(no peak stated)"
        print(
            f"prefill {n}: {p['tok_s']:.0f} tok/s, matmul {100 * p['matmul']['share']:.0f}% of "
            f"the time at {gops:.0f} int8 GOP/s = {share} of the "
            f"{peak:.0f} GOP/s int8 peak of {_config.variant()} measured on {a.threads} threads"
        )
    tmp.cleanup()
    return regime.finish(res, a.json)


if __name__ == "__main__":
    main()
