"""Mixture-of-Experts benchmark on an upcycled SmolLM2-135M (4 identical experts, top-2).

    PYTHONPATH=. python benchmarks/moe.py [--threads 1 2] [--sizes 512 2048] [--repeats 3]
                                          [--decode 64] [--model PATH_TO_Q4_1_GGUF]
    PYTHONPATH=. python benchmarks/moe.py --smoke     # the tiny shape upcycled (the test suite)

The MoE model is made by tools/upcycle_moe.py (run as its command line) from the
SmolLM2-135M-Instruct Q4_1 GGUF (every
FFN -> 4 copies behind a random router, top-2, renormalized weights: the same function as the
dense model, twice its FFN work per token).  For each thread count it measures
  prefill tok/s at each size, expert-major (each expert one GEMM over its rows) vs
    token-by-token (each (token, expert) pair its own GEMV), and the dense model;
    each run a fresh KV cache (no prefix reuse), exact attention, logits of the last token;
    runs alternate between the modes; the median of --repeats runs is shown;
  decode tok/s (greedy steps after a 64-token prompt), MoE and dense;
  bytes of weights the matmuls read per decoded token (counted per call: every matmul reads
    its whole weight once), MoE and dense.
It prints a Markdown table and the machine, date and load (uptime) before and after.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import regime

from goinfer import KVCache, Model, hub
from goinfer.bench import prefill_seconds

ROOT = Path(__file__).resolve().parents[1]


def upcycle(dense: Path, out: Path, n_expert: int, top_k: int, seed: int = 0) -> Path:
    """tools/upcycle_moe.py, run as its command line."""
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "upcycle_moe.py"),
            str(dense),
            str(out),
            "--experts",
            str(n_expert),
            "--top-k",
            str(top_k),
            "--seed",
            str(seed),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return out


class CountingKernels:
    """Wraps a kernels module: adds up the bytes of every weight a matmul call reads."""

    def __init__(self, inner):
        self._inner = inner
        self.bytes = 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def matmul(self, x, w, *a, **kw):
        self.bytes += w.nbytes
        return self._inner.matmul(x, w, *a, **kw)

    def matmul_experts(self, x, ws, offsets, *a, **kw):
        """one call for every expert of a layer: the experts given rows read their weights"""
        self.bytes += sum(w.nbytes for w, n in zip(ws, np.diff(offsets)) if n > 0)
        return self._inner.matmul_experts(x, ws, offsets, *a, **kw)


def decode_stats(m: Model, prompt, n: int):
    """(decode tok/s, weight bytes read per decoded token) over n greedy steps."""
    s = m.session(KVCache(m, max_tokens=len(prompt) + n + 16))
    logits = s.prefill(prompt)
    tok = int(np.argmax(logits))
    t0 = time.perf_counter()
    for _ in range(n):
        tok = int(np.argmax(s.decode(tok)))
    dt = time.perf_counter() - t0
    counter = CountingKernels(m.impl.ops)
    m.impl.ops = counter
    try:
        s.decode(tok)
    finally:
        m.impl.ops = counter._inner
    return n / dt, counter.bytes


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--sizes", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode", type=int, default=64, help="decode steps to time")
    ap.add_argument("--model", default=None, help="dense SmolLM2 Q4_1 GGUF (default: the hub's)")
    ap.add_argument(
        "--smoke", action="store_true", help="the tiny shape, one short run (the test suite)"
    )
    regime.add_json_arg(ap)
    a = ap.parse_args(argv)
    smoke_dir = tempfile.TemporaryDirectory()
    if a.smoke:
        from shapes import smoke_model

        a.model = str(smoke_model(smoke_dir.name, "Q4_1"))
        a.threads, a.sizes, a.repeats, a.decode = [1], [64], 1, 2
    dense_path = Path(a.model) if a.model else hub.resolve("smollm2-135m", progress=False)
    res = {
        "benchmark": "moe",
        "regime": regime.header(None, argv=argv),
        "model": regime.model(dense_path),
        "experts": 4,
        "top_k": 2,
        "rows": [],
    }
    print(f"# MoE benchmark  {res['regime']['date']} {res['regime']['time_utc']} UTC")
    print(
        f"machine: {res['regime']['machine']['model_name']}; load before: "
        f"{res['regime']['load_avg_start'][0]:.2f}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        moe_path = upcycle(dense_path, Path(tmp) / "smollm2-moe4.gguf", 4, 2, seed=0)
        text = (ROOT / "tests" / "data" / "agreement_text.txt").read_text()
        rows = []
        for nt in a.threads:
            dense = Model.load(str(dense_path), threads=nt, exact=True, progress=False)
            moe = Model.load(
                str(moe_path),
                threads=nt,
                exact=True,
                progress=False,
                context_length=max(a.sizes) + 64,
            )
            base = dense.tokenize(text)
            for n in a.sizes:
                ids = (base * (n // len(base) + 1))[:n]
                times = {"expert-major": [], "token-by-token": [], "dense": []}
                for _ in range(a.repeats):  # alternate the modes
                    moe.impl.moe.expert_major = True
                    times["expert-major"].append(prefill_seconds(moe, ids))
                    moe.impl.moe.expert_major = False
                    times["token-by-token"].append(prefill_seconds(moe, ids))
                    times["dense"].append(prefill_seconds(dense, ids))
                moe.impl.moe.expert_major = True
                for mode, ts in times.items():
                    med = statistics.median(ts)
                    rows.append(
                        (
                            nt,
                            f"prefill {n}",
                            mode,
                            f"{n / med:.0f} tok/s",
                            f"median of {len(ts)}: {med:.2f} s (min {min(ts):.2f})",
                        )
                    )
                    res["rows"].append(
                        {
                            "threads": nt,
                            "what": "prefill",
                            "tokens": n,
                            "mode": mode,
                            "tok_s": n / med,
                            "runs_s": ts,
                        }
                    )
                print(
                    f"  threads {nt}, prefill {n}: "
                    + ", ".join(
                        f"{k} {n / statistics.median(v):.0f} tok/s" for k, v in times.items()
                    ),
                    flush=True,
                )
            prompt = base[:64]
            for name, m in (("MoE (top-2 of 4)", moe), ("dense", dense)):
                tps, nbytes = decode_stats(m, prompt, a.decode)
                res["rows"].append(
                    {
                        "threads": nt,
                        "what": "decode",
                        "tokens": a.decode,
                        "mode": name,
                        "tok_s": tps,
                        "weight_bytes_per_token": nbytes,
                    }
                )
                rows.append(
                    (
                        nt,
                        "decode",
                        name,
                        f"{tps:.1f} tok/s",
                        f"{nbytes / 1e6:.1f} MB of weights read per token",
                    )
                )
                print(
                    f"  threads {nt}, decode {name}: {tps:.1f} tok/s, {nbytes / 1e6:.1f} MB/token",
                    flush=True,
                )
    print()
    print("| threads | what | model / mode | speed | notes |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(x) for x in r) + " |")
    smoke_dir.cleanup()
    return regime.finish(res, a.json)


if __name__ == "__main__":
    main()
