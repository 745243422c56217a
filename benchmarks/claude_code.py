"""Claude Code on goinfer: the real `claude -p` (the binary the claude-agent-sdk wheel ships)
against goinfer's server, a few turns of one session (`--continue`), and per request the prompt
tokens, the tokens read from goinfer's prefix cache and the time to first token (TTFT), cold and
warm; then the same token sequences prefilled by llama.cpp (llama-cpp-python, in a process of
its own) as the peer's time for the same prefill.

    python benchmarks/claude_code.py [--model gemma3-270m] [--turns 3] [--threads 2]
        [--peer-python PYTHON] [--json out.json]
    python benchmarks/claude_code.py --smoke     # the tiny model, a short prompt (test suite)

It prints a table (per request: prompt tokens, cached tokens, TTFT, the peer's cold and warm
prefill) and the warm/cold TTFT ratios (target: every warm request at most a tenth of the cold
one); --json writes the requests, the summary and the regime (benchmarks/regime.py).

The server is goinfer's app as `goinfer serve` builds it (create_app, default KV cache: 2 x the
context), run in this process behind a recorder that keeps each /v1/messages request and the
time its first content event was sent (TTFT, measured at the server from the request's arrival:
queueing, tokenizing and prefill).  Claude Code sends no sampling settings; --defaults gives the
server's (goinfer serve --anthropic-defaults): greedy, and a reply that ends at its first line
break, so a base model such as Gemma 3 270M ends its turns and every turn is one request.

The peer runs with PYTHON (--peer-python, default: this interpreter when llama_cpp imports,
else skipped): for each request a cold prefill of its whole prompt, and a warm one on one live
`Llama` that held the previous request (llama.cpp's own prefix reuse); time to the first
sampled token, as goinfer's.

Also the helpers the test suite drives Claude Code with (tests/test_claude_code.py): Recorder,
serve, claude_path, run_claude, replies.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import regime  # benchmarks/regime.py (benchmarks/ is on sys.path when run as a script)

KEY = "goinfer-benchmark-key"
# Claude Code sends no temperature or stop sequences: these make a base model's turn one line
DEFAULTS = {"temperature": 0, "stop_sequences": ["\n"]}


# ============================================================================ recording


@dataclass
class Call:
    """One request to /v1/messages*: its body and what the server sent back."""

    path: str
    t0: float
    body: bytes = b""
    status: int | None = None
    raw: bytearray = field(default_factory=bytearray)
    t_first: float | None = None  # the first content_block_delta (or the whole JSON reply) sent
    t_end: float | None = None

    @property
    def request(self) -> dict:
        return json.loads(self.body)

    @property
    def ttft_s(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t0

    def reply(self) -> dict:
        """The reply: {"text", "stop_reason", "usage", "error"} from the SSE events or JSON."""
        text = bytes(self.raw).decode()
        out = {"text": "", "stop_reason": None, "usage": {}, "error": None}
        if not text.startswith("event:"):
            d = json.loads(text) if text else {}
            if d.get("type") == "error":
                out["error"] = d["error"]
            out["text"] = "".join(b.get("text", "") for b in d.get("content", []))
            out["stop_reason"], out["usage"] = d.get("stop_reason"), d.get("usage", {})
            return out
        for block in text.split("\n\n"):
            data = next((ln[6:] for ln in block.split("\n") if ln.startswith("data: ")), None)
            if data is None:
                continue
            ev = json.loads(data)
            if ev["type"] == "message_start":
                out["usage"] = ev["message"]["usage"]
            elif ev["type"] == "content_block_delta" and ev["delta"]["type"] == "text_delta":
                out["text"] += ev["delta"]["text"]
            elif ev["type"] == "message_delta":
                out["stop_reason"] = ev["delta"]["stop_reason"]
                out["usage"] = dict(out["usage"], **ev["usage"])
            elif ev["type"] == "error":
                out["error"] = ev["error"]
        return out


class Recorder:
    """ASGI middleware: records every request whose path `records` accepts (default
    /v1/messages*) as a Call (calls, in arrival order); its first token is sent with the
    first chunk holding `first` (default: a content_block_delta) or with a JSON reply."""

    def __init__(
        self,
        app,
        records=lambda path: path.startswith("/v1/messages"),
        first: bytes = b"content_block_delta",
        make_call=Call,
    ):
        self.app = app
        self.records, self.first, self.make_call = records, first, make_call
        self.calls: list = []

    def __getattr__(self, name):  # the wrapped app's state, engine, ...
        return getattr(self.app, name)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not self.records(scope["path"]):
            return await self.app(scope, receive, send)
        call = self.make_call(scope["path"], time.perf_counter())
        self.calls.append(call)

        async def rec_receive():
            msg = await receive()
            if msg["type"] == "http.request":
                call.body += msg.get("body", b"")
            return msg

        async def rec_send(msg):
            if msg["type"] == "http.response.start":
                call.status = msg["status"]
            elif msg["type"] == "http.response.body":
                chunk = msg.get("body", b"")
                call.raw += chunk
                if call.t_first is None and (
                    self.first in chunk or (chunk and not call.raw.startswith(b"event:"))
                ):
                    call.t_first = time.perf_counter()
                if not msg.get("more_body", False):
                    call.t_end = time.perf_counter()
            await send(msg)

        await self.app(scope, rec_receive, rec_send)


@contextlib.contextmanager
def serve(app, port: int = 0):
    """Run an ASGI app with uvicorn in a thread on loopback -> its base URL."""
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1
        )
    )
    th = threading.Thread(target=server.run, daemon=True)
    th.start()
    deadline = time.time() + 60
    while not server.started:
        if time.time() > deadline or not th.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        th.join(30)


# ============================================================================ Claude Code


def claude_path() -> Path | None:
    """The `claude` executable the claude-agent-sdk wheel ships (None: not installed)."""
    spec = importlib.util.find_spec("claude_agent_sdk")
    if spec is None or spec.origin is None:
        return None
    p = Path(spec.origin).parent / "_bundled" / "claude"
    return p if p.exists() else None


def claude_env(url: str, home: Path, *, context: int, max_output: int, key: str = KEY) -> dict:
    """The environment Claude Code runs in against a local server (docs/agents.md)."""
    keep = {
        k: v
        for k, v in os.environ.items()
        if k in ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR", "USER", "SHELL")
    }
    return dict(
        keep,
        HOME=str(home),
        ANTHROPIC_BASE_URL=url,
        ANTHROPIC_API_KEY=key,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        CLAUDE_CODE_AUTO_COMPACT_WINDOW=str(context),
        CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(max_output),
    )


def run_claude(
    env: dict,
    cwd: Path,
    prompt: str,
    model: str,
    *,
    resume: bool = False,
    extra: tuple[str, ...] = (),
    timeout: float = 1800,
) -> subprocess.CompletedProcess:
    """`claude -p PROMPT --model MODEL [--continue]` in cwd."""
    args = [str(claude_path()), "-p", prompt, "--model", model, *extra]
    if resume:
        args.append("--continue")
    return subprocess.run(
        args,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def replies(calls: list[Call]) -> list[dict]:
    """The /v1/messages generation calls (count_tokens left out), with their replies."""
    out = []
    for c in calls:
        if c.path.rstrip("/") != "/v1/messages":
            continue
        r = c.reply()
        u = r["usage"]
        prompt = (
            u.get("input_tokens", 0)
            + u.get("cache_read_input_tokens", 0)
            + u.get("cache_creation_input_tokens", 0)
        )
        out.append(
            dict(
                r,
                status=c.status,
                prompt_tokens=prompt,
                cached_tokens=u.get("cache_read_input_tokens", 0),
                ttft_s=c.ttft_s,
                total_s=(c.t_end or c.t0) - c.t0,
                call=c,
            )
        )
    return out


# ============================================================================ the peer

PEER = r"""
import json, sys, time
import llama_cpp
from llama_cpp import Llama
path, threads, n_ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
prompts = json.load(sys.stdin)
mk = lambda: Llama(path, n_ctx=n_ctx, n_batch=512, n_threads=threads, n_threads_batch=threads,
                   verbose=False, **({"swa_full": True} if "swa_full" in
                                     Llama.__init__.__code__.co_varnames else {}))
live, cold = mk(), mk()

def first_token(llm, p):
    t0 = time.perf_counter()
    for _ in llm.create_completion(p, max_tokens=1, temperature=0.0, stream=True):
        break
    return time.perf_counter() - t0

rows = []
for p in prompts:
    held = live._input_ids[:live.n_tokens].tolist()
    common = 0
    for a, b in zip(held, p):
        if a != b:
            break
        common += 1
    warm = first_token(live, p)
    cold.reset()
    rows.append({"prompt_tokens": len(p), "warm_common": common, "warm_s": warm,
                 "cold_s": first_token(cold, p)})
info = llama_cpp.llama_print_system_info()
info = (info.decode() if isinstance(info, bytes) else str(info)).strip()
print(json.dumps({"version": llama_cpp.__version__, "system_info": info, "rows": rows}))
"""


def run_peer(python: str, path: str, threads: int, prompts: list[list[int]]) -> dict:
    n_ctx = max(len(p) for p in prompts) + 64
    out = subprocess.run(
        [python, "-c", PEER, path, str(threads), str(n_ctx)],
        input=json.dumps(prompts),
        capture_output=True,
        text=True,
        timeout=7200,
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"the llama.cpp peer failed (exit {out.returncode}): {out.stderr[-2000:]}"
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def peer_python(arg: str | None) -> str | None:
    if arg:
        return arg
    return sys.executable if importlib.util.find_spec("llama_cpp") is not None else None


# ============================================================================ benchmark


def claude_version(claude: Path | None) -> str | None:
    """The version of the claude executable (the file next to it that the wheel ships)."""
    if claude is None:
        return None
    v = claude.parent / "claude.version"
    return v.read_text().strip() if v.exists() else None


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-output", type=int, default=64, help="CLAUDE_CODE_MAX_OUTPUT_TOKENS")
    ap.add_argument(
        "--defaults", default=json.dumps(DEFAULTS), help="the server's --anthropic-defaults (JSON)"
    )
    ap.add_argument(
        "--peer-python",
        default=None,
        help="a Python with llama_cpp (default: this one if it has it, else skip)",
    )
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the tiny model, a short system prompt and no tools, 2 turns, no peer: "
        "the plumbing (its random text is cut at 8 tokens, which Claude Code "
        "reports as an error and retries, exit 1)",
    )
    regime.add_json_arg(ap)
    args = ap.parse_args(argv)
    claude = claude_path()
    if claude is None:
        raise SystemExit(
            "claude-agent-sdk is not installed (pip install claude-agent-sdk): its "
            "wheel ships the claude executable"
        )
    tmp = tempfile.TemporaryDirectory(prefix="goinfer-claude-")
    root = Path(tmp.name)
    extra: tuple[str, ...] = ()
    ctx = None
    if args.smoke:
        from shapes import smoke_model  # benchmarks/ is on sys.path when run as a script

        args.model, args.turns, args.max_output, args.no_llama_cpp = (
            str(smoke_model(root / "models")),
            2,
            8,
            True,
        )
        # the tiny model reads bytes: Claude Code's own prompt would not fit, a short one does
        extra, ctx = ("--system-prompt", "You are a helpful assistant.", "--tools", ""), 8192
    python = None if args.no_llama_cpp else peer_python(args.peer_python)
    if python is None:
        print(
            "llama.cpp: skipped ("
            + (
                "--smoke / --no-llama-cpp"
                if args.no_llama_cpp
                else "llama-cpp-python is not installed; --peer-python"
            )
            + ")",
            flush=True,
        )

    from goinfer import hub
    from goinfer.kv_cache import KVCache
    from goinfer.model import Model
    from goinfer.server.anthropic_request import DEFAULTS_ENV, parse_body
    from goinfer.server.app import create_app
    from goinfer.server.runner import prompt_ids

    os.environ[DEFAULTS_ENV] = args.defaults
    path = str(hub.resolve(args.model, progress=False))
    model = Model.load(path, threads=args.threads, context_length=ctx, progress=False)
    name = Path(path).stem if args.model.endswith(".gguf") else args.model
    cache = KVCache(model)
    app = Recorder(create_app(model, cache, model_id=name, api_key=KEY))
    res = {
        "benchmark": "claude_code",
        "regime": regime.header(args.threads, argv=argv, peer_name="llama.cpp"),
        "model": regime.model(path),
        "context": model.n_ctx,
        "kv_cache": {"tokens": cache.max_tokens, "block_size": cache.block_size},
        "server": "goinfer serve (create_app, default KV cache) + claude -p",
        "claude_code": claude_version(claude),
        "defaults": json.loads(args.defaults),
        "turns": [],
    }
    home, work = root / "home", root / "work"
    home.mkdir()
    work.mkdir()
    prompts = ["Say hi.", "Now say hello.", "Name one colour.", "Name one fruit.", "Say goodbye."]
    with serve(app) as url:
        env = claude_env(url, home, context=model.n_ctx, max_output=args.max_output)
        for turn in range(args.turns):
            n0 = len(app.calls)
            t0 = time.perf_counter()
            out = run_claude(
                env, work, prompts[turn % len(prompts)], name, resume=turn > 0, extra=extra
            )
            wall = time.perf_counter() - t0
            rows = replies(app.calls[n0:])
            res["turns"].append(
                {
                    "turn": turn + 1,
                    "exit": out.returncode,
                    "wall_s": wall,
                    "stdout": out.stdout.strip()[-200:],
                    "requests": [
                        {
                            k: r[k]
                            for k in (
                                "status",
                                "prompt_tokens",
                                "cached_tokens",
                                "ttft_s",
                                "total_s",
                                "stop_reason",
                                "text",
                            )
                        }
                        for r in rows
                    ],
                }
            )
            for r in rows:
                r["ids"] = prompt_ids(model, parse_body(r["call"].request, model.vocab_size))[0]
            res["turns"][-1]["_ids"] = [r["ids"] for r in rows]
    all_ids = [ids for t in res["turns"] for ids in t.pop("_ids")]
    if python is not None and all_ids:
        try:
            peer = run_peer(python, path, args.threads, all_ids)
        except RuntimeError as e:  # goinfer's figures stand; say why the peer's are missing
            res["peer_failed"] = str(e)[-2000:]
            print(f"llama.cpp: failed ({str(e)[-300:]})", flush=True)
        else:  # the peer's interpreter, which may not be this one
            res["regime"]["peer"].update(
                installed=True, version=peer["version"], system_info=peer["system_info"]
            )
            rows = iter(peer["rows"])
            for t in res["turns"]:
                for r in t["requests"]:
                    r["llama_cpp"] = next(rows)
    res["summary"] = summary(res)
    print(table(res))
    tmp.cleanup()
    return regime.finish(res, args.json)


def summary(res) -> dict:
    """Cold (the session's first request: the whole prompt prefilled) against warm (every later
    request): cached fraction of each prompt, and each warm TTFT as a fraction of the cold one
    (the target: at most 0.1)."""
    reqs = [r for t in res["turns"] for r in t["requests"]]
    if not reqs or any(r["ttft_s"] is None for r in reqs):
        return {"requests": len(reqs), "complete": False}
    cold, warm = reqs[0], reqs[1:]
    out = {
        "requests": len(reqs),
        "complete": True,
        "cold_ttft_s": cold["ttft_s"],
        "cold_prompt_tokens": cold["prompt_tokens"],
        "warm_cached_fraction": [r["cached_tokens"] / r["prompt_tokens"] for r in warm],
        "warm_over_cold_ttft": [r["ttft_s"] / cold["ttft_s"] for r in warm],
    }
    out["every_warm_at_most_a_tenth"] = bool(warm) and max(out["warm_over_cold_ttft"]) <= 0.1
    return out


def table(res) -> str:
    g, m = res["regime"], res["model"]
    lines = [
        f"{m['file']} ({m['quantization']}), context {res['context']}, {g['threads']} "
        f"threads, {g['machine'].get('model_name', '?')}, Claude Code {res['claude_code']}, "
        f"{g['date']}, load {g['load_avg_start'][0]:.1f}",
        "",
        "| turn | request | exit | prompt tokens | cached | cached % | TTFT ms | "
        "llama.cpp cold prefill ms | llama.cpp warm ms (reused) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for t in res["turns"]:
        for i, r in enumerate(t["requests"]):
            p = r.get("llama_cpp")
            peer = (
                f"{p['cold_s'] * 1e3:.0f} | {p['warm_s'] * 1e3:.0f} ({p['warm_common']})"
                if p
                else "- | -"
            )
            ttft = f"{r['ttft_s'] * 1e3:.0f}" if r["ttft_s"] is not None else "-"
            pct = (
                f"{100 * r['cached_tokens'] / r['prompt_tokens']:.1f}"
                if r["prompt_tokens"]
                else "-"
            )
            lines.append(
                f"| {t['turn']} | {i + 1} | {t['exit']} | {r['prompt_tokens']} | "
                f"{r['cached_tokens']} | {pct} | {ttft} | {peer} |"
            )
    s = res.get("summary", {})
    if s.get("complete") and s["warm_over_cold_ttft"]:
        lines += [
            "",
            "warm TTFT / cold TTFT: "
            + ", ".join(f"{x:.3f}" for x in s["warm_over_cold_ttft"])
            + " (target: each at most 0.1: "
            + ("met" if s["every_warm_at_most_a_tenth"] else "NOT met")
            + ")",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
