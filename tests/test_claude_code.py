"""Claude Code itself on goinfer: the `claude` executable of the claude-agent-sdk wheel, run
non-interactively (`claude -p`, a temporary HOME, nonessential traffic off) against goinfer's
server on Gemma 3 270M (its 32k context holds Claude Code's ~12k-token prompt), and the Python
SDK's query(); the requests and replies are read from a recorder in front of the app
(benchmarks/claude_code.py).  SmolLM2's 8k context does not hold the prompt: Claude Code must
get the error it understands.

The Gemma 3 270M goinfer ships is the pretrained model, which does not end a chat turn by
itself: the server gets request defaults (greedy, a reply ends at its first line break) as
`goinfer serve --anthropic-defaults` gives them, so each turn is one request with a reply that
ends.  About 1-2 minutes on 2 cores: one cold prefill of the prompt, the rest from the cache."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import claude_agent_sdk
import pytest

from goinfer import hub
from goinfer.kv_cache import KVCache
from goinfer.model import Model
from goinfer.server.anthropic_request import DEFAULTS_ENV, parse_body
from goinfer.server.app import create_app
from goinfer.server.runner import prompt_ids

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))
from claude_code import (  # noqa: E402
    DEFAULTS,
    KEY,
    Recorder,
    claude_env,
    claude_path,
    replies,
    run_claude,
    serve,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def defaults():
    old = os.environ.get(DEFAULTS_ENV)
    os.environ[DEFAULTS_ENV] = json.dumps(DEFAULTS)
    yield
    if old is None:
        del os.environ[DEFAULTS_ENV]
    else:
        os.environ[DEFAULTS_ENV] = old


@pytest.fixture(scope="module")
def gemma(defaults, tmp_path_factory):
    """goinfer serve gemma3-270m (its default KV cache), recorded; a HOME and a project."""
    model = Model.load(str(hub.resolve("gemma3-270m", progress=False)), threads=2, progress=False)
    app = Recorder(create_app(model, KVCache(model), model_id="gemma3-270m", api_key=KEY))
    root = tmp_path_factory.mktemp("claude")
    (root / "home").mkdir()
    (root / "work").mkdir()
    with serve(app) as url:
        env = claude_env(url, root / "home", context=model.n_ctx, max_output=64)
        yield app, env, root / "work", model


def test_the_executable_is_there():
    p = claude_path()
    assert p is not None and os.access(p, os.X_OK), "claude-agent-sdk ships no claude executable"


def test_claude_p_two_turns_from_the_cache(gemma):
    """claude -p, then --continue: the second request reads from the cache everything before
    its first token that differs from the first request's prompt (Claude Code only appends),
    which is at least 95% of its prompt when the second turn adds only the new message."""
    app, env, work, model = gemma
    n0 = len(app.calls)
    one = run_claude(env, work, "Say hi.", "gemma3-270m")
    first = replies(app.calls[n0:])
    assert one.returncode == 0, (one.stdout, one.stderr[-2000:], first)
    assert len(first) == 1 and first[0]["status"] == 200
    r = first[0]
    assert r["stop_reason"] in ("end_turn", "stop_sequence") and r["text"].strip()
    assert one.stdout.strip() == r["text"].strip()
    # Claude Code's own prompt: system, tools, environment (9.7k-12k tokens seen, as the CLI
    # decides which tools to describe in full)
    assert r["prompt_tokens"] > 8000
    # a second turn of the same session: everything before the new prompt from the cache
    n1 = len(app.calls)
    two = run_claude(env, work, "Now say hello.", "gemma3-270m", resume=True)
    second = replies(app.calls[n1:])
    assert two.returncode == 0, (two.stdout, two.stderr[-2000:], second)
    (s,) = second
    assert two.stdout.strip() == s["text"].strip()
    assert r["text"].strip() in json.dumps(s["call"].request["messages"], ensure_ascii=False)
    assert s["prompt_tokens"] > r["prompt_tokens"]
    print(
        f"claude -p: {r['prompt_tokens']} prompt tokens, {r['cached_tokens']} cached; "
        f"--continue: {s['prompt_tokens']} prompt tokens, {s['cached_tokens']} cached "
        f"({100 * s['cached_tokens'] / s['prompt_tokens']:.1f}%)"
    )
    a, b = (
        prompt_ids(model, parse_body(c.request, model.vocab_size))[0]
        for c in (r["call"], s["call"])
    )
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert s["cached_tokens"] >= same // 16 * 16, (same, s)
    # Claude Code's first request of a session sometimes lacks ~2k tokens of context that it
    # sends from the second on (appended there, so they are new tokens); otherwise the new
    # turn is all the second request adds
    if len(b) - same < 0.05 * len(b):
        assert s["cached_tokens"] >= 0.95 * s["prompt_tokens"], s


def test_agent_sdk_query(gemma):
    """The Python SDK's query() (the same executable, driven over stream-json) with the CLI's
    preset prompt: its prompt first differs from the CLI's first request after ~3k tokens (the
    SDK's Bash tool states another background timeout); it resumes from the cache at the
    sliding window's kept point before that difference, and a second query past it."""
    app, env, work, model = gemma
    n0 = len(app.calls)
    opts = claude_agent_sdk.ClaudeAgentOptions(
        cwd=str(work),
        env=dict(env),
        model="gemma3-270m",
        cli_path=str(claude_path()),
        system_prompt={"type": "preset", "preset": "claude_code"},
    )

    async def ask():
        return [m async for m in claude_agent_sdk.query(prompt="Say hi.", options=opts)]

    msgs = asyncio.run(ask())
    (r,) = replies(app.calls[n0:])
    result = [m for m in msgs if isinstance(m, claude_agent_sdk.ResultMessage)]
    assert result and not result[-1].is_error, msgs
    said = [
        b.text
        for m in msgs
        if isinstance(m, claude_agent_sdk.AssistantMessage)
        for b in m.content
        if isinstance(b, claude_agent_sdk.TextBlock)
    ]
    assert said == [r["text"]] and r["status"] == 200
    cli = next(c for c in app.calls if c.path == "/v1/messages")  # claude -p's first

    def ids(call):
        return prompt_ids(model, parse_body(call.request, model.vocab_size))[0]

    a, b = ids(cli), ids(r["call"])
    same = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert same > 3000
    # Gemma 3's sliding layers keep their window KV only at kept points: every
    # window_point_every blocks and each prompt's end (docs/design/gemma.md, "KV cache: what
    # local layers store, and why prefix reuse stays correct"); the query resumes at the deepest
    # one at or before its first difference from the CLI's prompt ...
    probe = KVCache(model, max_tokens=64)
    every = probe.window_point_every * probe.block_size
    assert r["cached_tokens"] == (same // 16 * 16) // every * every, (same, every, r)
    # ... and the same query again resumes past that difference (its first run kept its end)
    n1 = len(app.calls)
    asyncio.run(ask())
    (r2,) = replies(app.calls[n1:])
    assert r2["status"] == 200 and r2["cached_tokens"] >= same // 16 * 16, (same, r2)


def test_a_context_too_small_is_claude_codes_error(tmp_path):
    """SmolLM2-135M's 8k context cannot hold Claude Code's prompt: a 400 in the wording Claude
    Code reads ("prompt is too long: N tokens > M maximum"), which it reports and does not
    retry."""
    model = Model.load(str(hub.resolve("smollm2-135m", progress=False)), threads=1, progress=False)
    app = Recorder(create_app(model, KVCache(model), model_id="smollm2-135m", api_key=KEY))
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    with serve(app) as url:
        env = claude_env(url, tmp_path / "home", context=model.n_ctx, max_output=64)
        out = run_claude(env, tmp_path / "work", "Say hi.", "smollm2-135m")
    (r,) = replies(app.calls)
    assert r["status"] == 400 and r["error"]["type"] == "invalid_request_error"
    msg = r["error"]["message"]
    assert msg.startswith("prompt is too long: ") and " maximum" in msg
    n, m = (int(x) for x in msg.split(": ", 1)[1].split(" maximum")[0].split(" tokens > "))
    assert n > 8191 == m
    assert out.returncode != 0
    assert "prompt is too long" in (out.stdout + out.stderr).lower(), (out.stdout, out.stderr)
