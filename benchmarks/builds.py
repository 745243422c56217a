"""Two builds of goinfer side by side: decode speed and the per-token fixed cost.

    python benchmarks/builds.py DIR_A DIR_B [--labels A B] [--threads 2] [--rounds 9]
        [--tokens 64] [--callgrind] [--json out.json]
    python benchmarks/builds.py --smoke      # the test suite's run: this goinfer against itself

Each DIR holds one build of the goinfer package (an unpacked wheel, or `pip install --target
DIR --no-deps WHEEL`); every run is a fresh process with PYTHONPATH=DIR, started inside DIR
(not a source tree), so the two builds never share a process.  Made to decide whether the
limited-API (abi3) wheel costs anything against the per-version one (the kernels are the same
C; only the Cython glue differs): docs/benchmarks.md, "Release wheel: abi3".

decode   SmolLM2-135M (goinfer.hub.resolve("smollm2-135m")), greedy decode of --tokens steps
         after a 64-token prompt, graph replay on (the default) and off (the Python forward,
         ~18 Cython kernel calls per layer); runs alternate A, B, A, B, ... and medians of
         --rounds runs are reported with their spread (min-max) and the load average.
callgrind  instructions of one decode step (valgrind callgrind, one thread): the whole
         process for 68 minus 4 decode steps on the 30-layer tiny llama of
         benchmarks/decode_fixed_cost.py, divided by 64, graph on and off.  Load-independent.
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

import regime  # benchmarks/ is on sys.path when run as a script

HERE = Path(__file__).resolve().parent

DECODE_CHILD = r"""
import json, sys, time
import numpy as np
import goinfer
from goinfer import hub
from goinfer.bench import prompt_ids
threads, tokens, graph, path = int(sys.argv[1]), int(sys.argv[2]), bool(int(sys.argv[3])), sys.argv[4]
m = goinfer.Model.load(path or hub.resolve("smollm2-135m", progress=False), threads=threads,
                       progress=False, graph=graph)
ids = prompt_ids(m, 64)
s = m.session(goinfer.KVCache(m, max_tokens=64 + tokens + 16))
logits = s.decode(int(np.argmax(s.prefill(ids))))  # warm-up step (captures the graph)
t0 = time.perf_counter()
for _ in range(tokens):
    logits = s.decode(int(np.argmax(logits)))
dt = (time.perf_counter() - t0) / tokens
print(json.dumps({"ms_per_token": dt * 1e3, "config": goinfer.config(),
                  "kernels": sys.modules["goinfer._kernels.matmul"].__file__.rsplit("/", 1)[-1]}))
"""


def _env(build: str, threads: int | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(Path(build).resolve()))
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def decode(builds: list[str], threads: int, tokens: int, rounds: int, model: str = "") -> dict:
    """ms/token per build and graph setting, alternating builds within each round."""
    runs: dict[str, list[float]] = {}
    facts: dict[str, dict] = {}
    loads = [os.getloadavg()[0]]
    for _ in range(rounds):
        for graph in (1, 0):
            for i, b in enumerate(builds):
                out = subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        DECODE_CHILD,
                        str(threads),
                        str(tokens),
                        str(graph),
                        model,
                    ],
                    env=_env(b),
                    cwd=b,
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                r = json.loads(out.strip().splitlines()[-1])
                key = f"{i}/graph={graph}"
                runs.setdefault(key, []).append(r["ms_per_token"])
                facts[str(i)] = {"config": r["config"], "kernels": r["kernels"]}
        loads.append(os.getloadavg()[0])
    return {"runs_ms_per_token": runs, "facts": facts, "load_average": loads}


STEPS = (4, 68)  # decode steps of the two counted runs; their difference is 64 steps


def _steps_cmd(model: str, graph: int, n: int) -> list[str]:
    return [
        sys.executable,
        str(HERE / "decode_fixed_cost.py"),
        "steps",
        model,
        "--graph",
        str(graph),
        "--n",
        str(n),
    ]


def _instructions(build: str, env: dict, model: str, graph: int, n: int) -> int:
    """Instructions of the whole process under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "cg.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                *_steps_cmd(model, graph, n),
            ],
            env=env,
            cwd=build,
            check=True,
            capture_output=True,
        )
        for line in out.read_text().splitlines():
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    raise RuntimeError("callgrind wrote no summary")


def callgrind(builds: list[str]) -> dict:
    """Instructions per decode step, graph on and off, per build: one thread, PYTHONHASHSEED
    fixed, and the model's layout cache (goinfer/layout.py) written by an uncounted run first,
    so every counted run loads the same way."""
    with tempfile.TemporaryDirectory() as tmp:
        model = str(Path(tmp) / "t30.gguf")
        subprocess.run(
            [sys.executable, str(HERE / "decode_fixed_cost.py"), "write-tiny", model],
            env=_env(builds[0]),
            check=True,
            capture_output=True,
        )
        res = {}
        for i, b in enumerate(builds):
            env = dict(_env(b, threads=1), PYTHONHASHSEED="0", GOINFER_LAYOUT_DIR=tmp)
            subprocess.run(_steps_cmd(model, 1, 1), env=env, cwd=b, check=True, capture_output=True)
            # uncounted: the first run under callgrind counted ~100M more instructions than the
            # same command after it (once per invocation; not explained), so it is thrown away
            _instructions(b, env, model, 1, 1)
            for graph in (1, 0):
                lo, hi = (_instructions(b, env, model, graph, n) for n in STEPS)
                res[f"{i}/graph={graph}"] = (hi - lo) / (STEPS[1] - STEPS[0])
    return res


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("builds", nargs="*", help="two directories, each holding a goinfer package")
    ap.add_argument("--labels", nargs=2, default=["A", "B"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--callgrind", action="store_true", help="also count instructions per step")
    regime.add_json_arg(ap)
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the environment's goinfer against itself, tiny shape, one short run",
    )
    a = ap.parse_args(argv)
    reg = regime.header(a.threads, argv=argv)
    model, tmp = "", None
    if a.smoke:
        from shapes import smoke_model  # benchmarks/ is on sys.path when run as a script

        import goinfer

        tmp = tempfile.TemporaryDirectory()
        model = str(smoke_model(tmp.name))
        here = str(Path(goinfer.__file__).parent.parent)
        a.builds, a.threads, a.tokens, a.rounds, a.callgrind = [here, here], 1, 2, 1, False
    elif len(a.builds) != 2:
        ap.error("give two build directories (or --smoke)")
    d = decode(a.builds, a.threads, a.tokens, a.rounds, model)  # --rounds 0: callgrind only
    if not d["facts"]:
        cfg = [
            json.loads(
                subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        "import goinfer, json, sys; print(json.dumps([goinfer.config(), "
                        "sys.modules['goinfer._kernels.matmul'].__file__.rsplit('/', 1)[-1]]))",
                    ],
                    env=_env(b),
                    cwd=b,
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
            )
            for b in a.builds
        ]
        d["facts"] = {str(i): {"config": c, "kernels": k} for i, (c, k) in enumerate(cfg)}
    first = d["facts"]["0"]["config"]
    res = {
        "benchmark": "builds",
        "regime": reg,
        "variant": first["kernel_variant"],
        "python": first["python"],
        "model": (
            "tiny shape (--smoke)" if a.smoke else "smollm2-135m (SmolLM2-135M-Instruct Q4_1)"
        )
        + ", 64-token prompt",
        "threads": a.threads,
        "tokens": a.tokens,
        "rounds": a.rounds,
        "builds": {lab: d["facts"][str(i)]["kernels"] for i, lab in enumerate(a.labels)},
        "load_average": [round(x, 2) for x in d["load_average"]],
        "medians": {},
        "spread": {},
    }
    for key, v in d["runs_ms_per_token"].items():
        i, graph = key.split("/")
        name = f"{a.labels[int(i)]}/{graph}"
        res["medians"][f"{name} ms/token"] = round(statistics.median(v), 3)
        res["medians"][f"{name} tok/s"] = round(1e3 / statistics.median(v), 1)
        res["spread"][f"{name} ms/token"] = [round(min(v), 3), round(max(v), 3)]
    for graph in (1, 0) if a.rounds else ():  # B/A within each round: load drift cancels
        ra, rb = (d["runs_ms_per_token"][f"{i}/graph={graph}"] for i in (0, 1))
        ratios = [y / x for x, y in zip(ra, rb)]
        res["medians"][f"{a.labels[1]}/{a.labels[0]} graph={graph} paired ms/token ratio"] = round(
            statistics.median(ratios), 4
        )
        res["spread"][f"{a.labels[1]}/{a.labels[0]} graph={graph} paired ms/token ratio"] = [
            round(min(ratios), 4),
            round(max(ratios), 4),
        ]
    if a.callgrind:
        cg = callgrind(a.builds)
        res["callgrind_instructions_per_step"] = {
            f"{a.labels[int(k.split('/')[0])]}/{k.split('/')[1]}": round(v) for k, v in cg.items()
        }
    print(json.dumps(res, indent=1))
    return regime.finish(res, a.json)


if __name__ == "__main__":
    main()
