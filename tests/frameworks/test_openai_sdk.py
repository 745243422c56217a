"""The official openai SDK on what the frameworks above rely on and OpenAI's API defines:
closed objects in tool arguments and json_schema replies, tool_choice allowed_tools, the
request fields OpenAI defines, GET /v1/models/{id}, n > 1, /v1/embeddings and llama.cpp's
/tokenize and /detokenize."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from common import MAX_TOKENS, TEMPERATURE, WEATHER_TOOL, json_args
from openai import OpenAI


def _client(server) -> OpenAI:
    return OpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0)


def _kw(server, **over) -> dict:
    return {"model": server.model, "temperature": TEMPERATURE, "max_tokens": MAX_TOKENS, **over}


# ============================================================================ closed objects
# A schema with `properties` and no `additionalProperties` is a closed object, as OpenAI and
# llama.cpp's schema converter read it.  The prompts ask for more than the schema declares, so
# a model left free to add keys adds them.


def test_tool_arguments_have_only_declared_keys(server):
    """A forced call of a tool whose schema has no additionalProperties: complete JSON
    arguments, the declared key only."""
    msgs = [
        {
            "role": "user",
            "content": "What is the weather in Paris? Give it in celsius for the next 3 days.",
        }
    ]
    r = _client(server).chat.completions.create(
        messages=msgs,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        **_kw(server),
    )
    ch = r.choices[0]
    assert ch.message.tool_calls, ch.message
    json_args(ch.message.tool_calls[0].function.arguments, {"city"})
    assert ch.finish_reason == "tool_calls"


def test_json_schema_reply_has_only_declared_keys(server):
    """response_format json_schema (not strict), no additionalProperties: the reply has the
    declared keys only and ends by itself."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    msgs = [
        {
            "role": "user",
            "content": "Ada Lovelace, 36, a mathematician from London, born "
            "in 1815. Extract her as JSON.",
        }
    ]
    r = _client(server).chat.completions.create(
        messages=msgs,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": schema},
        },
        **_kw(server),
    )
    ch = r.choices[0]
    assert ch.finish_reason == "stop", f"finish_reason {ch.finish_reason}: {ch.message.content!r}"
    json_args(ch.message.content, {"name", "age"})


# ============================================================================ allowed_tools


def _tool(name: str, what: str) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Get the {what} of a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }


THREE_TOOLS = [
    _tool("get_weather", "weather"),
    _tool("get_time", "local time"),
    _tool("get_population", "population"),
]


@pytest.mark.parametrize("mode", ["required", "auto"])
def test_allowed_tools(server, mode):
    """tool_choice {"type": "allowed_tools", ...}: only the listed tools may be called (and
    with "required" one must be); all three stay declared."""
    allowed = ["get_weather", "get_time"]
    choice = {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": mode,
            "tools": [{"type": "function", "function": {"name": n}} for n in allowed],
        },
    }
    msgs = [{"role": "user", "content": "How many people live in Paris, and what is the weather?"}]
    r = _client(server).chat.completions.create(
        messages=msgs, tools=THREE_TOOLS, tool_choice=choice, **_kw(server)
    )
    calls = r.choices[0].message.tool_calls or []
    if mode == "required":
        assert calls, r.choices[0].message
    for c in calls:
        assert c.function.name in allowed, c
        json_args(c.function.arguments, {"city"})


# ============================================================================ OpenAI's fields

NULL_FIELDS = [
    "audio",
    "prediction",
    "web_search_options",
    "functions",
    "function_call",
    "moderation",
    "prompt_cache_options",
    "prompt_cache_retention",
]


@pytest.mark.parametrize("field", NULL_FIELDS)
def test_openai_field_null_is_accepted(server, field):
    """A field OpenAI defines, sent as null (as clients that fill every field do), is no
    reason to refuse a request."""
    r = _client(server).chat.completions.create(
        messages=[{"role": "user", "content": "Say hi."}],
        **_kw(server, max_tokens=4),
        extra_body={field: None},
    )
    assert r.choices[0].message.content is not None


@pytest.mark.parametrize(
    "field,value",
    [
        ("prompt_cache_retention", "in_memory"),
        ("prompt_cache_retention", "24h"),
        ("prediction", {"type": "content", "content": "Hi there."}),
    ],
    ids=["prompt_cache_retention-in_memory", "prompt_cache_retention-24h", "prediction"],
)
def test_openai_field_noop_value_is_accepted(server, field, value):
    """Values that cannot change the reply (a cache-retention hint, a predicted output) are
    accepted."""
    r = _client(server).chat.completions.create(
        messages=[{"role": "user", "content": "Say hi."}],
        **_kw(server, max_tokens=4),
        extra_body={field: value},
    )
    assert r.choices[0].message.content is not None


@pytest.mark.parametrize(
    "field,value",
    [
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("web_search_options", {"search_context_size": "low"}),
    ],
    ids=["audio", "web_search_options"],
)
def test_openai_field_unhonoured_value_is_400(server, field, value):
    """A value the server cannot honour and that would change the reply: 400 naming it."""
    with pytest.raises(openai.BadRequestError) as e:
        _client(server).chat.completions.create(
            messages=[{"role": "user", "content": "Say hi."}],
            **_kw(server, max_tokens=4),
            extra_body={field: value},
        )
    assert e.value.body["param"] == field, e.value.body


def test_legacy_functions(server):
    """functions / function_call (OpenAI's deprecated form of tools): a forced call comes
    back as message.function_call, finish_reason "function_call"."""
    fn = WEATHER_TOOL["function"]
    r = _client(server).chat.completions.create(
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        functions=[fn],
        function_call={"name": "get_weather"},
        **_kw(server),
    )
    ch = r.choices[0]
    assert ch.message.function_call is not None, ch.message
    assert ch.message.function_call.name == "get_weather"
    json_args(ch.message.function_call.arguments, {"city"})
    assert ch.finish_reason == "function_call"


# ============================================================================ models


def test_models_retrieve(server):
    """GET /v1/models/{id}: the served model; an unknown id is a 404 in OpenAI's error shape."""
    c = _client(server)
    m = c.models.retrieve(server.model)
    assert m.id == server.model and m.object == "model"
    with pytest.raises(openai.NotFoundError) as e:
        c.models.retrieve("no-such-model")
    assert isinstance(e.value.body, dict) and e.value.body.get("message"), e.value.body


# ============================================================================ n > 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_n_choices(server, stream):
    """n=3 at temperature 1 (seeded): three choices, indexes 0-2, each a reply of its own;
    usage counts the tokens of all of them (each choice's logprobs list one entry a token)."""
    kw = _kw(server, temperature=1.0, seed=7, n=3, max_tokens=24)
    msgs = [{"role": "user", "content": "Write a short sentence about the sea."}]
    c = _client(server)
    if not stream:
        r = c.chat.completions.create(messages=msgs, logprobs=True, **kw)
        texts = {ch.index: ch.message.content for ch in r.choices}
        per_choice = sum(len(ch.logprobs.content) for ch in r.choices)
        assert r.usage.completion_tokens == per_choice, (r.usage, per_choice)
    else:
        texts, usage = {}, None
        for chunk in c.chat.completions.create(
            messages=msgs, stream=True, stream_options={"include_usage": True}, **kw
        ):
            for ch in chunk.choices:
                texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
            usage = chunk.usage or usage
        assert usage is not None and usage.completion_tokens >= 3, usage
    assert sorted(texts) == [0, 1, 2], texts
    assert all(t.strip() for t in texts.values()), texts
    assert len(set(texts.values())) > 1, texts  # sampled independently


# ============================================================================ embeddings, tokens


def test_embeddings(server):
    """POST /v1/embeddings exists: vectors of one size for a batch, or, for a model that
    does not embed, a 400 naming the model; never a 404."""
    r = httpx.post(
        server.base_url + "/embeddings",
        timeout=120,
        json={"model": server.model, "input": ["Hello world.", "Good night."]},
    )
    if r.status_code == 200:
        data = r.json()["data"]
        assert [d["index"] for d in data] == [0, 1]
        dims = {len(d["embedding"]) for d in data}
        assert len(dims) == 1 and dims.pop() > 0
        assert data[0]["embedding"] != data[1]["embedding"]
    else:
        assert r.status_code == 400, f"{r.status_code}: {r.text[:200]}"
        assert r.json()["error"]["param"] == "model", r.text


def test_tokenize_detokenize(server):
    """llama.cpp's POST /tokenize {"content"} -> {"tokens"} and /detokenize back: the round
    trip gives the text, and the count is the prompt's (a completion's prompt_tokens, less
    the BOS a completion may add)."""
    text = "Hello world, this is goinfer."
    r = httpx.post(server.root + "/tokenize", json={"content": text}, timeout=60)
    assert r.status_code == 200, f"{r.status_code}: {r.text[:200]}"
    tokens = r.json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens), tokens
    r = httpx.post(server.root + "/detokenize", json={"tokens": tokens}, timeout=60)
    assert r.status_code == 200, f"{r.status_code}: {r.text[:200]}"
    assert r.json()["content"] == text
    used = (
        _client(server)
        .completions.create(model=server.model, prompt=text, max_tokens=1, temperature=0)
        .usage.prompt_tokens
    )
    assert used - len(tokens) in (0, 1), (used, len(tokens))


def test_error_body_is_openai_shaped(server):
    """A refused request answers {"error": {"message", "type", "param", "code"}} (the shape
    the SDKs parse), so the tests above fail on their own terms."""
    r = httpx.post(
        server.base_url + "/chat/completions",
        timeout=60,
        json={"model": server.model, "messages": [], "max_tokens": 1},
    )
    assert r.status_code == 400
    assert set(json.loads(r.text)["error"]) >= {"message", "type", "param", "code"}
