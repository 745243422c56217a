"""Load time and peak memory, goinfer vs llama.cpp, each run in a fresh process.

    python benchmarks/memory.py MODEL.gguf [--prefill 4096]
        [--decode 64] [--threads 2] [--repeats 3] [--layout-dir DIR] [--no-first-load]
        [--flash-attn on|off|both] [--llama-mmap on|off|both] [--json out.json]
    PYTHONPATH=. python benchmarks/memory.py --smoke

Each run is a new Python process that imports its engine, then (timed) loads the model, runs
one prefill of --prefill seeded random tokens and --decode greedy decode steps, and reports:
  load_s     seconds of the load alone (goinfer: Model.load; llama.cpp: Llama(...)), imports
             excluded; goinfer's first load builds the layout cache (a fresh --layout-dir),
             later loads map it (goinfer/layout.py);
  rss_load   resident memory after the load (file-backed pages of mapped weights included);
  peak_rss   the process's peak resident memory (VmHWM) over load + prefill + decode: what the
             comparison of memory reads;
  anon/file  the split of the final RSS into anonymous memory and mapped file pages;
  prefill_s  the first prefill after the load (KV cache and compute buffers touched for the
             first time: goinfer pre-faults its cache's first pages at load, memory.py's
             measure of that choice).
Both engines get the same context: n_ctx = prefill + decode (+16); goinfer's KV cache is the
model's default (2 x context, touched only as it fills), llama.cpp's is its own (f16, allocated
for n_ctx at load), with flash attention off and on, and with its GGUF mapped (its default) or
read into memory (--llama-mmap: a CPU backend that repacks weights, as llama.cpp's does for
MXFP4 experts, holds the mapped file and the repacked copy when mapped, one copy when not).
Runs alternate between the engines; medians.  The page cache is warm for every run but
goinfer's first (the file was just read).
--smoke: the tiny shape (benchmarks/shapes.py), short prefill, one repeat, llama.cpp mapped and
read into memory; the llama.cpp side is skipped (with a message) when llama-cpp-python is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import regime

CHILD = r"""
import json, os, resource, sys, time
import numpy as np
engine, path, n_prefill, n_decode, threads, fa, use_mmap = sys.argv[1:8]
n_prefill, n_decode, threads = int(n_prefill), int(n_decode), int(threads)
fa, use_mmap = fa == "1", use_mmap == "1"
n_ctx = n_prefill + n_decode + 16

def status():
    out = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
            out[k] = int(v.split()[0]) * 1024
    return out

if engine == "goinfer":
    import goinfer
    t0 = time.perf_counter()
    m = goinfer.Model.load(path, threads=threads, progress=False, context_length=n_ctx)
    load_s = time.perf_counter() - t0
    src = m.load_info.source
    vocab = m.vocab_size
else:
    import llama_cpp
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                          flash_attn=fa, use_mmap=use_mmap, verbose=False)
    load_s = time.perf_counter() - t0
    src = "mmap" if use_mmap else "read"
    vocab = llm.n_vocab()
after_load = status()
ids = [int(t) for t in np.random.default_rng(n_prefill).integers(200, vocab - 200, n_prefill)]
t0 = time.perf_counter()
if engine == "goinfer":
    s = m.session()
    logits = s.prefill(ids)
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(n_decode):
        logits = s.decode(int(np.argmax(logits)))
else:
    llm.eval(ids)
    prefill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(n_decode):
        row = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(vocab,))
        llm.eval([int(np.argmax(row))])  # (no scores are kept without logits_all)
decode_s = time.perf_counter() - t0
end = status()
print(json.dumps({"load_s": load_s, "source": src, "rss_load": after_load["VmRSS"],
                  "peak_rss": max(end["VmHWM"], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
                  "rss_end": end["VmRSS"], "anon_end": end.get("RssAnon"), "file_end": end.get("RssFile"),
                  "prefill_s": prefill_s, "prefill_tok_s": n_prefill / prefill_s,
                  "decode_tok_s": n_decode / decode_s}))
"""


def run_child(engine: str, path: str, args, fa: bool, layout_dir: str, mmap: bool = True) -> dict:
    env = dict(os.environ, GOINFER_LAYOUT_DIR=layout_dir, OMP_NUM_THREADS=str(args.threads))
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            engine,
            path,
            str(args.prefill),
            str(args.decode),
            str(args.threads),
            "1" if fa else "0",
            "1" if mmap else "0",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=7200,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{engine} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _gb(x) -> str:
    return f"{x / 1e9:.2f}"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--prefill", type=int, default=4096)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--layout-dir",
        default=None,
        help="goinfer's layout cache directory (default: a fresh temporary one)",
    )
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument(
        "--flash-attn",
        choices=["on", "off", "both"],
        default="both",
        help="llama.cpp's flash attention (its lowest-memory setting is on)",
    )
    ap.add_argument(
        "--llama-mmap",
        choices=["on", "off", "both"],
        default="on",
        help="llama.cpp's use_mmap (its default, on, maps the GGUF; off reads it into memory: "
        "a CPU backend that repacks weights then holds one copy of them, not two)",
    )
    ap.add_argument(
        "--no-first-load",
        action="store_true",
        help="skip goinfer's separate first-load run (the layout cache is built already)",
    )
    ap.add_argument("--smoke", action="store_true", help="tiny model, short run (the test suite)")
    regime.add_json_arg(ap)
    args = ap.parse_args(argv)
    tmp = tempfile.TemporaryDirectory()
    if args.smoke:
        from shapes import smoke_model

        args.model = str(smoke_model(tmp.name))
        args.prefill, args.decode, args.repeats = 64, 4, 1
        args.llama_mmap = "both"  # (with llama-cpp-python) each way of loading its GGUF
    if not args.model:
        ap.error("a model path is needed (or --smoke)")
    layout_dir = args.layout_dir or str(Path(tmp.name) / "layouts")
    engines = [("goinfer", False, True)]
    res = {
        "benchmark": "memory",
        "regime": regime.header(args.threads, argv=argv, peer_name="llama.cpp"),
        "model": regime.model(args.model),
        "prefill": args.prefill,
        "decode": args.decode,
        "repeats": args.repeats,
        "one_process_per_run": True,
        "runs": {},
    }
    if args.no_llama_cpp:
        peer = "skipped (--no-llama-cpp)"
    elif not res["regime"]["peer"]["installed"]:
        peer = "skipped (llama-cpp-python is not installed)"
    else:
        sides = {"on": [True], "off": [False], "both": [False, True]}
        engines += [
            ("llama.cpp", fa, mm)
            for mm in sides[args.llama_mmap][::-1]
            for fa in sides[args.flash_attn]
        ]
        peer = f"llama-cpp-python {res['regime']['peer']['version']}"
    print(
        f"{Path(args.model).name}: prefill {args.prefill} + decode {args.decode}, "
        f"{args.threads} threads; llama.cpp: {peer}",
        flush=True,
    )

    def label(eng: str, fa: bool, mm: bool) -> str:
        return eng + (" + flash attention" if fa else "") + ("" if mm else ", no mmap")

    if not args.no_first_load:
        first = run_child("goinfer", args.model, args, False, layout_dir)
        res["goinfer_first_load"] = first
        print(
            f"goinfer first load ({first['source']}): {first['load_s']:.2f} s, peak RSS "
            f"{_gb(first['peak_rss'])} GB",
            flush=True,
        )
    for _ in range(args.repeats):
        for eng, fa, mm in engines:
            r = run_child(eng, args.model, args, fa, layout_dir, mm)
            res["runs"].setdefault(label(eng, fa, mm), []).append(r)
            print(
                f"  {label(eng, fa, mm)}: load {r['load_s']:.2f} s ({r['source']}), RSS after load "
                f"{_gb(r['rss_load'])} GB, peak {_gb(r['peak_rss'])} GB (anon {_gb(r['anon_end'] or 0)}"
                f" + file {_gb(r['file_end'] or 0)} at the end)",
                flush=True,
            )
    med = {
        k: {
            f: statistics.median(r[f] for r in v)
            for f in (
                "load_s",
                "rss_load",
                "peak_rss",
                "prefill_s",
                "prefill_tok_s",
                "decode_tok_s",
            )
        }
        for k, v in res["runs"].items()
    }
    res["median"] = med
    print(table(res))
    tmp.cleanup()
    return regime.finish(res, args.json)


def table(res) -> str:
    med = res["median"]
    r0 = res["regime"]
    lines = [
        f"{res['model']['file']}, {r0['threads']} threads, prefill {res['prefill']} + decode "
        f"{res['decode']}, medians of {res['repeats']} fresh processes, {r0['date']}, load "
        f"{r0['load_avg_start'][0]:.1f}",
        "",
        "| engine | load s | first prefill s | RSS after load GB | peak RSS GB | peak / llama.cpp's lowest |",
        "|---|---|---|---|---|---|",
    ]
    peers = [v["peak_rss"] for k, v in med.items() if k != "goinfer"]
    best = min(peers) if peers else None
    f = res.get("goinfer_first_load")
    if f:
        ratio = f"{f['peak_rss'] / best:.2f}x" if best else ""
        lines.append(
            f"| goinfer, first load ({f['source']}) | {f['load_s']:.2f} | {f['prefill_s']:.3f} | "
            f"{_gb(f['rss_load'])} | {_gb(f['peak_rss'])} | {ratio} |"
        )
    for k, v in med.items():
        ratio = f"{v['peak_rss'] / best:.2f}x" if best else ""
        lines.append(
            f"| {k} | {v['load_s']:.2f} | {v['prefill_s']:.3f} | {_gb(v['rss_load'])} | "
            f"{_gb(v['peak_rss'])} | {ratio} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
