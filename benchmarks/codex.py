"""Codex on goinfer: the real `codex exec` (the executable the openai-codex-cli-bin wheel ships)
against goinfer's server, one session over a few turns (`codex exec`, then `codex exec resume
--last`), and per request the prompt tokens, the tokens read from goinfer's prefix cache and the
time to first token (TTFT), warm (as served, the cache kept from turn to turn) and cold (the
same request again with a fresh cache_salt: nothing reused); then the same token sequences
prefilled by llama.cpp (llama-cpp-python) as the peer's time for the same prefill.

    python benchmarks/codex.py [--model gemma3-270m] [--turns 3] [--threads 2] [--json out.json]
    python benchmarks/codex.py --smoke     # the tiny model, Codex with a short prompt (test suite)

Codex's provider is set with `-c` overrides and a temporary HOME (docs/responses.md):

    codex -c model_provider=goinfer -c model_providers.goinfer.name=goinfer
          -c model_providers.goinfer.base_url=http://127.0.0.1:PORT/v1
          -c model_providers.goinfer.wire_api=responses
          -c model_providers.goinfer.env_key=GOINFER_API_KEY -c model=gemma3-270m
          exec --skip-git-repo-check --output-schema SCHEMA "Greet me."

The server is goinfer's app as `goinfer serve` builds it (create_app, default KV cache), run in a
process of its own behind a recorder that keeps each POST /v1/responses and the time its first
output event was sent (TTFT, measured at the server from the request's arrival: queueing,
tokenizing and prefill).  Every request is answered with tool_choice "none": Codex sends its
tools with tool_choice "auto", and a 270M model calls them at random (Codex would run made-up
shell commands); the tools stay in the prompt, so the prompt is the one Codex's session builds.
`--output-schema` (a one-word greeting) keeps each reply short and ends it.

llama.cpp runs in a process of its own (when llama-cpp-python is installed, else skipped): for
each request a cold prefill of its whole prompt, and a warm one on one live `Llama` that held
the previous request (llama.cpp's own prefix reuse); time to the first sampled token.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import isolate
import regime
from claude_code import Recorder, serve  # the same middleware and loopback server

HERE = Path(__file__).resolve()
KEY = "goinfer-benchmark-key"
GREETING = {
    "type": "object",
    "properties": {"greeting": {"type": "string", "enum": ["hello", "hi", "hey"]}},
    "required": ["greeting"],
    "additionalProperties": False,
}
PROMPTS = ["Greet me.", "Greet me again.", "One more greeting.", "And another.", "Last one."]
# --smoke: the tiny model reads bytes; Codex's own prompt (its 17k-character base instructions,
# its permissions and environment blocks, its tools) would not fit, a short one does
LEAN = (
    "-c",
    "include_permissions_instructions=false",
    "-c",
    "include_environment_context=false",
    "-c",
    "features.multi_agent=false",
    "-c",
    'web_search="disabled"',
    "-c",
    "features.goals=false",
)


# ============================================================================ recording


@dataclass
class Call:
    """One POST /v1/responses: its body and what the server sent back."""

    t0: float
    body: bytes = b""
    status: int | None = None
    raw: bytearray = field(default_factory=bytearray)
    t_first: float | None = None  # the first output item announced (or the whole JSON reply)
    t_end: float | None = None

    def reply(self) -> dict:
        """The final response object (response.completed / .incomplete / .failed, or the
        JSON reply) and the event types in their order."""
        text = bytes(self.raw).decode()
        if not text.startswith("event:"):
            d = json.loads(text) if text else {}
            return {"response": d, "events": []}
        final, kinds = {}, []
        for block in text.split("\n\n"):
            data = next((ln[6:] for ln in block.split("\n") if ln.startswith("data: ")), None)
            if data is None:
                continue
            ev = json.loads(data)
            kinds.append(ev["type"])
            if ev["type"] in ("response.completed", "response.incomplete", "response.failed"):
                final = ev["response"]
        return {"response": final, "events": kinds}


def recorder(app):
    """claude_code.Recorder of every POST /v1/responses; the first token goes out with the
    first output item announced."""
    return Recorder(
        app,
        records=lambda path: path == "/v1/responses",
        first=b"response.output_item.added",
        make_call=lambda path, t0: Call(t0),
    )


# ============================================================================ Codex


def codex_path() -> Path | None:
    """The `codex` executable the openai-codex-cli-bin wheel ships (None: not installed)."""
    try:
        import codex_cli_bin
    except ImportError:
        return None
    p = Path(codex_cli_bin.bundled_codex_path())
    return p if p.exists() else None


def run_codex(
    codex: Path, url: str, home: Path, model: str, *args: str, timeout: float = 3600
) -> subprocess.CompletedProcess:
    """codex -c <goinfer as the provider> ARGS, in home/work, with HOME and CODEX_HOME there."""
    provider = [
        "-c",
        "model_provider=goinfer",
        "-c",
        "model_providers.goinfer.name=goinfer",
        "-c",
        f"model_providers.goinfer.base_url={url}/v1",
        "-c",
        "model_providers.goinfer.wire_api=responses",
        "-c",
        "model_providers.goinfer.env_key=GOINFER_API_KEY",
        "-c",
        f"model={model}",
    ]
    work = home / "work"
    work.mkdir(exist_ok=True)
    (home / ".codex").mkdir(exist_ok=True)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        "TERM": "dumb",
        "GOINFER_API_KEY": KEY,
        "RUST_LOG": "error",
    }
    return subprocess.run(
        [str(codex), *provider, *args],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def codex_version(codex: Path) -> str:
    out = subprocess.run([str(codex), "--version"], capture_output=True, text=True, timeout=60)
    return out.stdout.strip()


# ============================================================================ the engines


def goinfer_side(spec: dict) -> dict:
    """In its own process: the server, the Codex session, the cold replays -> turns (rows per
    request) and each request's prompt as token ids."""
    import httpx

    from goinfer.kv_cache import KVCache
    from goinfer.model import Model
    from goinfer.server.app import create_app
    from goinfer.server.openai_responses import Responses
    from goinfer.server.routes import ROUTES
    from goinfer.server.runner import prompt_ids

    class NoCalls(Responses):
        """The Responses route answering every request with tool_choice "none"."""

        def parse(self, body, vocab_size):
            req = super().parse(body, vocab_size)
            req.tool_choice = "none"
            return req

    route = NoCalls()
    model = Model.load(
        spec["model"], threads=spec["threads"], context_length=spec["ctx"], progress=False
    )
    routes = tuple(r for r in ROUTES if r.path != route.path) + (route,)
    app = recorder(
        create_app(model, KVCache(model), model_id=spec["name"], api_key=KEY, routes=routes)
    )
    codex = Path(spec["codex"])
    root = Path(spec["tmp"])
    schema = root / "schema.json"
    schema.write_text(json.dumps(GREETING))
    # Codex's own -c flags go before the subcommand (after `exec` it waits, sending nothing)
    base = ["--skip-git-repo-check", "--output-schema", str(schema)]
    turns = []
    with serve(app) as url:
        for turn in range(spec["turns"]):
            args = [*spec["extra"], "exec", *base] + (["resume", "--last"] if turn else [])
            prompt = PROMPTS[turn % len(PROMPTS)]
            n0 = len(app.calls)
            t0 = time.perf_counter()
            out = run_codex(codex, url, root, spec["name"], *args, prompt)
            turns.append(
                {
                    "turn": turn + 1,
                    "command": ("codex exec resume --last " if turn else "codex exec ")
                    + repr(prompt),
                    "exit": out.returncode,
                    "wall_s": time.perf_counter() - t0,
                    "stdout_tail": out.stdout.strip()[-300:],
                    "stderr_tail": out.stderr.strip()[-300:] if out.returncode else "",
                    "calls": list(range(n0, len(app.calls))),
                }
            )
        served = list(app.calls)
        # cold: every request again, its prefix hashed apart (a fresh cache_salt)
        cold = []
        for c in served:
            body = dict(json.loads(c.body), cache_salt=uuid.uuid4().hex)
            n0 = len(app.calls)
            with httpx.stream(
                "POST",
                url + "/v1/responses",
                json=body,
                timeout=3600,
                headers={"Authorization": f"Bearer {KEY}"},
            ) as r:
                r.read()
            cold.append(app.calls[n0])
    prompts = []
    for t in turns:
        rows = []
        for i in t.pop("calls"):
            body = json.loads(served[i].body)
            ids, _ = prompt_ids(model, route.parse(body, model.vocab_size))
            prompts.append(ids)
            rows.append(row(served[i], cold[i], len(body.get("input") or [])))
        t["requests"] = rows
    return {"turns": turns, "prompts": prompts}


def row(warm: Call, cold: Call, n_items: int) -> dict:
    """One request: warm (as served) and cold (replayed with nothing cached)."""
    w, c = warm.reply(), cold.reply()
    u = w["response"].get("usage") or {}
    cu = c["response"].get("usage") or {}
    prompt = u.get("input_tokens", 0)
    cached = (u.get("input_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "http_status": warm.status,
        "status": w["response"].get("status"),
        "input_items": n_items,
        "output": [o["type"] for o in w["response"].get("output") or []],
        "events": w["events"],
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "cached_fraction": cached / prompt if prompt else 0.0,
        "ttft_s": None if warm.t_first is None else warm.t_first - warm.t0,
        "total_s": None if warm.t_end is None else warm.t_end - warm.t0,
        "cold": {
            "http_status": cold.status,
            "prompt_tokens": cu.get("input_tokens", 0),
            "cached_tokens": (cu.get("input_tokens_details") or {}).get("cached_tokens", 0),
            "ttft_s": None if cold.t_first is None else cold.t_first - cold.t0,
        },
    }


def llama_side(spec: dict) -> dict:
    """In its own process: each prompt cold (a reset Llama) and warm (one live Llama that held
    the previous prompt); time to the first sampled token."""
    from llama_cpp import Llama

    prompts = spec["prompts"]
    n_ctx = max(len(p) for p in prompts) + 64

    def mk():
        return Llama(
            spec["model"],
            n_ctx=n_ctx,
            n_batch=512,
            n_threads=spec["threads"],
            n_threads_batch=spec["threads"],
            flash_attn=True,
            verbose=False,
        )

    def first_token(llm, p) -> float:
        t0 = time.perf_counter()
        for _ in llm.create_completion(p, max_tokens=1, temperature=0.0, stream=True):
            break
        return time.perf_counter() - t0

    live, cold = mk(), mk()
    rows = []
    for p in prompts:
        held = live._input_ids[: live.n_tokens].tolist()
        common = next(
            (i for i, (a, b) in enumerate(zip(held, p)) if a != b), min(len(held), len(p))
        )
        warm = first_token(live, p)
        cold.reset()
        rows.append(
            {
                "prompt_tokens": len(p),
                "warm_common": common,
                "warm_ttft_s": warm,
                "cold_ttft_s": first_token(cold, p),
            }
        )
    return {"rows": rows, "system_info": regime.system_info()}


def child() -> None:
    spec = isolate.child_spec()
    isolate.child_reply(goinfer_side(spec) if spec["engine"] == "goinfer" else llama_side(spec))


# ============================================================================ benchmark


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="the tiny model, Codex with a short prompt, 2 turns (llama.cpp too when "
        "it is installed)",
    )
    regime.add_json_arg(ap)
    args = ap.parse_args(argv)
    codex = codex_path()
    if codex is None:
        raise SystemExit(
            "openai-codex-cli-bin is not installed (pip install "
            "openai-codex-cli-bin): its wheel ships the codex executable"
        )
    peer = regime.peer("llama.cpp")
    if args.no_llama_cpp:
        print("llama.cpp: skipped (--no-llama-cpp)", flush=True)
    elif not peer["installed"]:
        args.no_llama_cpp = True
        print("llama.cpp: skipped (llama-cpp-python is not installed)", flush=True)

    from goinfer import hub

    tmp = tempfile.TemporaryDirectory(prefix="goinfer-codex-")
    root = Path(tmp.name)
    extra: tuple[str, ...] = ()
    ctx = None
    if args.smoke:
        from shapes import smoke_model

        args.model, args.turns = str(smoke_model(root / "models")), 2
        brief = root / "instructions.md"
        brief.write_text("You are a helpful assistant.\n")
        extra, ctx = (*LEAN, "-c", f"model_instructions_file={json.dumps(str(brief))}"), 16384
    path = str(hub.resolve(args.model, progress=False))
    name = Path(path).stem if args.model.endswith(".gguf") else args.model
    res = {
        "benchmark": "codex",
        "regime": regime.header(args.threads, argv=argv, peer_name="llama.cpp"),
        "model": regime.model(path),
        "codex": codex_version(codex),
        "serving": "tool_choice none on every request; --output-schema: a one-word greeting",
    }
    if args.smoke:
        res["codex_overrides"] = list(extra[:-1]) + ["model_instructions_file=<one line>"]
    home = root / "home"
    home.mkdir()
    spec = {
        "engine": "goinfer",
        "model": path,
        "name": name,
        "threads": args.threads,
        "ctx": ctx,
        "turns": args.turns,
        "codex": str(codex),
        "tmp": str(home),
        "extra": list(extra),
    }
    got = isolate.run_child(HERE, spec)
    res["turns"], prompts = got["turns"], got["prompts"]
    res["processes"] = {"parent": os.getpid(), "goinfer": [got["pid"]]}
    if not args.no_llama_cpp and prompts:
        peer_out = isolate.run_child(
            HERE,
            {"engine": "llama.cpp", "model": path, "threads": args.threads, "prompts": prompts},
        )
        res["regime"]["peer"]["system_info"] = peer_out["system_info"]
        res["processes"]["llama.cpp"] = [peer_out["pid"]]
        rows = iter(peer_out["rows"])
        for t in res["turns"]:
            for r in t["requests"]:
                r["llama_cpp"] = next(rows)
    res["summary"] = summary(res["turns"])
    regime.finish(res, None)
    print(table(res))
    tmp.cleanup()
    return regime.finish(res, args.json)


def summary(turns: list[dict]) -> dict:
    """Per request after the first: the cached fraction of its prompt and cold TTFT / warm TTFT;
    the first request's cold/warm (both cold: about 1)."""
    rows = [r for t in turns for r in t["requests"]]
    ratio = [
        r["cold"]["ttft_s"] / r["ttft_s"] if r["ttft_s"] and r["cold"]["ttft_s"] else None
        for r in rows
    ]
    return {
        "requests": len(rows),
        "cached_fraction": [round(r["cached_fraction"], 4) for r in rows],
        "cold_over_warm_ttft": [None if x is None else round(x, 2) for x in ratio],
        "exits": [t["exit"] for t in turns],
    }


def table(res: dict) -> str:
    g, m = res["regime"], res["model"]
    lines = [
        f"{m['file']} ({m['quantization']}), {g['threads']} threads, {res['codex']}, "
        f"{g['date']}, load {g['load_avg_start'][0]:.1f} -> {g['load_avg_end'][0]:.1f}",
        "",
        "| turn | request | HTTP | status | prompt tokens | cached | warm TTFT ms | "
        "cold TTFT ms | cold / warm | llama.cpp cold ms | llama.cpp warm ms (reused) |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def ms(x):
        return "-" if x is None else f"{x * 1e3:.0f}"

    for t in res["turns"]:
        for i, r in enumerate(t["requests"]):
            p = r.get("llama_cpp")
            peer = (
                f"{ms(p['cold_ttft_s'])} | {ms(p['warm_ttft_s'])} ({p['warm_common']})"
                if p
                else "- | -"
            )
            ratio = (
                f"{r['cold']['ttft_s'] / r['ttft_s']:.1f}"
                if r["ttft_s"] and r["cold"]["ttft_s"]
                else "-"
            )
            lines.append(
                f"| {t['turn']} | {i + 1} | {r['http_status']} | {r['status']} | "
                f"{r['prompt_tokens']} | {r['cached_tokens']} | {ms(r['ttft_s'])} | "
                f"{ms(r['cold']['ttft_s'])} | {ratio} | {peer} |"
            )
    lines.append("")
    lines.append("exit codes: " + ", ".join(f"turn {t['turn']}: {t['exit']}" for t in res["turns"]))
    return "\n".join(lines)


if __name__ == "__main__":
    if "--child" in sys.argv:
        child()
    else:
        main()
