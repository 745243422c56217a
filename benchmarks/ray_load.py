"""goinfer on Ray Serve under multi-turn agents: one replica with all the threads, two replicas
with half the threads each (prefix routing), and two with random routing.

    PYTHONPATH=. python benchmarks/ray_load.py --model smollm2-135m --threads 2

Each agent is one conversation: a system prompt shared by all agents (~200 tokens), a document
of its own (--doc-words words) and a first question, then --turns turns; every turn resends the
whole history (as agents do) and gets a --max-tokens reply (greedy, end of turn banned).  All
agents run at once.  Per configuration, deployed alone on a local Ray instance (or on the one
this process is already connected to): aggregate completion tok/s (all tokens / wall time),
time to first token and latency p50 / p90 as the client sees them, and the prefix hit rate
(cached prompt tokens / prompt tokens, from every response's usage), with requests per replica.
Prints a Markdown table; --json writes every request's numbers.  --smoke: a tiny run for tests.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path

# a local Ray instance keeps its control plane on loopback (Ray's own switch, read at import)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# Serve's proxy must answer its readiness check in 5 s by default (3 misses: killed, and
# serve.start fails): too short on a busy 2-core machine (read when ray.serve is imported)
os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "30")

import regime  # noqa: E402  (benchmarks/ is on sys.path: the script's own directory)
from server_load import QUESTIONS, SYSTEM, pct, stop_ids  # noqa: E402

from goinfer.server.cli import Client, free_port, long_prompt  # noqa: E402

BENCH_APP = "goinfer-bench"


def configs(threads: int) -> list[dict]:
    half = max(1, threads // 2)
    return [
        {"config": "1 replica", "replicas": 1, "threads": threads, "policy": "prefix"},
        {"config": "2 replicas, prefix", "replicas": 2, "threads": half, "policy": "prefix"},
        {"config": "2 replicas, random", "replicas": 2, "threads": half, "policy": "random"},
    ]


def run_agents(
    url: str, agents: int, turns: int, doc_words: int, max_tokens: int, ban: list[int], nonce: str
) -> tuple[float, list[dict]]:
    c = Client(url, None)
    recs: list[dict] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def agent(i: int) -> None:
        doc = long_prompt(doc_words, seed=1000 + i)
        msgs = [
            {"role": "system", "content": SYSTEM},
            {
                "role": "user",
                "content": f"[{nonce} agent {i}] Read this log:\n{doc}\n\n"
                f"{QUESTIONS[i % len(QUESTIONS)]}",
            },
        ]
        try:
            for k in range(turns):
                body = {
                    "model": "m",
                    "messages": msgs,
                    "max_tokens": max_tokens,
                    "temperature": 0,
                    "logit_bias": {str(t): -100 for t in ban},
                }
                s = c.stream("/chat/completions", body)
                u = s["usage"] or {}
                with lock:
                    recs.append(
                        {
                            "agent": i,
                            "turn": k,
                            "replica": s["replica"],
                            "ttft_s": s["ttft_s"],
                            "latency_s": s["total_s"],
                            "prompt_tokens": u.get("prompt_tokens", 0),
                            "completion_tokens": u.get("completion_tokens", 0),
                            "cached_tokens": (u.get("prompt_tokens_details") or {}).get(
                                "cached_tokens", 0
                            ),
                        }
                    )
                msgs = msgs + [
                    {"role": "assistant", "content": s["text"]},
                    {"role": "user", "content": QUESTIONS[(i + k + 1) % len(QUESTIONS)]},
                ]
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    t0 = time.perf_counter()
    ths = [threading.Thread(target=agent, args=(i,)) for i in range(agents)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0, recs


def warm_up(url: str, replicas: int) -> None:
    """First touch of the weights on every replica: concurrent short requests with nothing in
    common, which the router spreads by load."""
    c = Client(url, None)
    ths = [
        threading.Thread(
            target=c.post,
            args=(
                "/chat/completions",
                {"messages": [{"role": "user", "content": f"{i}: warm up"}], "max_tokens": 8},
            ),
        )
        for i in range(2 * replicas)
    ]
    for t in ths:
        t.start()
    for t in ths:
        t.join()


def summarize(cfg: dict, wall: float, recs: list[dict], agents: int, turns: int) -> dict:
    ttft = [r["ttft_s"] * 1e3 for r in recs if r["ttft_s"] is not None]
    lat = [r["latency_s"] * 1e3 for r in recs]
    prompt = sum(r["prompt_tokens"] for r in recs)
    per = Counter(r["replica"] for r in recs)
    return dict(
        cfg,
        agents=agents,
        turns=turns,
        requests=len(recs),
        wall_s=wall,
        tok_s=sum(r["completion_tokens"] for r in recs) / wall,
        ttft_p50_ms=pct(ttft, 50),
        ttft_p90_ms=pct(ttft, 90),
        latency_p50_ms=pct(lat, 50),
        latency_p90_ms=pct(lat, 90),
        hit_rate=sum(r["cached_tokens"] for r in recs) / prompt if prompt else 0.0,
        per_replica=sorted(per.values(), reverse=True),
        records=recs,
    )


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument(
        "--threads",
        type=int,
        default=2,
        help="threads of the one replica; each of two replicas gets half",
    )
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--doc-words", type=int, default=600)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--port", type=int, default=None, help="Serve's HTTP port (default: free)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    regime.add_json_arg(ap)
    args = ap.parse_args(argv)
    if args.smoke:
        args.agents, args.turns, args.doc_words, args.max_tokens = 4, 2, 40, 6
    import ray
    from ray import serve

    from goinfer.server.ray import ReplicaSpec, build_app
    from goinfer.server.routing import Policy

    own = not ray.is_initialized()
    port = args.port
    if own:
        port = port or free_port()
        ray.init(
            num_cpus=max(os.cpu_count() or 1, args.threads),
            include_dashboard=False,
            log_to_driver=False,
        )
        serve.start(http_options={"host": "127.0.0.1", "port": port})
    elif port is None:
        ap.error("--port (Serve's HTTP port) is needed when Ray is already running here")
    ban = stop_ids(args.model)
    rows = []
    hdr = regime.header(args.threads, argv=argv)
    try:
        for i, cfg in enumerate(configs(args.threads)):
            app = build_app(
                ReplicaSpec(args.model),
                cfg["replicas"],
                threads_per_replica=cfg["threads"],
                policy=Policy(cfg["policy"]),
            )
            serve.run(app, name=BENCH_APP, route_prefix=f"/{BENCH_APP}")
            url = f"http://127.0.0.1:{port}/{BENCH_APP}"
            warm_up(url, cfg["replicas"])
            wall, recs = run_agents(
                url, args.agents, args.turns, args.doc_words, args.max_tokens, ban, nonce=f"run {i}"
            )
            serve.delete(BENCH_APP)
            row = summarize(cfg, wall, recs, args.agents, args.turns)
            rows.append(row)
            print(
                f"{cfg['config']:>20}: {row['tok_s']:.1f} tok/s, TTFT p50 "
                f"{row['ttft_p50_ms']:.0f} ms, hit rate {row['hit_rate']:.2f}, load "
                f"{os.getloadavg()[0]:.1f}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        if own:
            serve.shutdown()
            ray.shutdown()
    res = {
        "benchmark": "ray_load",
        "regime": hdr,
        "settings": {
            "model": Path(args.model).name,
            **{k: getattr(args, k) for k in ("agents", "turns", "doc_words", "max_tokens")},
        },
        "rows": rows,
    }
    regime.finish(res, None)
    lines = [
        "| configuration | replicas x threads | requests | aggregate tok/s | TTFT p50 ms | "
        "TTFT p90 ms | latency p50 ms | latency p90 ms | prefix hit rate | requests per "
        "replica |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['config']} | {r['replicas']} x {r['threads']} | {r['requests']} | "
            f"{r['tok_s']:.1f} | {r['ttft_p50_ms']:.0f} | {r['ttft_p90_ms']:.0f} | "
            f"{r['latency_p50_ms']:.0f} | {r['latency_p90_ms']:.0f} | "
            f"{r['hit_rate']:.2f} | {'/'.join(map(str, r['per_replica']))} |"
        )
    print("\n".join(lines))
    print(
        f"\n{hdr['date']}, {hdr['machine']['model_name']}, load average before "
        f"{hdr['load_avg_start'][0]:.1f}, after {hdr['load_avg_end'][0]:.1f}; {args.agents} "
        f"agents x {args.turns} turns, {args.doc_words}-word documents, {args.max_tokens}-token "
        f"replies"
    )
    return regime.finish(res, args.json)


if __name__ == "__main__":
    main()
