"""Tool calling through the OpenAI-compatible server, driven by the official openai client:
SmolLM2 and Gemma 3 (real models) make calls whose arguments validate against their tools'
schemas with tool_choice "required" and a named function, streamed calls assemble with the
client's helper, a two-turn tool conversation reuses the cache; bad tool input is a 400
naming the field before any token, and the server goes on."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from test_server import BAD_BODIES, Server, msgs

from fixtures.compare import load
from goinfer import KVCache, hub
from goinfer.model import Model


@pytest.fixture(scope="module")
def srv(tiny):
    with Server(load(tiny("llama", 3)[1])) as s:
        yield s


# ============================================================================ bad input


def test_bad_tools_get_400_before_any_token_and_the_server_goes_on(srv):
    tool_bodies = [b for b, p in BAD_BODIES if "tool" in json.dumps(b)]
    assert len(tool_bodies) >= 7
    c = srv.client()
    n0 = srv.engine.n_finished
    for body in tool_bodies:
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="tiny", **body)
        assert e.value.body["param"]
        assert srv.engine.n_finished == n0  # nothing was generated
        ok = c.chat.completions.create(model="tiny", messages=msgs("hi"), max_tokens=2)
        assert ok.choices[0].finish_reason in ("stop", "length")
        n0 = srv.engine.n_finished


# ============================================================================ logprobs with tools

TINY_TOOLS = [
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


@pytest.fixture(scope="module")
def long_srv(tiny):
    """A tiny model with room for the built-in tool prompt (~740 tokens of bytes)."""
    m = load(tiny("llama", 5, max_position_embeddings=4096)[1])
    with Server(m, KVCache(m, max_tokens=4096)) as s:
        yield s


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_streamed_tool_calls_carry_logprobs(long_srv, choice):
    """stream + logprobs + tools: the chunks (content and tool_calls deltas alike) carry the
    logprobs entries of their tokens; all of them together are the non-streamed reply's list,
    one per completion token, and the calls are the same."""
    c = long_srv.client()
    kw = dict(
        model="tiny",
        messages=msgs("Set level 3."),
        tools=TINY_TOOLS,
        tool_choice=choice,
        max_tokens=100,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        parallel_tool_calls=False,
        stream_options={"include_usage": True},
    )
    whole = c.chat.completions.create(**{k: v for k, v in kw.items() if k != "stream_options"})
    ch = whole.choices[0]
    full = [e.model_dump() for e in ch.logprobs.content]
    assert len(full) == whole.usage.completion_tokens  # the stop token is not counted
    chunks = list(c.chat.completions.create(stream=True, **kw))
    streamed = [
        e.model_dump()
        for x in chunks
        if x.choices and x.choices[0].logprobs
        for e in x.choices[0].logprobs.content
    ]
    # the same entries, bit for bit: the second request reuses the first one's cached prompt,
    # and a row's attention kernel depends on its position only (not on the cold prefill's size)
    assert streamed == full
    calls = [x for x in chunks if x.choices and x.choices[0].delta.tool_calls]
    if choice == "required":
        assert ch.finish_reason == "tool_calls" and calls
        assert any(x.choices[0].logprobs for x in calls)  # the calls' tokens come with them
    final = chunks[-2].choices[0]
    assert final.finish_reason == ch.finish_reason


def test_allowed_tools_through_the_client(long_srv):
    """tool_choice {"type": "allowed_tools", ...} as the openai SDK sends it (pydantic-ai does
    when a step may use only some tools): 200, every call is of an allowed tool, "required"
    makes one; the prompt keeps every tool (the same prompt tokens as "auto")."""
    tools = TINY_TOOLS + [
        {
            "type": "function",
            "function": {"name": "reset", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    c = long_srv.client()
    auto = c.chat.completions.create(
        model="tiny", messages=msgs("Set level 3."), tools=tools, max_tokens=1, temperature=0
    )
    for mode in ("required", "auto"):
        choice = {
            "type": "allowed_tools",
            "allowed_tools": {
                "mode": mode,
                "tools": [{"type": "function", "function": {"name": "set_level"}}],
            },
        }
        r = c.chat.completions.create(
            model="tiny",
            messages=msgs("Set level 3."),
            tools=tools,
            tool_choice=choice,
            max_tokens=100,
            temperature=1.0,
            seed=3,
            parallel_tool_calls=False,
        )
        assert r.usage.prompt_tokens == auto.usage.prompt_tokens
        calls = r.choices[0].message.tool_calls or []
        if mode == "required":
            assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1
        for t in calls:
            assert t.function.name == "set_level"
            jsonschema.validate(
                json.loads(t.function.arguments), TINY_TOOLS[0]["function"]["parameters"]
            )


def test_deprecated_functions_work_as_tools(long_srv):
    """functions / function_call (OpenAI's deprecated form, which some frameworks still
    send): a forced call comes back as message.function_call with finish_reason
    "function_call" (streamed as delta.function_call); a history in that form (an assistant
    function_call, a "function" result) renders as the same history in tool form."""
    fn = TINY_TOOLS[0]["function"]
    c = long_srv.client()
    kw = dict(
        model="tiny",
        messages=msgs("Please set the level to 4."),
        functions=[fn],
        function_call={"name": "set_level"},
        max_tokens=100,
        temperature=0,
    )
    r = c.chat.completions.create(**kw)
    ch = r.choices[0]
    assert ch.finish_reason == "function_call" and ch.message.tool_calls is None, ch
    assert ch.message.function_call.name == "set_level"
    jsonschema.validate(json.loads(ch.message.function_call.arguments), fn["parameters"])
    name, args = None, ""
    for chunk in c.chat.completions.create(stream=True, **kw):
        for x in chunk.choices:
            if x.delta.function_call is not None:
                name = x.delta.function_call.name or name
                args += x.delta.function_call.arguments or ""
            finish = x.finish_reason or None
    assert (name, args, finish) == (
        "set_level",
        ch.message.function_call.arguments,
        "function_call",
    )
    call = {"name": "set_level", "arguments": ch.message.function_call.arguments}
    old_form = msgs("Please set the level to 4.") + [
        {"role": "assistant", "content": None, "function_call": call},
        {"role": "function", "name": "set_level", "content": "done"},
    ]
    new_form = msgs("Please set the level to 4.") + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call00001", "type": "function", "function": call}],
        },
        {"role": "tool", "tool_call_id": "call00001", "content": "done"},
    ]
    a = c.chat.completions.create(
        model="tiny", messages=old_form, functions=[fn], max_tokens=8, temperature=0
    )
    b = c.chat.completions.create(
        model="tiny",
        messages=new_form,
        tools=TINY_TOOLS,
        parallel_tool_calls=False,
        max_tokens=8,
        temperature=0,
    )
    assert a.usage.prompt_tokens == b.usage.prompt_tokens
    assert a.choices[0].message.content == b.choices[0].message.content


def _common(a, b) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_tool_round_trip_reuses_the_prompt_and_the_reply(long_srv):
    """Turn 2 sends turn 1's messages, its call and the tool's result: the cache serves turn
    1's prompt and its reply's tokens, up to the first token where the reply (as sampled)
    differs from the tokenizer's own split of the re-rendered call, in whole cache blocks
    (usage.prompt_tokens_details.cached_tokens)."""
    from goinfer.chat import prepare_chat

    c, m = long_srv.client(), long_srv.model
    messages = msgs("Set level 3.")
    kw = dict(model="tiny", tools=TINY_TOOLS, temperature=0, extra_body={"return_tokens": True})
    r1 = c.chat.completions.create(
        messages=messages, tool_choice="required", max_tokens=100, parallel_tool_calls=False, **kw
    )
    assert r1.choices[0].finish_reason == "tool_calls"
    m1 = r1.choices[0].message
    messages = (
        messages
        + [m1.model_dump(exclude_none=True)]
        + [{"role": "tool", "tool_call_id": t.id, "content": "done"} for t in m1.tool_calls]
    )
    r2 = c.chat.completions.create(messages=messages, tool_choice="none", max_tokens=3, **kw)
    turn1 = m.tokenize_chat(prepare_chat(m, messages[:1], TINY_TOOLS).prompt) + r1.tokens
    turn2 = m.tokenize_chat(prepare_chat(m, messages, TINY_TOOLS).prompt)
    assert len(turn1) == r1.usage.prompt_tokens + r1.usage.completion_tokens
    assert len(turn2) == r2.usage.prompt_tokens
    reused = _common(turn1, turn2)
    assert reused > r1.usage.prompt_tokens + r1.usage.completion_tokens // 2  # most of the reply
    bs = long_srv.cache.block_size  # the server shares whole cache blocks
    assert r2.usage.prompt_tokens_details.cached_tokens == reused - reused % bs


# ============================================================================ tools, real models

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer", "minimum": 0}, "b": {"type": "number"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = msgs("What is the weather in Paris? Use the tools.", system="You are a helpful assistant.")


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def real_srv(request):
    m = Model.load(str(hub.resolve(request.param, progress=False)), threads=1, progress=False)
    with Server(m, KVCache(m, max_tokens=4096)) as s:
        yield s


def _valid_calls(calls, only=None):
    assert calls
    for c in calls:
        assert c.type == "function" and c.id
        assert only is None or c.function.name == only
        jsonschema.validate(json.loads(c.function.arguments), TOOL_SCHEMAS[c.function.name])


QUESTIONS = {
    "required": ASK,
    "add": msgs("What is 2 plus 3? Use the tools.", system="You are a helpful assistant."),
}


def _choice(choice):
    return choice if choice == "required" else {"type": "function", "function": {"name": choice}}


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["required", "add"])
def test_real_models_call_tools_with_valid_arguments(real_srv, choice):
    """tool_choice "required" and a named function are constrained from the first token:
    even a 135M model returns a call whose arguments validate against the tool's schema."""
    r = real_srv.client().chat.completions.create(
        model="tiny",
        messages=QUESTIONS[choice],
        tools=TOOLS,
        tool_choice=_choice(choice),
        max_tokens=80,
        parallel_tool_calls=False,
        temperature=0,
    )
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert len(ch.message.tool_calls) == 1 and ch.message.content is None
    _valid_calls(ch.message.tool_calls, None if choice == "required" else choice)


@pytest.mark.slow
@pytest.mark.parametrize("choice", ["required", "add"])
def test_real_models_sampled_tool_calls(real_srv, choice):
    """Sampled (temperature 1): every call that ends validates; a value that runs on (a
    sampled number may get digit after digit) ends with finish_reason "length", never as a
    call claimed complete."""
    done = 0
    for seed in range(4):
        r = real_srv.client().chat.completions.create(
            model="tiny",
            messages=QUESTIONS[choice],
            tools=TOOLS,
            tool_choice=_choice(choice),
            max_tokens=60,
            temperature=1.0,
            seed=seed,
            parallel_tool_calls=False,
        )
        ch = r.choices[0]
        assert ch.message.tool_calls, ch  # the first token already belongs to a call
        if ch.finish_reason == "length":  # cut short: the client can tell
            continue
        assert ch.finish_reason == "tool_calls", ch
        _valid_calls(ch.message.tool_calls, None if choice == "required" else choice)
        done += 1
    assert done >= 2


@pytest.mark.slow
def test_real_models_stream_tool_calls_the_client_assembles(real_srv):
    """The official client's stream helper assembles the streamed delta.tool_calls into the
    same calls as the non-streamed reply (greedy: the same tokens)."""
    c = real_srv.client()
    kw = dict(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=80,
        temperature=0,
        parallel_tool_calls=False,
    )
    whole = c.chat.completions.create(**kw).choices[0]
    with c.chat.completions.stream(**kw) as stream:
        deltas = [e for e in stream if e.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == whole.finish_reason == "tool_calls"
    got = [(t.function.name, t.function.arguments) for t in final.message.tool_calls]
    assert got == [(t.function.name, t.function.arguments) for t in whole.message.tool_calls]
    assert len(deltas) > 1  # the arguments came in pieces
    _valid_calls(final.message.tool_calls)


@pytest.mark.slow
def test_real_models_two_turn_tool_conversation(real_srv):
    """Call, tool result back through the template, then an answer; the second request
    reuses the first one's prompt from the cache."""
    c = real_srv.client()
    messages = list(ASK)
    r1 = c.chat.completions.create(
        model="tiny",
        messages=messages,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=80,
        temperature=0,
        parallel_tool_calls=False,
    )
    m1 = r1.choices[0].message
    _valid_calls(m1.tool_calls)
    messages.append(m1.model_dump(exclude_none=True))
    for t in m1.tool_calls:
        messages.append(
            {
                "role": "tool",
                "tool_call_id": t.id,
                "content": json.dumps({"temperature_c": 18, "sky": "sunny"}),
            }
        )
    r2 = c.chat.completions.create(
        model="tiny",
        messages=messages,
        tools=TOOLS,
        tool_choice="none",
        max_tokens=24,
        temperature=0,
    )
    ch = r2.choices[0]
    assert ch.finish_reason in ("stop", "length") and not ch.message.tool_calls
    assert ch.message.content and ch.message.content.strip()
    assert r2.usage.prompt_tokens > r1.usage.prompt_tokens
    bs = real_srv.cache.block_size
    assert r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens - bs


# the schema a user writes: properties and required, nothing about other keys
OPEN_ADD = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


@pytest.mark.slow
@pytest.mark.parametrize("parallel", [None, False])
def test_real_models_tool_schema_without_additional_properties_is_closed(real_srv, parallel):
    """A tool schema with properties and no additionalProperties is a closed object (as
    OpenAI and llama.cpp read it): Gemma 3 270M, left free to add keys, padded its arguments
    ({"a": 2, "b": 3, "type": "object", ...}) until max_tokens; closed, it calls add(2, 3)."""
    kw = {} if parallel is None else {"parallel_tool_calls": parallel}
    r = real_srv.client().chat.completions.create(
        model="tiny",
        messages=msgs("What is 2 plus 3? Use the tools.", system="You are a helpful assistant."),
        tools=OPEN_ADD,
        tool_choice="required",
        max_tokens=60,
        temperature=0,
        **kw,
    )
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    for c in ch.message.tool_calls:
        args = json.loads(c.function.arguments)
        assert set(args) == {"a", "b"}, c.function.arguments
