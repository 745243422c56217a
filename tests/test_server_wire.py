"""The server's wire bytes for Chat Completions and Completions, pinned.

Two kinds of checks:

- the shape OpenAI documents for a streamed tool call (a first chunk with the role, the call's
  id, type and name in its first delta, then only pieces of its arguments, a last chunk with
  ``finish_reason`` and an empty delta, the usage chunk, ``data: [DONE]``), and that the
  official client assembles the streamed call into the non-streamed one;
- a regression pin: the exact bytes this server sends for a set of requests (tool calls,
  reasoning, logprobs carried across parsed pieces, the legacy completions logprobs, errors),
  recorded in ``data/server_wire.json``.  Only what changes from run to run is masked: ids,
  creation times, the fingerprint and timing figures.  Rewrite the record (after checking the
  new bytes by hand) with ``python test_server_wire.py --record``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from test_server import Server, msgs, sse_events

from fixtures import hfconvert
from fixtures.compare import load
from goinfer import KVCache

RECORD = Path(__file__).parent / "data" / "server_wire.json"

LEVEL = [
    {
        "type": "function",
        "function": {
            "name": "set_level",
            "parameters": {
                "type": "object",
                "properties": {
                    "level": {"type": "integer", "minimum": 0, "maximum": 9},
                    "on": {"type": "boolean"},
                },
                "required": ["level", "on"],
                "additionalProperties": False,
            },
        },
    }
]

_MASKS = [
    (re.compile(r'"id":"(chatcmpl|cmpl)-[0-9a-f]{24}"'), r'"id":"\1-ID"'),
    (re.compile(r'"id":"call_[A-Za-z0-9]{24}"'), '"id":"call_ID"'),
    (re.compile(r'"created":\d+'), '"created":0'),
    (re.compile(r'"system_fingerprint":"goinfer-[0-9a-f]{12}"'), '"system_fingerprint":"FP"'),
    (
        re.compile(
            r'"(prompt_ms|prompt_per_second|predicted_ms|predicted_per_second)":'
            r"[-+0-9.eE]+"
        ),
        r'"\1":0',
    ),
    (re.compile(r": ping\n\n"), ""),
]


def masked(text: str) -> str:
    for pat, rep in _MASKS:
        text = pat.sub(rep, text)
    return text


# ============================================================================ the requests

# (name, path, body): run in this order on a fresh server per model (the cache counts in
# usage depend on the requests before)
TINY_CASES = [
    (
        "chat_stream_tool_required_logprobs",
        "/v1/chat/completions",
        dict(
            messages=msgs("Set level 3."),
            tools=LEVEL,
            tool_choice="required",
            max_tokens=100,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
            parallel_tool_calls=False,
            stream=True,
            stream_options={"include_usage": True},
        ),
    ),
    (
        "chat_tool_required_logprobs",
        "/v1/chat/completions",
        dict(
            messages=msgs("Set level 3."),
            tools=LEVEL,
            tool_choice="required",
            max_tokens=100,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
            parallel_tool_calls=False,
        ),
    ),
    (
        "chat_stream_tool_auto",
        "/v1/chat/completions",
        dict(
            messages=msgs("Set level 3."),
            tools=LEVEL,
            tool_choice="auto",
            max_tokens=24,
            temperature=0.8,
            seed=5,
            stream=True,
        ),
    ),
    (
        "chat_stream_plain_stop",
        "/v1/chat/completions",
        dict(
            messages=msgs("say something"),
            max_tokens=20,
            temperature=0,
            stop=["zz"],
            stream=True,
            logprobs=True,
        ),
    ),
    (
        "chat_plain",
        "/v1/chat/completions",
        dict(
            messages=msgs("say something"),
            max_tokens=12,
            temperature=0,
            response_format={"type": "json_object"},
            return_tokens=True,
        ),
    ),
    (
        "completion_stream_logprobs",
        "/v1/completions",
        dict(
            prompt="the cat sat on",
            max_tokens=10,
            temperature=0,
            logprobs=2,
            stream=True,
            stream_options={"include_usage": True},
        ),
    ),
    (
        "completion_logprobs",
        "/v1/completions",
        dict(prompt=[5, 6, 7], max_tokens=6, temperature=0, logprobs=1, return_tokens=True),
    ),
    ("error_bad_param", "/v1/chat/completions", dict(messages=msgs("hi"), temperature=5)),
    ("error_unknown_field", "/v1/completions", dict(prompt="x", nope=1)),
    (
        "error_tool_choice",
        "/v1/chat/completions",
        dict(
            messages=msgs("hi"),
            tools=LEVEL,
            tool_choice={"type": "function", "function": {"name": "other"}},
        ),
    ),
    ("error_context", "/v1/chat/completions", dict(messages=msgs("hi"), max_tokens=100000)),
]

QWEN_CASES = [
    (
        "qwen_stream_think_call_logprobs",
        "/v1/chat/completions",
        dict(
            messages=msgs("Set level 3."),
            tools=LEVEL,
            tool_choice="required",
            max_tokens=120,
            temperature=0,
            logprobs=True,
            stream=True,
            logit_bias={"THINK_CLOSE": 1},
        ),
    ),
    (
        "qwen_think_call",
        "/v1/chat/completions",
        dict(
            messages=msgs("Set level 3."),
            tools=LEVEL,
            tool_choice="required",
            max_tokens=120,
            temperature=0,
            logit_bias={"THINK_CLOSE": 1},
        ),
    ),
    (
        "qwen_stream_thinking_off",
        "/v1/chat/completions",
        dict(
            messages=msgs("Set level 3."),
            max_tokens=12,
            temperature=0,
            stream=True,
            chat_template_kwargs={"enable_thinking": False},
        ),
    ),
]


def tiny_server(tmp: Path) -> Server:
    """A tiny llama with room for the built-in tool prompt (~740 tokens of bytes)."""
    from fixtures import tinymodels

    hf = tinymodels.hf_model("llama", 5, max_position_embeddings=4096)
    m = load(tinymodels.write_gguf(hf, "llama", tmp / "wire-tiny.gguf"))
    return Server(m, KVCache(m, max_tokens=4096), ping_interval=3600)


def qwen_server():
    _, path = hfconvert.build("qwen35")
    m = load(path)
    return Server(m, KVCache(m, max_tokens=2048), ping_interval=3600), m


def run_cases(srv, cases, model=None) -> dict[str, str]:
    out = {}
    for name, path, body in cases:
        if model is not None and "logit_bias" in body:
            body = dict(
                body,
                logit_bias={
                    str(model.tokenizer.token_to_id("</think>")): v
                    for v in body["logit_bias"].values()
                },
            )
        r = srv.post(path, body)
        out[name] = f"{r.status_code} {r.headers['content-type']}\n" + masked(r.text)
    return out


def record(tmp: Path) -> dict[str, str]:
    with tiny_server(tmp) as s:
        out = run_cases(s, TINY_CASES)
    srv, m = qwen_server()
    with srv as s:
        out.update(run_cases(s, QWEN_CASES, m))
    return out


# ============================================================================ tests


@pytest.fixture(scope="module")
def tiny_srv(tmp_path_factory):
    with tiny_server(tmp_path_factory.mktemp("wire")) as s:
        yield s


@pytest.fixture(scope="module")
def pinned() -> dict[str, str]:
    return json.loads(RECORD.read_text())


def test_wire_bytes_tiny(tmp_path, pinned):
    with tiny_server(tmp_path) as s:  # its own server: usage counts depend on the cache
        got = run_cases(s, TINY_CASES)
    for name, _, _ in TINY_CASES:
        assert got[name] == pinned[name], name


def test_wire_bytes_reasoning_model(pinned):
    srv, m = qwen_server()
    with srv as s:
        got = run_cases(s, QWEN_CASES, m)
    for name, _, _ in QWEN_CASES:
        assert got[name] == pinned[name], name


def test_streamed_tool_call_has_openais_shape(tiny_srv):
    """The documented chunk sequence of a streamed call (id, type and name once, in the
    call's first delta, with the first piece of its arguments), and the pieces add up to the
    non-streamed reply's call."""
    _, path, body = TINY_CASES[0]
    ev = sse_events(tiny_srv.post(path, body).text)
    assert ev[-1] == "[DONE]"
    chunks = ev[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    calls = [
        c["choices"][0]["delta"]["tool_calls"][0]
        for c in chunks
        if c["choices"] and "tool_calls" in c["choices"][0]["delta"]
    ]
    first, rest = calls[0], calls[1:]
    assert set(first) == {"index", "id", "type", "function"} and first["type"] == "function"
    assert first["function"]["name"] == "set_level"
    assert rest and all(
        set(d) == {"index", "function"} and set(d["function"]) == {"arguments"} for d in rest
    )
    end, usage = chunks[-2], chunks[-1]
    assert end["choices"][0]["finish_reason"] == "tool_calls"
    assert end["choices"][0]["delta"] == {}
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0
    args = "".join(d["function"]["arguments"] for d in calls)
    whole = tiny_srv.post(
        path, {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    ).json()
    (call,) = whole["choices"][0]["message"]["tool_calls"]
    assert (call["function"]["name"], call["function"]["arguments"]) == ("set_level", args)
    # the logprobs entries of every chunk add up to the non-streamed list
    streamed = [
        e
        for c in chunks
        if c["choices"] and c["choices"][0]["logprobs"]
        for e in c["choices"][0]["logprobs"]["content"]
    ]
    assert streamed == whole["choices"][0]["logprobs"]["content"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python test_server_wire.py --record")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["GOINFER_LAYOUT_DIR"] = tmp  # no layout cache left behind
        pins = record(Path(tmp))
    RECORD.write_text(json.dumps(pins, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {RECORD}")
