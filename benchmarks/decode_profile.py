"""Where a decode step's time goes: every op of the replayed graph timed, per kernel and weight.

    python benchmarks/decode_profile.py MODEL [--prompt 64] [--steps 64] [--threads 2]
        [--json out.json]
    python benchmarks/decode_profile.py --smoke     # the tiny shape, a few steps (the test suite)

One session prefills --prompt tokens and decodes a few steps (the plan's capture), then the
plan's ops are timed over --steps greedy decode steps (goinfer._kernels.graph.Graph.profile:
two clock readings per share and per barrier, so a timed step runs a little slower than an
untimed one).  Reported per step:
  wall        Session.decode's time (the mean over the steps);
  graph       the time inside the replayed graph: every op's run and barrier-wait time
              summed over the threads, divided by the threads;
  outside     wall - graph: Python (the step's inputs, the cache's bookkeeping), the
              logits' copy, the parallel region's start and end;
and per kernel, a matmul per weight kind and shape (n_out x n_in): its ops per step, their
run and wait ms per step (summed over the threads, divided by them: the part of a step they
take), and for a matmul the weight bytes it streams per step and the rate it read them at
(bytes over its run time over the threads), beside the machine's read bandwidth
(limits.read_bandwidth, the same threads, just before and after the steps).  Waiting includes
warming (GOINFER_GEMV_WARM): a waiting thread prefetches the next matmul's first bytes.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import tempfile
import time

import numpy as np
import regime

from goinfer import KVCache, hub
from goinfer._kernels import _config
from goinfer.bench import prompt_ids
from goinfer.model import Model


def profile_steps(model, prompt: int, steps: int) -> dict:
    """Time `steps` replayed decode steps after a prefill of `prompt` tokens."""
    s = model.session(KVCache(model, max_tokens=prompt + steps + 16))
    logits = s.prefill(prompt_ids(model, prompt))
    for _ in range(2):  # the first decode step captures the plan
        logits = s.decode(int(np.argmax(logits)))
    if model.graph is None:
        raise SystemExit(f"{model.name}: its decode steps are not replayed (no graph to time)")
    (plan,) = model.graph.plans(s.cache)[-1:]
    plan.graph.start_profile()
    wall = []
    for _ in range(steps):
        t0 = time.perf_counter()
        logits = s.decode(int(np.argmax(logits)))
        wall.append(time.perf_counter() - t0)
    prof = plan.graph.profile()
    plan.graph.stop_profile()
    if prof["runs"] != steps or model.graph.plans(s.cache)[-1] is not plan:
        raise SystemExit("the plan was rebuilt during the timed steps; time fewer steps")
    return {"plan": plan, "prof": prof, "wall_s": wall}


def table(plan, prof: dict, wall: list[float]) -> dict:
    """Per-step figures from one plan's profile (see the module doc)."""
    runs, T = prof["runs"], plan.graph.threads
    per = lambda ns: ns / runs / T / 1e6  # noqa: E731  (ms of a step)
    groups: dict = collections.OrderedDict()
    for op, run_ns, wait_ns in zip(plan.op_table(), prof["run_ns"], prof["wait_ns"]):
        key = op["name"] if op["weight"] is None else f"{op['name']} {op['weight']}"
        g = groups.setdefault(key, {"kernel": key, "ops": 0, "run": 0, "wait": 0, "bytes": 0})
        g["ops"] += 1
        g["run"] += int(run_ns)
        g["wait"] += int(wait_ns)
        g["bytes"] += op["weight_bytes"]
    rows = []
    for g in groups.values():
        row = {
            "kernel": g["kernel"],
            "ops_per_step": g["ops"],
            "run_ms": per(g["run"]),
            "wait_ms": per(g["wait"]),
        }
        if g["bytes"]:
            row["weight_bytes_per_step"] = g["bytes"]
            row["read_GBs"] = g["bytes"] * runs * T / g["run"] if g["run"] else None
        rows.append(row)
    rows.sort(key=lambda r: -(r["run_ms"] + r["wait_ms"]))
    run_all, wait_all = int(prof["run_ns"].sum()), int(prof["wait_ns"].sum())
    mm = [g for g in groups.values() if g["bytes"]]
    mm_bytes, mm_run = sum(g["bytes"] for g in mm), sum(g["run"] for g in mm)
    wall_ms = statistics.mean(wall) * 1e3
    graph_ms = per(run_all + wait_all)
    return {
        "threads": T,
        "steps": runs,
        "wall_ms": wall_ms,
        "wall_ms_median": statistics.median(wall) * 1e3,
        "graph_ms": graph_ms,
        "outside_ms": wall_ms - graph_ms,
        "run_ms": per(run_all),
        "wait_ms": per(wait_all),
        "matmul_run_ms": per(mm_run),
        "matmul_bytes_per_step": mm_bytes,
        "matmul_read_GBs": mm_bytes * runs * T / mm_run if mm_run else None,
        "matmul_bytes_over_wall_GBs": mm_bytes / (wall_ms * 1e6),
        "rows": rows,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="tiny model, a few steps (the test suite)")
    regime.add_json_arg(ap)
    a = ap.parse_args(argv)
    tmp = tempfile.TemporaryDirectory()
    bw_bytes = None
    if a.smoke:
        from shapes import smoke_model

        a.model, a.prompt, a.steps, bw_bytes = str(smoke_model(tmp.name)), 16, 8, 16 << 20
    import limits

    path = str(hub.resolve(a.model, progress=False))
    hdr = regime.header(a.threads, argv=argv)
    model = Model.load(
        path, threads=a.threads, context_length=a.prompt + a.steps + 32, progress=False
    )
    bw = [limits.read_bandwidth(a.threads, n_bytes=bw_bytes, reps=3)["GBs"]]
    got = profile_steps(model, a.prompt, a.steps)
    bw.append(limits.read_bandwidth(a.threads, n_bytes=bw_bytes, reps=3)["GBs"])
    t = table(got["plan"], got["prof"], got["wall_s"])
    bw_mean = statistics.mean(bw)
    print(
        f"{model.name}: {a.steps} decode steps after {a.prompt} tokens, variant "
        f"{_config.variant()}, {t['threads']} threads; read bandwidth {bw[0]:.1f} / {bw[1]:.1f} "
        f"GB/s (before / after)"
    )
    print(
        f"per step: wall {t['wall_ms']:.2f} ms, in the graph {t['graph_ms']:.2f} (ops "
        f"{t['run_ms']:.2f}, waiting {t['wait_ms']:.2f}), outside {t['outside_ms']:.2f}; "
        f"matmuls {t['matmul_run_ms']:.2f} ms for {t['matmul_bytes_per_step'] / 1e6:.1f} MB: "
        f"{t['matmul_read_GBs'] or 0:.1f} GB/s while they run "
        f"({(t['matmul_read_GBs'] or 0) / bw_mean:.0%} of the bandwidth), "
        f"{t['matmul_bytes_over_wall_GBs']:.1f} GB/s over the wall time "
        f"({t['matmul_bytes_over_wall_GBs'] / bw_mean:.0%})"
    )
    print(f"{'kernel':40s} {'ops':>4s} {'run ms':>8s} {'wait ms':>8s} {'MB':>8s} {'GB/s':>6s}")
    for r in t["rows"]:
        mb = r.get("weight_bytes_per_step", 0) / 1e6
        gbs = r.get("read_GBs") or 0
        print(
            f"{r['kernel']:40s} {r['ops_per_step']:4d} {r['run_ms']:8.3f} {r['wait_ms']:8.3f} "
            + (f"{mb:8.2f} {gbs:6.1f}" if mb else "")
        )
    impl = model.impl
    res = {
        "benchmark": "decode_profile",
        # the matrices a decode step streams, from the model (the LM head; not an untied
        # embedding table, read a row at a time): what the matmul rows' bytes add up to
        "model_matrix_bytes": sum(w.nbytes for w in impl.weights())
        - (impl.tok_embd.nbytes if impl.lm_head is not impl.tok_embd else 0),
        "regime": hdr,
        "model": regime.model(path),
        "variant": _config.variant(),
        "prompt_tokens": a.prompt,
        "read_bandwidth_GBs": bw,
        **t,
    }
    tmp.cleanup()
    return regime.finish(res, a.json)


if __name__ == "__main__":
    main()
