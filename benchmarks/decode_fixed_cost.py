"""Per-token fixed cost of decode: the Python forward path vs graph replay (goinfer/graph.py).

    PYTHONPATH=. python benchmarks/decode_fixed_cost.py tiny             # 30-layer tiny llama
    PYTHONPATH=. python benchmarks/decode_fixed_cost.py smollm2 --ctx 64 2048
    PYTHONPATH=. python benchmarks/decode_fixed_cost.py smollm2 --ctx 64 --busy 2
    PYTHONPATH=. python benchmarks/decode_fixed_cost.py --smoke          # the test suite's run

Instruction counts (load-independent): write the tiny model once, then count N steps under
callgrind with and without the graph; (I(36) - I(4)) / 32 is the cost of one step:

    PYTHONPATH=. python benchmarks/decode_fixed_cost.py write-tiny t30.gguf
    OMP_NUM_THREADS=1 valgrind --tool=callgrind python benchmarks/decode_fixed_cost.py \
        steps t30.gguf --graph 1 --n 36

Runs alternate between the two paths (python, graph, python, graph, ...) and medians are
reported, so a change of machine load hits both alike.  --busy N starts N busy-loop processes
for the duration (an artificial load; they are stopped at the end).  Prints the load average
next to the numbers.  The tiny model is benchmarks/shapes.py's tiny shape with 30 layers
(d_model 64, 4 heads / 2 KV heads, FFN 128, vocabulary 512, random F32 weights): the kernels'
own work is small, so the time per token is the fixed cost.  Each row records the steps the
graph replayed (goinfer.graph's counter) and that the Python path has no graph.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import regime

from goinfer import KVCache, hub
from goinfer.gguf import GGUFFile
from goinfer.model import Model


def tiny_model_path(out: str) -> Path:
    """The 30-layer tiny llama (F32 weights) written by benchmarks/shapes.py into out."""
    import shapes

    shape = dataclasses.replace(shapes.SHAPES["tiny"], name="tiny-30L", n_layers=30)
    return shapes.make(shape, "F32", Path(out), pure=True, vocab="bytes", log=None)


def measure(path, threads: int, ctx: int, n: int, reps: int) -> dict:
    """ms/token of n greedy decode steps after a ctx-token prompt, per path, reps alternating runs."""
    ids = (list(range(100, 1100)) * (ctx // 1000 + 1))[:ctx]
    models = {
        g: Model(GGUFFile(path), threads=threads, progress=False, graph=g) for g in (False, True)
    }
    caches = {g: KVCache(m, max_tokens=ctx + n + 64) for g, m in models.items()}
    res = {False: [], True: []}
    for _ in range(reps):
        for g, m in models.items():
            s = m.session(caches[g])  # the prompt comes from the prefix cache after the first run
            lg = s.prefill(ids)
            t0 = time.perf_counter()
            for _ in range(n):
                lg = s.decode(int(np.argmax(lg)))
            res[g].append((time.perf_counter() - t0) / n * 1e3)
            s.reset()
    return {
        "python": res[False],
        "graph": res[True],
        "graph_replays": models[True].graph.replays,
        "python_path_has_graph": models[False].graph is not None,
    }


def steps(path, graph: bool, n: int) -> None:
    """Load, prefill 64 tokens, decode 1 (the plan's capture), then n more decode steps."""
    m = Model(GGUFFile(path), threads=1, progress=False, graph=graph)
    s = m.session(KVCache(m, max_tokens=300))
    s.prefill(list(range(64)))
    lg = s.decode(1)
    for _ in range(n):
        lg = s.decode(int(np.argmax(lg)))


def main(argv=None) -> dict | None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["write-tiny"]:
        import shutil

        with tempfile.TemporaryDirectory() as d:
            shutil.copy(tiny_model_path(d), argv[1])
        return None
    if argv[:1] == ["steps"]:
        ap = argparse.ArgumentParser()
        ap.add_argument("cmd")
        ap.add_argument("path")
        ap.add_argument("--graph", type=int, default=1)
        ap.add_argument("--n", type=int, default=36)
        a = ap.parse_args(argv)
        steps(a.path, bool(a.graph), a.n)
        return None
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", choices=["tiny", "smollm2"], default="tiny")
    ap.add_argument("--ctx", type=int, nargs="+", default=[64])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--busy", type=int, default=0, help="busy-loop processes to run meanwhile")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the 2-layer tiny shape of benchmarks/shapes.py, one short run (the test suite)",
    )
    regime.add_json_arg(ap)
    a = ap.parse_args(argv)
    tmp = tempfile.TemporaryDirectory()
    if a.smoke:
        from shapes import smoke_model

        path = smoke_model(tmp.name)
        a.ctx, a.threads, a.tokens, a.reps, a.busy = [64], [1], 4, 1, 0
    else:
        path = (
            tiny_model_path(tmp.name)
            if a.model == "tiny"
            else hub.resolve("smollm2-135m", progress=False)
        )
    res = {
        "benchmark": "decode_fixed_cost",
        "regime": regime.header(None, argv=argv),
        "model": regime.model(path),
        "busy": a.busy,
        "tokens": a.tokens,
        "reps": a.reps,
        "rows": [],
    }
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
    try:
        for ctx in a.ctx:
            for th in a.threads:
                r = measure(path, th, ctx, a.tokens, a.reps)
                py, gr = statistics.median(r["python"]), statistics.median(r["graph"])
                res["rows"].append(
                    {
                        "context": ctx,
                        "threads": th,
                        "python_ms_per_token": py,
                        "graph_ms_per_token": gr,
                        "ratio": py / gr,
                        "runs_python_ms": r["python"],
                        "runs_graph_ms": r["graph"],
                        "graph_replays": r["graph_replays"],
                        "python_path_has_graph": r["python_path_has_graph"],
                    }
                )
                print(
                    f"{a.model} ctx {ctx} threads {th} busy {a.busy}: python {py:.3f} ms/token, "
                    f"graph {gr:.3f} ms/token ({py / gr:.2f}x); min {min(r['python']):.3f} / "
                    f"{min(r['graph']):.3f}; graph replays {r['graph_replays']}",
                    flush=True,
                )
    finally:
        for p in busy:
            p.kill()
            p.wait()
    tmp.cleanup()
    return regime.finish(res, a.json)


if __name__ == "__main__":
    main()
