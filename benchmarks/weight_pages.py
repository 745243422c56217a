"""Decode with the weights on 4 KB pages against the same weights on 2 MB pages.

    PYTHONPATH=. python benchmarks/weight_pages.py MODEL [--threads 2] [--rounds 4]
    PYTHONPATH=. python benchmarks/weight_pages.py --smoke     # tiny model (the test suite)

goinfer maps a model's layout cache file (goinfer/layout.py).  Where the page cache holds that
file in 4 KB pages, decode streams the weights through 4 KB mappings; where it holds it in 2 MB
folios, or where the load copied the weights into anonymous huge pages (place_weights), through
2 MB ones.  This script times both, each load in a process of its own, alternating:

  map    GOINFER_LAYOUT_PAGES=map, after the layout file was read back into the page cache 4 KB
         at a time (dropped first, then read in 4 KB pieces with readahead off): the state of a
         file system that caches files in 4 KB pages (ext4 before Linux 6.16), or of pages that
         came in piecemeal
  copy   GOINFER_LAYOUT_PAGES=copy: the weights copied into anonymous huge pages

Per run: decode tok/s (the median of --repeats timings of --tokens greedy steps after a
--prompt-token prompt, goinfer.bench.decode_seconds), the load's seconds, how the weights were
backed and the share of their pages mapped 2 MB at a time (goinfer.bench.weight_pages), and the
machine's read bandwidth sampled just before the run (benchmarks/limits.py, same threads).
Summary: each mode's median tok/s and load time, copy over map of the medians, and each
round's copy over its map run with their median (the ratio to trust on a host whose read
bandwidth drifts: the two runs of a round are a minute apart).  --smoke: the tiny shape
(benchmarks/shapes.py), one round, short timings (its layout is too small for huge pages: the
run checks the plumbing, not the speed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

import isolate
import regime

MODES = ("map", "copy")


# ============================================================================ one run (the child)


def child() -> None:
    spec = isolate.child_spec()
    import time

    from goinfer import Model, bench

    t0 = time.perf_counter()
    m = Model.load(spec["model"], threads=spec["threads"], progress=False)
    load_s = time.perf_counter() - t0
    ids = bench.prompt_ids(m, spec["prompt"], seed=1)
    bench.decode_seconds(m, ids, 2)  # warm-up
    ts = [bench.decode_seconds(m, ids, spec["tokens"]) for _ in range(spec["repeats"])]
    isolate.child_reply(
        {
            "mode": spec["mode"],
            "tok_s": 1.0 / statistics.median(ts),
            "runs_s_per_token": ts,
            "load_s": load_s,
            "load_source": m.load_info.source,
            "layout": str(m.load_info.path),
            **bench.weight_pages(m),
        }
    )


def small_pages(path: str) -> None:
    """Drop the file from the page cache, then read it back 4 KB at a time with readahead off:
    the page cache then holds it in 4 KB pages (pages another process maps stay as they are)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        size = os.fstat(fd).st_size
        for off in range(0, size, 4096):
            os.pread(fd, 4096, off)
    finally:
        os.close(fd)


# ============================================================================ the parent


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4, help="alternations of map and copy")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="tiny model, one round (the test suite)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    regime.add_json_arg(ap)
    args = ap.parse_args(argv)
    if args.child:
        child()
        return {}
    from limits import read_bandwidth

    tmp = tempfile.TemporaryDirectory()
    n_bytes = None
    if args.smoke:
        from shapes import smoke_model

        args.model = str(smoke_model(tmp.name))
        args.rounds, args.prompt, args.tokens, args.repeats = 1, 16, 2, 1
        n_bytes = 16 << 20
    if not args.model:
        ap.error("a model path is needed (or --smoke)")
    res = {
        "benchmark": "weight_pages",
        "regime": regime.header(args.threads, argv=argv),
        "model": regime.model(args.model),
        "prompt_tokens": args.prompt,
        "decode_tokens": args.tokens,
        "repeats": args.repeats,
        "one_process_per_run": True,
        "runs": {m: [] for m in MODES},
    }
    print(
        f"{Path(args.model).name}: decode {args.tokens} tokens after {args.prompt}, "
        f"{args.threads} threads, {args.rounds} rounds",
        flush=True,
    )
    spec = {k: getattr(args, k) for k in ("model", "threads", "prompt", "tokens", "repeats")}
    layout_file = None
    for _ in range(args.rounds):
        for mode in MODES:
            if mode == "map" and layout_file:
                small_pages(layout_file)
            bw = read_bandwidth(args.threads, n_bytes, 1 if args.smoke else 5)["GBs"]
            env = dict(os.environ, GOINFER_LAYOUT_PAGES=mode)
            r = isolate.run_child(__file__, {**spec, "mode": mode}, env=env)
            if layout_file is None and r["load_source"] != "gguf":
                layout_file = r["layout"]  # the first load built it
                if mode == "map":  # that run read a file just written: run it again
                    small_pages(layout_file)
                    r = isolate.run_child(__file__, {**spec, "mode": mode}, env=env)
            r["bandwidth_GBs"] = bw
            res["runs"][mode].append(r)
            print(
                f"  {mode}: {r['tok_s']:.1f} tok/s, load {r['load_s']:.2f} s, pages "
                f"{r['pages']} (2 MB share {r['huge_share']}), read bandwidth {bw:.1f} GB/s",
                flush=True,
            )
    med = {
        m: {k: statistics.median(r[k] for r in res["runs"][m]) for k in ("tok_s", "load_s")}
        for m in MODES
    }
    res["median"] = med
    res["copy_over_map"] = med["copy"]["tok_s"] / med["map"]["tok_s"]
    # each round's copy over its own map run: the two ran a minute apart, so a host whose
    # bandwidth drifts between states moves both alike more often than it moves the medians
    res["round_ratios"] = [
        c["tok_s"] / m["tok_s"] for m, c in zip(*(res["runs"][m] for m in MODES))
    ]
    res["round_ratio_median"] = statistics.median(res["round_ratios"])
    for m in MODES:
        print(f"{m}: {med[m]['tok_s']:.1f} tok/s (median), load {med[m]['load_s']:.2f} s")
    print(
        f"copy / map: {res['copy_over_map']:.2f}x of the medians; per round "
        f"{', '.join(f'{r:.2f}' for r in res['round_ratios'])} (median "
        f"{res['round_ratio_median']:.2f}x)"
    )
    tmp.cleanup()
    return regime.finish(res, args.json)


if __name__ == "__main__":
    main(sys.argv[1:])
