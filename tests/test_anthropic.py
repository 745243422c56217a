"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens), driven by the
official anthropic SDK, sync and async, and raw httpx for the wire: replies equal what
ChatSession.chat gives the same conversation in OpenAI's shape (the reference), streams follow
Anthropic's event order, tool calls validate, errors come as the SDK's typed errors."""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time

import anthropic
import jsonschema
import pytest
from test_server import Server, lone

from fixtures import hfconvert
from fixtures.compare import load
from goinfer import KVCache
from goinfer import generation as G
from goinfer.gguf import GGUFFile
from goinfer.model import Model
from goinfer.server.anthropic_request import unsign

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["C", "F"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
WEATHER_OA = {
    "type": "function",
    "function": {
        "name": WEATHER["name"],
        "description": WEATHER["description"],
        "parameters": WEATHER["input_schema"],
    },
}
SYSTEM = "You are terse."
ASK = "Tell me about caches."
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def model(tiny):
    # a context that holds the tool prompt (goinfer's built-in one: the tiny template has none)
    return Model(
        GGUFFile(tiny("llama", 3, max_position_embeddings=4096)[1]), threads=1, progress=False
    )


@pytest.fixture(scope="module")
def srv(model):
    with Server(model, ping_interval=0.05) as s:
        yield s


def client(srv, key="k", cls=anthropic.Anthropic):
    return cls(base_url=srv.url, api_key=key, max_retries=0, timeout=60)


def oa(system=SYSTEM, text=ASK):
    return [{"role": "system", "content": system}, {"role": "user", "content": text}]


def stop_reason(ref) -> str:
    return {"length": "max_tokens", "tool_calls": "tool_use"}.get(ref.finish_reason, "end_turn")


def sse(text: str) -> list[tuple[str, dict]]:
    """A raw SSE body -> [(event name, data)]."""
    out = []
    for block in text.split("\n\n"):
        if block:
            lines = dict(ln.split(": ", 1) for ln in block.split("\n"))
            out.append((lines["event"], json.loads(lines["data"])))
    return out


# ============================================================================ replies


def test_reply_equals_the_chat_reference(srv, model):
    ref = lone(model, chat=oa(), max_tokens=16, temperature=0.0)
    kw = dict(
        model="tiny",
        max_tokens=16,
        system=SYSTEM,
        messages=[{"role": "user", "content": ASK}],
        extra_body=GREEDY,
    )
    r = client(srv).messages.create(**kw)
    assert r.id.startswith("msg_") and (r.type, r.role, r.model) == ("message", "assistant", "tiny")
    assert [b.type for b in r.content] == ["text"] and r.content[0].text == ref.content
    assert r.stop_reason == stop_reason(ref) and r.stop_sequence is None
    u = r.usage
    assert u.input_tokens + u.cache_read_input_tokens == ref.prompt_tokens
    assert u.output_tokens == ref.completion_tokens and u.cache_creation_input_tokens == 0
    # the same again: its whole blocks come from the cache; async client, system as blocks
    bs = srv.cache.block_size

    async def again():
        async with client(srv, cls=anthropic.AsyncAnthropic) as c:
            return await c.messages.create(
                **dict(
                    kw,
                    system=[
                        {
                            "type": "text",
                            "text": "You are ",
                            "cache_control": {"type": "ephemeral"},
                        },
                        {"type": "text", "text": "terse."},
                    ],
                )
            )

    r2 = asyncio.run(again())
    assert r2.content[0].text == ref.content
    assert r2.usage.cache_read_input_tokens == (ref.prompt_tokens - 1) // bs * bs
    assert r2.usage.input_tokens == ref.prompt_tokens - r2.usage.cache_read_input_tokens


def test_stream_events_in_order(srv, model):
    ref = lone(model, chat=oa(), max_tokens=16, temperature=0.0)
    body = {
        "model": "tiny",
        "max_tokens": 16,
        "system": SYSTEM,
        "stream": True,
        "messages": [{"role": "user", "content": ASK}],
        **GREEDY,
    }
    events = sse(srv.post("/v1/messages", body).text)
    names = [e for e, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    body_names = [n for n in names[1:-2] if n != "ping"]
    assert body_names[0] == "content_block_start" and body_names[-1] == "content_block_stop"
    assert set(body_names[1:-1]) == {"content_block_delta"}
    assert all(d["type"] == e for e, d in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["usage"]["input_tokens"] == ref.prompt_tokens
    text = "".join(d["delta"]["text"] for e, d in events if e == "content_block_delta")
    assert text == ref.content
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": stop_reason(ref), "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == ref.completion_tokens
    # the SDK's stream helpers, sync and async, assemble the same message
    kw = dict(
        model="tiny",
        max_tokens=16,
        system=SYSTEM,
        messages=[{"role": "user", "content": ASK}],
        extra_body=GREEDY,
    )
    with client(srv).messages.stream(**kw) as s:
        got = "".join(s.text_stream)
        final = s.get_final_message()
    assert got == final.content[0].text == ref.content
    assert final.usage.output_tokens == ref.completion_tokens

    async def astream():
        async with client(srv, cls=anthropic.AsyncAnthropic) as c:
            async with c.messages.stream(**kw) as s:
                return await s.get_final_message()

    assert asyncio.run(astream()).content[0].text == ref.content


def test_pings_while_the_prompt_waits(srv):
    """Nothing to send yet (the engine held: a long prefill or a queue): ping events after
    message_start, which the SDK skips."""
    srv.engine.pause()
    out = {}

    def call():
        out["r"] = srv.post(
            "/v1/messages",
            {
                "model": "tiny",
                "max_tokens": 4,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )

    th = threading.Thread(target=call)
    th.start()
    time.sleep(0.5)
    srv.engine.resume()
    th.join(30)
    names = [e for e, _ in sse(out["r"].text)]
    assert names[0] == "message_start" and names[1] == "ping" and names.count("ping") >= 3
    assert names[-1] == "message_stop"


def test_stop_sequences(srv, model):
    ref = lone(model, chat=oa(), max_tokens=24, temperature=0.0)
    k = len(ref.content) // 2
    stop = ref.content[k : k + 3]
    assert ref.content.index(stop) > 0, ref.content
    r = client(srv).messages.create(
        model="tiny",
        max_tokens=24,
        system=SYSTEM,
        stop_sequences=["never-there", stop],
        messages=[{"role": "user", "content": ASK}],
        extra_body=GREEDY,
    )
    assert (r.stop_reason, r.stop_sequence) == ("stop_sequence", stop)
    assert r.content[0].text == ref.content[: ref.content.index(stop)]
    with client(srv).messages.stream(
        model="tiny",
        max_tokens=24,
        system=SYSTEM,
        stop_sequences=[stop],
        extra_body=GREEDY,
        messages=[{"role": "user", "content": ASK}],
    ) as s:
        final = s.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)
    assert final.content[0].text == r.content[0].text


def test_max_tokens_is_a_ceiling(srv, model):
    """Claude Code asks for 32000 tokens whatever the context: the reply may run to the end
    of the context (OpenAI's route refuses the same request)."""
    ref = lone(model, chat=oa(), max_tokens=12, temperature=0.0)
    stop = ref.content[len(ref.content) // 2 :][:4]
    r = client(srv).messages.create(
        model="tiny",
        max_tokens=10**6,
        system=SYSTEM,
        stop_sequences=[stop],
        extra_body=GREEDY,
        messages=[{"role": "user", "content": ASK}],
    )
    assert r.stop_reason == "stop_sequence"
    o = srv.post("/v1/chat/completions", {"messages": oa(), "max_tokens": 10**6})
    assert o.status_code == 400 and o.json()["error"]["code"] == "context_length_exceeded"


def test_max_tokens_zero_fills_the_cache(srv):
    text = "Cache warming. " * 40
    kw = dict(model="tiny", system=SYSTEM, messages=[{"role": "user", "content": text}])
    r = client(srv).messages.create(max_tokens=0, **kw)
    assert (r.stop_reason, r.usage.output_tokens, r.content[0].text) == ("max_tokens", 0, "")
    r2 = client(srv).messages.create(max_tokens=1, **kw)
    assert r2.usage.cache_read_input_tokens >= r.usage.input_tokens - srv.cache.block_size


# ============================================================================ tools


def test_tool_round_trip(srv, model):
    """A forced call validates against its schema; its result goes back as a tool_result and
    the model answers: both turns equal ChatSession.chat of the same conversation."""
    c = client(srv)
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    r = c.messages.create(
        model="tiny",
        max_tokens=200,
        tools=[WEATHER],
        messages=ask,
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=GREEDY,
    )
    ref = lone(
        model,
        chat=ask,
        tools=[WEATHER_OA],
        max_tokens=200,
        temperature=0.0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert r.stop_reason == "tool_use" == stop_reason(ref)
    (call,) = r.content
    assert call.type == "tool_use" and call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER["input_schema"])
    assert call.input == json.loads(ref.tool_calls[0]["function"]["arguments"])
    # streamed: the same call, its input in input_json_delta pieces
    with c.messages.stream(
        model="tiny",
        max_tokens=200,
        tools=[WEATHER],
        messages=ask,
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body=GREEDY,
    ) as s:
        kinds = [e.type for e in s]
        final = s.get_final_message()
    assert final.content[0].input == call.input and final.stop_reason == "tool_use"
    assert "input_json" in kinds
    # the result goes back; the model answers
    turn2 = ask + [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call.id,
                    "content": [{"type": "text", "text": "sunny, 21 C"}],
                }
            ],
        },
    ]
    r2 = c.messages.create(
        model="tiny",
        max_tokens=20,
        tools=[WEATHER],
        messages=turn2,
        tool_choice={"type": "none"},
        extra_body=GREEDY,
    )
    ref2 = lone(
        model,
        chat=ask
        + [ref.message(), {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}],
        tools=[WEATHER_OA],
        tool_choice="none",
        max_tokens=20,
        temperature=0.0,
    )
    assert [b.type for b in r2.content] == ["text"] and r2.content[0].text == ref2.content
    assert r2.usage.input_tokens + r2.usage.cache_read_input_tokens == ref2.prompt_tokens
    assert r2.usage.cache_read_input_tokens > 0  # the first turn's prompt, from the cache
    # an error result is marked as one
    err = json.loads(json.dumps(turn2))
    err[-1]["content"][0]["is_error"] = True
    n_ok = c.messages.count_tokens(model="tiny", tools=[WEATHER], messages=turn2).input_tokens
    n_err = c.messages.count_tokens(model="tiny", tools=[WEATHER], messages=err).input_tokens
    assert n_err > n_ok


def test_tool_choice_any_without_parallel_calls(srv, model):
    ask = [{"role": "user", "content": "Weather in Oslo and Rome?"}]
    r = client(srv).messages.create(
        model="tiny",
        max_tokens=200,
        tools=[WEATHER],
        messages=ask,
        extra_body=GREEDY,
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
    )
    ref = lone(
        model,
        chat=ask,
        tools=[WEATHER_OA],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
        temperature=0.0,
    )
    assert [b.type for b in r.content] == ["tool_use"] and len(ref.tool_calls) == 1
    assert r.content[0].input == json.loads(ref.tool_calls[0]["function"]["arguments"])


def test_count_tokens(srv, model):
    c = client(srv)
    ref = lone(model, chat=oa(), tools=[WEATHER_OA], max_tokens=1, temperature=0.0)
    n = c.messages.count_tokens(
        model="tiny", system=SYSTEM, tools=[WEATHER], messages=[{"role": "user", "content": ASK}]
    )
    assert n.input_tokens == ref.prompt_tokens
    r = srv.post(
        "/v1/messages/count_tokens?beta=true",
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
        headers={"anthropic-version": "2023-06-01"},
    )
    assert r.status_code == 200 and set(r.json()) == {"input_tokens"}


def test_structured_output(srv):
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    }
    r = client(srv).messages.create(
        model="tiny",
        max_tokens=20,
        extra_body=GREEDY,
        messages=[{"role": "user", "content": "A digit as JSON."}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    jsonschema.validate(json.loads(r.content[0].text), schema)


# ============================================================================ thinking


@pytest.fixture(scope="module")
def qwen():
    _, path = hfconvert.build("qwen35")
    m = load(path)
    with Server(m, KVCache(m, max_tokens=2048)) as s:
        yield s, m


def test_thinking_blocks(qwen):
    """A template with a reasoning channel (Qwen3.5: <think>): with thinking on, the reply's
    thinking is a thinking block (display "omitted": empty, its text in the signature); sent
    back either way, the next prompt is the one the thinking text itself gives."""
    srv, m = qwen
    c = client(srv)
    ask = [{"role": "user", "content": "Why is the sky blue?"}]
    kw = dict(model="tiny", max_tokens=40, messages=ask, extra_body=GREEDY)
    ref = lone(
        m, chat=ask, max_tokens=40, temperature=0.0, chat_template_kwargs={"enable_thinking": True}
    )
    assert ref.reasoning_content, "the reference reply has no thinking to compare"
    r = c.messages.create(thinking={"type": "enabled", "budget_tokens": 1024}, **kw)
    assert r.content[0].type == "thinking" and r.content[0].thinking == ref.reasoning_content
    assert unsign(r.content[0].signature) == ref.reasoning_content
    assert "".join(b.text for b in r.content[1:] if b.type == "text") == (ref.content or "")
    hidden = c.messages.create(thinking={"type": "adaptive", "display": "omitted"}, **kw)
    assert (
        hidden.content[0].thinking == ""
        and unsign(hidden.content[0].signature) == ref.reasoning_content
    )
    with c.messages.stream(thinking={"type": "enabled", "budget_tokens": 1024}, **kw) as s:
        final = s.get_final_message()
    assert final.content[0].thinking == ref.reasoning_content
    after = [{"role": "user", "content": "And at sunset?"}]
    n = [
        c.messages.count_tokens(
            model="tiny",
            thinking={"type": "enabled", "budget_tokens": 1024},
            messages=ask
            + [
                {
                    "role": "assistant",
                    "content": [b.model_dump(exclude_none=True) for b in x.content],
                }
            ]
            + after,
        ).input_tokens
        for x in (r, hidden)
    ]
    assert n[0] == n[1]
    # thinking off (the API's default): the template's empty block, no thinking block
    off = c.messages.create(**kw)
    assert all(b.type == "text" for b in off.content)


# ============================================================================ errors


def test_errors_are_typed(srv, model):
    c = client(srv)
    user = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(
            model="tiny",
            max_tokens=4,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "aGk="},
                        }
                    ],
                }
            ],
        )
    assert e.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "messages[0].content[0]: image blocks are not supported: this model reads "
            "text only",
        },
    }
    for extra, word in (
        ({"container": "c1"}, "container"),
        ({"top_k": -1}, "top_k"),
        ({"unknown_field": 1}, "unknown_field"),
    ):
        with pytest.raises(anthropic.BadRequestError, match=word):
            c.messages.create(model="tiny", max_tokens=4, messages=user, extra_body=extra)
    with pytest.raises(
        anthropic.BadRequestError, match=r"tools\[0\]: tools of type 'web_search_20250305'"
    ):
        c.messages.create(
            model="tiny",
            max_tokens=4,
            messages=user,
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
        )
    with pytest.raises(anthropic.BadRequestError) as e:  # the index of the tool at fault
        c.messages.create(
            model="tiny",
            max_tokens=4,
            messages=user,
            tools=[dict(WEATHER, defer_loading=True), {"name": "bad name", "input_schema": {}}],
        )
    assert e.value.body["error"]["message"].startswith("tools[1].name must be")
    with pytest.raises(anthropic.BadRequestError, match=r"tools\[0\].input_schema"):
        c.messages.create(model="tiny", max_tokens=4, messages=user, tools=[{"name": "x"}])
    with pytest.raises(anthropic.BadRequestError, match="prefill"):
        c.messages.create(
            model="tiny", max_tokens=4, messages=user + [{"role": "assistant", "content": "Sure, "}]
        )
    with pytest.raises(anthropic.BadRequestError, match="clear_tool_uses"):
        c.messages.create(
            model="tiny",
            max_tokens=4,
            messages=user,
            extra_body={"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
        )
    r = srv.post("/v1/messages", {"model": "tiny", "messages": user})
    assert r.status_code == 400 and r.json()["error"]["message"] == "max_tokens: Field required"
    # a prompt longer than the context: Claude Code's wording, both numbers
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(
            model="tiny", max_tokens=4, messages=[{"role": "user", "content": "word " * 5000}]
        )
    m = re.match(
        r"prompt is too long: (\d+) tokens > (\d+) maximum", e.value.body["error"]["message"]
    )
    assert m and int(m[1]) > int(m[2]) == min(model.n_ctx, srv.cache.max_tokens - 16) - 1, (
        e.value.message
    )


def test_api_key_in_either_header(model):
    with Server(model, api_key="secret") as s:
        user = [{"role": "user", "content": "hi"}]
        with pytest.raises(anthropic.AuthenticationError) as e:
            client(s, key="wrong").messages.create(model="tiny", max_tokens=2, messages=user)
        assert e.value.body["type"] == "error"
        assert e.value.body["error"]["type"] == "authentication_error"
        assert (
            client(s, key="secret")
            .messages.create(model="tiny", max_tokens=2, messages=user)
            .usage.output_tokens
            <= 2
        )
        body = {"model": "tiny", "max_tokens": 2, "messages": user}
        assert s.post("/v1/messages", body, headers={"x-api-key": "secret"}).status_code == 200
        assert (
            s.post("/v1/messages", body, headers={"Authorization": "Bearer secret"}).status_code
            == 200
        )
        assert (
            s.post(
                "/v1/chat/completions",
                {"messages": user, "max_tokens": 2},
                headers={"x-api-key": "secret"},
            ).status_code
            == 200
        )


def test_queue_full_is_a_rate_limit_error(model):
    with Server(model, max_queue=1) as s:
        s.engine.pause()
        user = [{"role": "user", "content": "hi"}]
        th = threading.Thread(
            target=lambda: client(s).messages.create(model="tiny", max_tokens=2, messages=user)
        )
        th.start()
        s.wait(lambda: s.engine.queue_depth == 1, "one request queued")
        with pytest.raises(anthropic.RateLimitError) as e:
            client(s).messages.create(model="tiny", max_tokens=2, messages=user)
        assert e.value.body["error"]["type"] == "rate_limit_error"
        s.engine.resume()
        th.join(30)


def test_failure_after_the_stream_began_is_an_error_event(srv, monkeypatch):
    """The generation fails mid-reply: the stream ends with an error event (the SDK raises),
    never a silent end."""
    push = G.Generation.push
    calls = {"n": 0}

    def failing(self, logits):
        calls["n"] += 1
        if calls["n"] == 4:
            raise RuntimeError("injected failure")
        return push(self, logits)

    monkeypatch.setattr(G.Generation, "push", failing)
    body = {
        "model": "tiny",
        "max_tokens": 12,
        "stream": True,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": ASK}],
        **GREEDY,
    }
    events = sse(srv.post("/v1/messages", body).text)
    assert events[0][0] == "message_start" and events[-1][0] == "error"
    assert events[-1][1] == {
        "type": "error",
        "error": {"type": "api_error", "message": "generation failed: injected failure"},
    }
    assert "message_stop" not in [e for e, _ in events]
    calls["n"] = 0
    with pytest.raises(anthropic.APIStatusError, match="injected failure"):
        with client(srv).messages.stream(
            model="tiny",
            max_tokens=12,
            system=SYSTEM,
            messages=[{"role": "user", "content": ASK}],
            extra_body=GREEDY,  # the raw request's reply: sampled, it may end before token 4
        ) as s:
            for _ in s:
                pass


# ============================================================================ server options


def test_serve_options(monkeypatch, model, tiny):
    """--anthropic-normalize and --anthropic-defaults are checked, then handed to the route
    (and to Ray's processes) through the environment."""
    import uvicorn

    from goinfer import cli
    from goinfer.server.anthropic_request import DEFAULTS_ENV, NORMALIZE_ENV

    path = str(tiny("llama", 3, max_position_embeddings=4096)[1])
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: None)
    monkeypatch.delenv(NORMALIZE_ENV, raising=False)
    monkeypatch.delenv(DEFAULTS_ENV, raising=False)
    assert cli.main(["serve", "check", "http://127.0.0.1:9"]) == 1  # still the check client
    assert cli.main(["serve", path, "--anthropic-normalize", "billing_headers"]) == 2
    assert cli.main(["serve", path, "--anthropic-defaults", '{"temperature": 5}']) == 2
    assert cli.main(["serve", path, "--anthropic-defaults", '{"seed": 1}']) == 2
    assert (
        cli.main(
            [
                "serve",
                path,
                "--anthropic-normalize",
                "billing_header,deferred_tools",
                "--anthropic-defaults",
                '{"top_k": 40}',
            ]
        )
        == 0
    )
    assert os.environ[NORMALIZE_ENV] == "billing_header,deferred_tools"
    assert json.loads(os.environ[DEFAULTS_ENV]) == {"top_k": 40}


def test_request_defaults(srv, model, monkeypatch):
    """Server defaults apply to the fields a request leaves out, never over its own."""
    from goinfer.server.anthropic_request import DEFAULTS_ENV

    ref = lone(model, chat=oa(), max_tokens=16, temperature=0.0)
    k = len(ref.content) // 2
    stop = ref.content[k : k + 3]
    monkeypatch.setenv(DEFAULTS_ENV, json.dumps({"temperature": 0, "stop_sequences": [stop]}))
    kw = dict(
        model="tiny", max_tokens=16, system=SYSTEM, messages=[{"role": "user", "content": ASK}]
    )
    r = client(srv).messages.create(**kw)
    assert (r.stop_reason, r.content[0].text) == (
        "stop_sequence",
        ref.content[: ref.content.index(stop)],
    )
    r = client(srv).messages.create(stop_sequences=["never-there"], **kw)
    assert (r.stop_reason, r.content[0].text) == (stop_reason(ref), ref.content)
