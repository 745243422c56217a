"""How OpenMP's wait policy changes goinfer's speed on a quiet and on a busy machine.

    python benchmarks/wait_policy.py [MODEL] [--threads 2] [--repeats 3]
        [--settings default,passive,spin100,spin1000,spin10000] [--load none,nice19,nice0]
        [--json out.json]

Each setting runs in a fresh process (libgomp reads its environment once, when it loads):
`default` is libgomp's own default (GOMP_SPINCOUNT 300,000 when unset), `goinfer` is whatever
goinfer sets at import (goinfer/_threads.py), `passive` is OMP_WAIT_POLICY=passive, `spinN` is
GOMP_SPINCOUNT=N.  Load: `none`, or one busy-looping process at nice 19 (`nice19`) or at
nice 0 (`nice0`) competing for a core, the way a build or an indexer competes on a user's
machine.  Measured: prefill of 512 tokens (ms) and decode after 64 tokens (ms/token), medians
of --repeats; settings alternate within each load.  --smoke: the tiny shape
(benchmarks/shapes.py), goinfer's setting, no added load, one repeat (the test suite).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import regime

CHILD = r"""
import json, sys, time
import numpy as np
import goinfer
from goinfer.bench import prompt_ids
m = goinfer.Model.load(sys.argv[1], threads=int(sys.argv[2]), progress=False)
ids = prompt_ids(m, 512)
s = m.session(goinfer.KVCache(m, max_tokens=600)); s.prefill(ids[:64])  # warm-up
s = m.session(goinfer.KVCache(m, max_tokens=600))
t0 = time.perf_counter(); s.prefill(ids); prefill = time.perf_counter() - t0
s = m.session(goinfer.KVCache(m, max_tokens=200)); logits = s.prefill(ids[:64])
t0 = time.perf_counter()
for _ in range(32):
    logits = s.decode(int(np.argmax(logits)))
decode = (time.perf_counter() - t0) / 32
print(json.dumps({"prefill_ms": prefill * 1e3, "decode_ms": decode * 1e3}))
"""

SETTINGS = {
    "default": {"GOINFER_WAIT_POLICY": "libgomp"},
    "goinfer": {},
    "passive": {"OMP_WAIT_POLICY": "passive"},
}


def env_for(name: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "GOINFER_WAIT_POLICY")
    }
    if name.startswith("spin"):
        env["GOMP_SPINCOUNT"] = name[4:]
    else:
        env.update(SETTINGS[name])
    return env


def start_load(kind: str):
    if kind == "none":
        return None
    nice = {"nice19": 19, "nice0": 0}[kind]
    return subprocess.Popen(["nice", "-n", str(nice), sys.executable, "-c", "while True: pass"])


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--settings", default="default,goinfer,passive,spin100,spin1000,spin10000")
    ap.add_argument("--load", default="none,nice19,nice0")
    ap.add_argument("--smoke", action="store_true", help="tiny model, one run (the test suite)")
    regime.add_json_arg(ap)
    a = ap.parse_args(argv)
    import tempfile

    from goinfer import hub

    tmp = tempfile.TemporaryDirectory()
    if a.smoke:
        from shapes import smoke_model

        a.model, a.settings, a.load, a.repeats = str(smoke_model(tmp.name)), "goinfer", "none", 1

    path = str(hub.resolve(a.model, progress=False))
    settings = a.settings.split(",")
    hdr = regime.header(a.threads, argv=argv)
    rows = []
    for load in a.load.split(","):
        runs = {s: [] for s in settings}
        busy = start_load(load)
        try:
            for _ in range(a.repeats):
                for s in settings:
                    out = subprocess.run(
                        [sys.executable, "-c", CHILD, path, str(a.threads)],
                        env=env_for(s),
                        capture_output=True,
                        text=True,
                        check=True,
                        timeout=1800,
                    )
                    runs[s].append(json.loads(out.stdout.strip().splitlines()[-1]))
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
        for s in settings:
            row = {
                "load": load,
                "setting": s,
                "prefill_ms": statistics.median(r["prefill_ms"] for r in runs[s]),
                "decode_ms": statistics.median(r["decode_ms"] for r in runs[s]),
                "runs": runs[s],
            }
            rows.append(row)
            print(
                f"{load:7s} {s:9s} prefill 512: {row['prefill_ms']:8.1f} ms   "
                f"decode: {row['decode_ms']:8.2f} ms/token",
                flush=True,
            )
    res = {
        "benchmark": "wait_policy",
        "regime": hdr,
        "model": regime.model(path),
        "repeats": a.repeats,
        "rows": rows,
    }
    tmp.cleanup()
    return regime.finish(res, a.json)


if __name__ == "__main__":
    main()
