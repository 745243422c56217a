"""``goinfer serve MODEL`` (run the server) and ``goinfer serve check URL`` (drive one).

The check client uses only the standard library, so it runs anywhere goinfer is installed.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import secrets
import socket
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from goinfer.cli_options import exact_option, kv_dtype_option
from goinfer.server.routing import Policy
from goinfer.server.spec import ReplicaSpec, ServeOptions
from goinfer.speculative import DEFAULT_DRAFT_TOKENS, DRAFTS

LOOPBACK_NAMES = {"localhost", "ip6-localhost", "ip6-loopback"}
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        help="a model: a registered name, hf.co/ORG/REPO[:QUANT], ORG/REPO[:QUANT], "
        "an Ollama name (llama3.2, qwen3:4b) or a .gguf path; or `check URL`",
    )
    p.add_argument("url", nargs="?", default=None, help=argparse.SUPPRESS)
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; any other needs --api-key)",
    )
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key",
        default=os.environ.get("GOINFER_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default: $GOINFER_API_KEY)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=64,
        help="requests waiting for a seat before new ones get 429 (default 64)",
    )
    p.add_argument(
        "--max-batch",
        type=int,
        default=8,
        help="sequences decoded together in one step (default 8)",
    )
    p.add_argument(
        "--prefill-chunk",
        type=int,
        default=256,
        help="prompt tokens prefilled per step between decode steps (default 256)",
    )
    p.add_argument(
        "--threads", type=int, default=None, help="kernel threads (default: physical cores)"
    )
    exact_option(p)
    p.add_argument("--ctx", type=int, default=None, help="context length (default: the model's)")
    p.add_argument(
        "--draft",
        choices=["none", *DRAFTS],
        default="none",
        help="speculative drafting of every request unless it sets 'draft' (the "
        "output is the same; faster when replies copy from their context)",
    )
    p.add_argument(
        "--draft-tokens",
        type=int,
        default=DEFAULT_DRAFT_TOKENS,
        help=f"tokens per draft (default {DEFAULT_DRAFT_TOKENS})",
    )
    p.add_argument(
        "--kv-tokens",
        type=int,
        default=None,
        help="KV cache size in tokens, shared by all requests (default: 2 x context)",
    )
    kv_dtype_option(p)
    p.add_argument("--max-body", type=int, default=8 << 20, help="request body limit in bytes")
    p.add_argument(
        "--anthropic-normalize",
        default=os.environ.get("GOINFER_ANTHROPIC_NORMALIZE", "all"),
        help="prompt normalisations of /v1/messages that keep the prefix cache across "
        "Claude Code's requests: 'all' (default), 'none', or a comma-separated "
        "list of billing_header, system_in_place, deferred_tools (default: "
        "$GOINFER_ANTHROPIC_NORMALIZE or all)",
    )
    p.add_argument(
        "--anthropic-defaults",
        default=os.environ.get("GOINFER_ANTHROPIC_DEFAULTS", ""),
        help="a JSON object of temperature, top_p, top_k, stop_sequences for "
        "/v1/messages requests that do not set them (default: "
        "$GOINFER_ANTHROPIC_DEFAULTS or none)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=LOG_LEVELS,
        help="server log level (uvicorn's; on Ray Serve the application's)",
    )
    ray = p.add_argument_group("replicas on Ray Serve (the ray extra)")
    ray.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="serve N replicas on Ray Serve behind one endpoint (default: one process, no Ray)",
    )
    ray.add_argument(
        "--threads-per-replica",
        type=int,
        default=None,
        help="kernel threads (and Ray CPUs) per replica (default: --threads, or cores / replicas)",
    )
    ray.add_argument(
        "--ray-address",
        default=None,
        help="join this Ray cluster ('auto', or the head's host:port) instead of "
        "starting a local Ray instance",
    )
    ray.add_argument(
        "--route",
        default="prefix",
        choices=("prefix", "least_loaded", "random"),
        help="replica choice: longest cached prefix (default), least loaded, random",
    )
    ray.add_argument(
        "--route-imbalance",
        type=int,
        default=4,
        help="leave the longest-prefix replica for the least loaded one when it has "
        "more than this many requests in flight beyond it (default 4)",
    )


def serve_options(args: argparse.Namespace) -> ServeOptions:
    """The options of `goinfer serve`'s parsed arguments (ValueError for a bad routing policy)."""
    spec = ReplicaSpec(
        model=args.model,
        threads=args.threads,
        exact=args.exact,
        ctx=args.ctx,
        kv_tokens=args.kv_tokens,
        kv_dtype=args.kv_dtype,
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        prefill_chunk=args.prefill_chunk,
        max_body=args.max_body,
        api_key=args.api_key,
        draft=None if args.draft == "none" else args.draft,
        draft_tokens=args.draft_tokens,
    )
    return ServeOptions(
        spec=spec,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        anthropic_normalize=args.anthropic_normalize,
        anthropic_defaults=args.anthropic_defaults,
        replicas=args.replicas,
        threads_per_replica=args.threads_per_replica,
        ray_address=args.ray_address,
        policy=Policy(args.route, args.route_imbalance),
    )


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def run(args) -> int:
    if args.model == "check":
        if not args.url:
            print("usage: goinfer serve check URL [--api-key KEY]", file=sys.stderr)
            return 2
        return check(args.url, args.api_key)
    if args.url:
        print(f"goinfer serve: unexpected argument {args.url!r}", file=sys.stderr)
        return 2
    try:
        opts = serve_options(args)
    except ValueError as e:
        print(f"goinfer serve: {e}", file=sys.stderr)
        return 2
    if not is_loopback(opts.host) and not opts.spec.api_key:
        print(
            f"goinfer serve: refusing to bind {opts.host} without --api-key (anyone who can "
            "reach it could use the model); bind 127.0.0.1 or set an API key",
            file=sys.stderr,
        )
        return 2
    from goinfer.server import anthropic_request as ar
    from goinfer.server.errors import APIError

    for env, value, validate, name in (
        (ar.NORMALIZE_ENV, opts.anthropic_normalize, ar.Normalize.parse, "normalize"),
        (ar.DEFAULTS_ENV, opts.anthropic_defaults, ar.parse_defaults, "defaults"),
    ):
        try:
            validate(value)
        except (ValueError, APIError) as e:
            print(f"goinfer serve: --anthropic-{name}: {e}", file=sys.stderr)
            return 2
        os.environ[env] = value  # read by the route per request, in Ray's processes too
    if opts.on_ray:
        if not opts.ray_address:  # a local Ray instance: its control plane on loopback only
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        try:
            from goinfer.server.ray import serve_cli
        except ImportError as e:
            print(
                f"goinfer serve --replicas needs the ray extra: pip install 'goinfer[ray]' ({e})",
                file=sys.stderr,
            )
            return 2
        return serve_cli(opts)
    try:
        import uvicorn
    except ImportError:
        print(
            "goinfer serve needs the server extra: pip install 'goinfer[server]'", file=sys.stderr
        )
        return 2
    from goinfer.server.spec import open_app

    app = open_app(opts.spec)
    model, cache = app.state.model, app.state.cache
    print(
        f"goinfer: serving {app.state.model_id} ({model.config.describe()}, "
        f"threads={model.threads}, KV cache {cache.max_tokens} tokens, {cache.dtype}) on "
        f"http://{opts.host}:{opts.port}/v1",
        file=sys.stderr,
    )
    uvicorn.run(app, host=opts.host, port=opts.port, log_level=opts.log_level)
    return 0


# ============================================================================ check client


class Client:
    def __init__(self, url: str, api_key: str | None):
        self.base = url.rstrip("/")
        if not self.base.endswith("/v1"):
            self.base += "/v1"
        self.key = api_key

    def _req(self, path: str, body=None) -> urllib.request.Request:
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        data = None if body is None else json.dumps(body).encode()
        return urllib.request.Request(
            self.base + path, data=data, headers=headers, method="GET" if body is None else "POST"
        )

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self._req(path), timeout=600) as r:
            return json.loads(r.read())

    def post(self, path: str, body: dict) -> dict:
        with urllib.request.urlopen(self._req(path, body), timeout=600) as r:
            return json.loads(r.read())

    def stream(self, path: str, body: dict) -> dict:
        """Stream a request -> text, chunks, ttft_s, total_s, usage, timings, finish_reason,
        replica (the X-Goinfer-Replica header of a server on Ray Serve, else None)."""
        body = dict(body, stream=True, stream_options={"include_usage": True})
        t0 = time.perf_counter()
        out: dict[str, Any] = {
            "text": "",
            "chunks": 0,
            "pings": 0,
            "ttft_s": None,
            "usage": None,
            "timings": None,
            "finish_reason": None,
            "done": False,
        }
        with urllib.request.urlopen(self._req(path, body), timeout=600) as r:
            out["replica"] = r.headers.get("x-goinfer-replica")
            for raw in r:
                line = raw.decode().rstrip("\r\n")
                if line.startswith(":"):
                    out["pings"] += 1
                    continue
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    out["done"] = True
                    break
                ev = json.loads(data)
                if "error" in ev:
                    raise RuntimeError(ev["error"].get("message"))
                out["chunks"] += 1
                if ev.get("usage"):
                    out["usage"] = ev["usage"]
                if ev.get("timings"):
                    out["timings"] = ev["timings"]
                for ch in ev.get("choices", []):
                    piece = ch.get("delta", {}).get("content") if "delta" in ch else ch.get("text")
                    if piece:
                        if out["ttft_s"] is None:
                            out["ttft_s"] = time.perf_counter() - t0
                        out["text"] += piece
                    if ch.get("finish_reason"):
                        out["finish_reason"] = ch["finish_reason"]
        out["total_s"] = time.perf_counter() - t0
        return out


def long_prompt(n_words: int = 2000, seed: int = 0) -> str:
    """About n_words words of varied English-like text (deterministic for a seed)."""
    import random

    rng = random.Random(seed)
    nouns = (
        "agent tool file cache prompt server token model request reply branch test queue "
        "thread kernel block layer matrix vector record index table report note"
    ).split()
    verbs = (
        "reads writes checks builds sends keeps finds sorts merges splits loads saves "
        "counts moves opens closes"
    ).split()
    adjs = "small large new old fast slow shared local long short plain exact".split()
    words: list[str] = []
    while len(words) < n_words:
        s = [
            rng.choice(("The", "A", "Each", "Every")),
            rng.choice(adjs),
            rng.choice(nouns),
            rng.choice(verbs),
            "the",
            rng.choice(adjs),
            rng.choice(nouns) + ".",
        ]
        words += s
    return " ".join(words[:n_words])


def check(url: str, api_key: str | None, long_words: int = 2000) -> int:
    c = Client(url, api_key)
    rows: list[tuple[str, str, str]] = []
    ok = True

    def row(name: str, value, unit: str = "", note: str = "") -> None:
        v = f"{value:.3f}" if isinstance(value, float) else str(value)
        rows.append((name, v, unit))
        print(f"{name:<44} {v:>12} {unit:<8} {note}", flush=True)

    def fail(name: str, e: Exception) -> None:
        nonlocal ok
        ok = False
        print(f"{name:<44} {'FAILED':>12}          {e}", flush=True)

    print(f"goinfer serve check {c.base}")
    try:
        t0 = time.perf_counter()
        ms = c.get("/models")
        row("models listed", len(ms["data"]), "", ", ".join(m["id"] for m in ms["data"]))
        row("models latency", (time.perf_counter() - t0) * 1e3, "ms")
        model = ms["data"][0]["id"]
    except Exception as e:  # noqa: BLE001
        fail("models", e)
        return 1
    chat = "/chat/completions"
    msgs = [{"role": "user", "content": "Name three colours of the rainbow, comma separated."}]
    base = {"model": model, "messages": msgs, "max_tokens": 48, "temperature": 0}
    try:
        s = c.stream(chat, base)
        u = s["usage"] or {}
        row("chat time to first token", s["ttft_s"] * 1e3 if s["ttft_s"] else float("nan"), "ms")
        n = u.get("completion_tokens", 0)
        gen_s = s["total_s"] - (s["ttft_s"] or 0)
        row(
            "chat decode speed",
            (n - 1) / gen_s if n > 1 and gen_s > 0 else 0.0,
            "tok/s",
            "client side, first token excluded",
        )
        row("chat usage prompt_tokens", u.get("prompt_tokens"), "tok")
        row("chat usage completion_tokens", n, "tok")
        row(
            "chat usage cached_tokens",
            (u.get("prompt_tokens_details") or {}).get("cached_tokens"),
            "tok",
        )
        row(
            "chat server predicted_per_second",
            float((s["timings"] or {}).get("predicted_per_second", 0.0)),
            "tok/s",
        )
    except Exception as e:  # noqa: BLE001
        fail("chat", e)
        s = None
    try:
        full = c.post(chat, base)
        text = full["choices"][0]["message"]["content"]
        row(
            "streaming chunks",
            s["chunks"] if s else 0,
            "",
            "stream done: " + ("yes" if s and s["done"] else "no"),
        )
        row("streaming text equals non-streaming", int(s is not None and s["text"] == text), "bool")
    except Exception as e:  # noqa: BLE001
        fail("streaming", e)
        text = ""
    try:
        cut = _pick_stop(text)
        if cut is None:
            row("stop sequence", "n/a", "", "reply too short to pick a stop")
        else:
            stop, prefix = cut
            r = c.post(chat, dict(base, stop=[stop]))
            got = r["choices"][0]["message"]["content"]
            rs = c.stream(chat, dict(base, stop=[stop]))
            good = got == prefix and rs["text"] == prefix and stop not in got + rs["text"]
            row(
                "stop sequence honoured, not leaked",
                int(good),
                "bool",
                f"stop={stop!r} finish={r['choices'][0]['finish_reason']}",
            )
            if not good:
                ok = False
    except Exception as e:  # noqa: BLE001
        fail("stop sequence", e)
    nonce = secrets.token_hex(4)
    long_msgs = [
        {
            "role": "system",
            "content": f"Run {nonce}. Read the log and answer briefly.\n" + long_prompt(long_words),
        },
        {"role": "user", "content": "In one sentence: what does the log talk about?"},
    ]
    long_body = {"model": model, "messages": long_msgs, "max_tokens": 16, "temperature": 0}
    for label in (f"long prompt (~{long_words} words)", "same long prompt again"):
        try:
            s = c.stream(chat, long_body)
            u = s["usage"] or {}
            row(
                f"{label}: time to first token",
                s["ttft_s"] * 1e3 if s["ttft_s"] else s["total_s"] * 1e3,
                "ms",
                f"{s['pings']} pings",
            )
            row(f"{label}: prompt_tokens", u.get("prompt_tokens"), "tok")
            row(
                f"{label}: cached_tokens",
                (u.get("prompt_tokens_details") or {}).get("cached_tokens"),
                "tok",
            )
        except Exception as e:  # noqa: BLE001
            fail(label, e)
    try:
        res: list = [None] * 4

        def one(i):
            m = [{"role": "user", "content": f"Client {i}: count from {i} to {i + 9}."}]
            res[i] = c.stream(
                chat, {"model": model, "messages": m, "max_tokens": 32, "temperature": 0}
            )

        t0 = time.perf_counter()
        ths = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        wall = time.perf_counter() - t0
        toks = sum((r["usage"] or {}).get("completion_tokens", 0) for r in res)
        ttfts = [r["ttft_s"] * 1e3 for r in res if r["ttft_s"] is not None]
        row(
            "4 concurrent clients: aggregate",
            toks / wall,
            "tok/s",
            f"{toks} tokens in {wall:.1f} s",
        )
        row(
            "4 concurrent clients: median TTFT",
            statistics.median(ttfts) if ttfts else float("nan"),
            "ms",
        )
        row("4 concurrent clients: max latency", max(r["total_s"] for r in res) * 1e3, "ms")
    except Exception as e:  # noqa: BLE001
        fail("concurrent clients", e)
    return 0 if ok else 1


def _pick_stop(text: str):
    """A stop string from the middle of a reply: (stop, the text before it)."""
    words = text.split()
    if len(words) < 3:
        return None
    stop = words[len(words) // 2]
    i = text.find(stop)
    if i <= 0:
        return None
    return stop, text[:i]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
