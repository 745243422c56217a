"""Server under load: 1, 2, 4 and 8 concurrent streaming clients against `goinfer serve`,
batched (--max-batch 8) versus one request at a time (--max-batch 1).

    PYTHONPATH=. python benchmarks/server_load.py --model smollm2-135m --threads 1

Each client sends --requests chat requests one after another: a shared ~200-token system
prompt (reused from the prefix cache after the first request, as an agent resends its context)
plus a question of its own, greedy, end-of-turn banned so every reply is --max-tokens long.
Both servers run at once and the modes alternate, which goes first swapping level by level
(the machine is shared: its load drifts).  Per level: aggregate completion tok/s (all tokens / wall time), and p50 / p99
of time to first token and of request latency, measured by the client.  Prints a Markdown
table and writes JSON with every request's numbers.  --smoke: the tiny shape
(benchmarks/shapes.py), one client, one short request per mode (the test suite).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import regime

from goinfer.server.cli import Client, free_port

SYSTEM = (
    "You are a coding agent working in a large repository. You can read files, run tests "
    "and edit code. Always explain what you are about to do in one short sentence, then "
    "do it. Keep answers short. The repository contains a Python package with a C "
    "extension, a test suite that takes about a minute, benchmarks and documentation. "
    "When a test fails, read the failure, find the smallest change that fixes it and run "
    "the tests again. Never delete tests. Prefer plain names and small functions. "
    "Report what you changed and why at the end of every turn."
)
QUESTIONS = [
    "How do I list the files of the project?",
    "What does a failing test tell me?",
    "Name two ways to speed up a Python loop.",
    "What is a KV cache?",
    "Why do agents resend their whole context?",
    "What is continuous batching?",
    "How should I name a helper that parses dates?",
    "When is a benchmark honest?",
]


def start_server(model: str, max_batch: int, threads: int | None, extra: list[str]):
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "goinfer.cli",
        "serve",
        model,
        "--port",
        str(port),
        "--max-batch",
        str(max_batch),
        "--log-level",
        "warning",
    ] + extra
    if threads:
        cmd += ["--threads", str(threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server did not start")


def model_path(model: str) -> Path:
    """The GGUF a registered name or a path stands for."""
    from goinfer import hub

    return Path(hub.resolve(model, progress=False))


def stop_ids(model: str) -> list[int]:
    from goinfer.gguf import GGUFFile
    from goinfer.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(GGUFFile(model_path(model)).metadata)
    return sorted(tok.stop_ids)


def run_level(url: str, clients: int, requests: int, max_tokens: int, ban: list[int]) -> dict:
    c = Client(url, None)
    recs: list[dict] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        for k in range(requests):
            q = QUESTIONS[(i * requests + k) % len(QUESTIONS)]
            body = {
                "model": "m",
                "max_tokens": max_tokens,
                "temperature": 0,
                "logit_bias": {str(t): -100 for t in ban},
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"(client {i}, turn {k}) {q}"},
                ],
            }
            s = c.stream("/chat/completions", body)
            u = s["usage"] or {}
            with lock:
                recs.append(
                    {
                        "client": i,
                        "ttft_s": s["ttft_s"],
                        "latency_s": s["total_s"],
                        "completion_tokens": u.get("completion_tokens", 0),
                        "prompt_tokens": u.get("prompt_tokens", 0),
                        "cached_tokens": (u.get("prompt_tokens_details") or {}).get(
                            "cached_tokens", 0
                        ),
                    }
                )

    t0 = time.perf_counter()
    ths = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    wall = time.perf_counter() - t0
    return {
        "clients": clients,
        "wall_s": wall,
        "requests": recs,
        "tok_s": sum(r["completion_tokens"] for r in recs) / wall,
    }


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--levels", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=3, help="requests per client per level")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--batch", type=int, default=8, help="--max-batch of the batched server")
    ap.add_argument("server_args", nargs="*", help="extra `goinfer serve` arguments (after --)")
    ap.add_argument("--smoke", action="store_true", help="tiny model, one request (the test suite)")
    regime.add_json_arg(ap)
    args = ap.parse_args(argv)
    import tempfile

    tmp = tempfile.TemporaryDirectory()
    if args.smoke:
        from shapes import smoke_model

        args.model = str(smoke_model(tmp.name))
        args.levels, args.requests, args.max_tokens, args.threads = "1", 1, 2, 1
    levels = [int(x) for x in args.levels.split(",")]
    ban = stop_ids(args.model)
    modes = {"batched": args.batch, "one at a time": 1}
    servers = {}
    try:
        for name, mb in modes.items():
            servers[name] = start_server(args.model, mb, args.threads, args.server_args)
            run_level(servers[name][1], 1, 1, 4, ban)  # warm up: load, prefix cache
        hdr = regime.header(args.threads, argv=argv)
        results = {name: [] for name in modes}
        for i, n in enumerate(levels):
            order = list(modes) if i % 2 == 0 else list(modes)[::-1]  # no order bias
            for name in order:
                r = run_level(servers[name][1], n, args.requests, args.max_tokens, ban)
                results[name].append(r)
                ttft = [x["ttft_s"] for x in r["requests"] if x["ttft_s"] is not None]
                print(
                    f"{name:>14} clients={n}: {r['tok_s']:.1f} tok/s, TTFT p50 "
                    f"{pct(ttft, 50) * 1e3:.0f} ms, load {os.getloadavg()[0]:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    if "OMP_WAIT_POLICY" in os.environ:
        hdr["command"] = f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']} {hdr['command']}"
    res = {
        "benchmark": "server_load",
        "regime": hdr,
        "model": regime.model(model_path(args.model)),
        "settings": {
            "levels": levels,
            "max_tokens": args.max_tokens,
            "requests_per_client": args.requests,
            "batch": args.batch,
        },
        "results": results,
    }
    regime.finish(res, None)
    lines = [
        "| mode | clients | requests | aggregate tok/s | TTFT p50 ms | TTFT p99 ms | "
        "latency p50 ms | latency p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, n in enumerate(levels):
        for name in modes:
            r = results[name][i]
            ttft = [x["ttft_s"] * 1e3 for x in r["requests"] if x["ttft_s"] is not None]
            lat = [x["latency_s"] * 1e3 for x in r["requests"]]
            lines.append(
                f"| {name} | {n} | {len(r['requests'])} | {r['tok_s']:.1f} | "
                f"{pct(ttft, 50):.0f} | {pct(ttft, 99):.0f} | {pct(lat, 50):.0f} | "
                f"{pct(lat, 99):.0f} |"
            )
    print("\n".join(lines))
    lb, la = hdr["load_avg_start"], hdr["load_avg_end"]
    print(
        f"\n{hdr['date']}, {hdr['machine']['model_name']}, load average before "
        f"{lb[0]:.1f}/{lb[1]:.1f}/{lb[2]:.1f}, after {la[0]:.1f}/{la[1]:.1f}/{la[2]:.1f}; "
        f"`{hdr['command']}`"
    )
    tmp.cleanup()
    return regime.finish(res, args.json)


if __name__ == "__main__":
    main()
