"""Gemma 4's native tool calls (tools.GEMMA4): ``<|tool_call>call:f{k:<|"|>text<|"|>,n:3}<tool_call|>``.

Parser: real reply strings parse to the content and calls transformers' own Gemma 4 response
parser reads from them (transformers.utils.chat_parsing.ResponseParser with the gemma4
response template of transformers serve), at once and streamed in any split (Hypothesis).
Format: chosen from Gemma 4's templates (the tiny fixture's, llama.cpp's).
History: goinfer's OpenAI-shaped messages (arguments as JSON text, content None) render
through Gemma 4's template exactly as transformers renders the same conversation.
Server (official openai client): the tiny gemma4 fixture (tests/fixtures/hfconvert.py) held by the
grammar to a call whose arguments validate against the tool's schema, the stream giving the
same call, then the result goes back through the template and the next turn reuses the
cached prompt.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_channels import raw_text, stream_parts, tid
from test_server import Server

from fixtures import hfconvert
from fixtures.compare import load
from goinfer import KVCache
from goinfer import chat as T
from goinfer.chat import channels as C

Q = '<|"|>'
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "required": ["city"],
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "units": {"type": "string", "enum": ["c", "f"]},
            },
        },
    },
}
LEVEL = {
    "type": "function",
    "function": {
        "name": "set_level",
        "parameters": {
            "type": "object",
            "properties": {
                "level": {"type": "integer", "minimum": 0, "maximum": 9},
                "loud": {"type": "boolean"},
            },
            "required": ["level"],
            "additionalProperties": False,
        },
    },
}
NOTE = {
    "type": "function",
    "function": {
        "name": "note",
        "parameters": {
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"type": "string"}},
                "meta": {"type": "object"},
            },
        },
    },
}
SPEC = T.check_tools([WEATHER, LEVEL, NOTE])

# replies as Gemma 4 writes them (the template's rendering of calls), with content around
REPLIES = [
    f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:2}}<tool_call|>",
    f'<|tool_call>call:get_weather{{city:{Q}Paris, "the" {{city}}: x{Q},units:{Q}c{Q}}}'
    "<tool_call|><|tool_response>",
    f"Let me check.<|tool_call>call:set_level{{level:3,loud:true}}<tool_call|>"
    f"<|tool_call>call:get_weather{{city:{Q}Nice{Q}}}<tool_call|>",
    f"<|tool_call>call:note{{meta:{{a:{Q}x{Q},b:[1,-2.5e3,false,null]}},tags:[{Q}a{Q},{Q}b c{Q}]}}"
    "<tool_call|>",
    "<|tool_call>call:note{}<tool_call|>",
    "Just an answer, no call.",
    "\u00e9t\u00e9 \U0001f999 multi\nline",
    # thinking on: the thought channel first (reasoning_content)
    f"<|channel>thought\nThe user wants Paris.\n<channel|><|tool_call>call:get_weather{{city:{Q}Paris"
    f"{Q}}}<tool_call|>",
    "<|channel>thought\nHmm.<channel|>It is sunny.",
]


def reference(text: str) -> tuple:
    """(reasoning, content, [(name, arguments)]) as transformers' Gemma 4 response parser
    reads text."""
    from transformers.cli.serving.utils import _RESPONSE_TEMPLATE_FALLBACKS
    from transformers.utils.chat_parsing import ResponseParser

    (tmpl,) = [v for k, v in _RESPONSE_TEMPLATE_FALLBACKS.items() if "gemma4" in k]
    p = ResponseParser(tmpl, prefix="<|turn>model\n")
    p.feed(text)
    msg, _ = p.finalize()
    calls = [
        (c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or []
    ]
    return (msg.get("reasoning_content") or "").strip() or None, msg.get("content") or None, calls


def ours(reasoning, content, calls):
    return (
        reasoning,
        content,
        [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls or []],
    )


def parser():
    """The reply parser of a Gemma 4 tool request (the thought channel, then calls)."""
    assert C.channels_of(hfconvert.template("google-gemma-4-31B-it")) == C.GEMMA_THINK
    return T.ToolChat(SPEC, T.GEMMA4, "", None, None, C.GEMMA_THINK).parser(eager=True)


def whole(text: str) -> tuple:
    p = T.ToolChat(SPEC, T.GEMMA4, "", None, None, C.GEMMA_THINK).parser(eager=False)
    p.push(text)
    p.finish()
    return ours(p.reasoning, p.content, p.tool_calls)


def streamed(text: str, cuts) -> tuple:
    p = parser()
    reasoning, pieces, calls = [], [], {}
    bounds = sorted(set(cuts) | {0, len(text)})
    items = []
    for a, b in zip(bounds, bounds[1:]):
        items += p.push(text[a:b])
    items += p.finish()
    for x in items:
        if isinstance(x, T.ToolCallDelta):
            if x.id is not None:
                calls[x.index] = {"function": {"name": x.name, "arguments": ""}}
            calls[x.index]["function"]["arguments"] += x.arguments
        elif isinstance(x, C.Reasoning):
            reasoning.append(x)
        else:
            pieces.append(x)
    content = "".join(pieces) or None
    assert p.content == (None if calls and not content else content)
    assert p.reasoning == ("".join(reasoning) or None)
    return ours(
        p.reasoning, None if calls and not content else content, [calls[k] for k in sorted(calls)]
    )


@pytest.mark.parametrize("text", REPLIES)
def test_replies_parse_as_transformers_reads_them(text):
    want = reference(text)
    assert want[2] or "<|tool_call>" not in text  # the reference reads every call written here
    assert whole(text) == want
    if "<|channel>" not in text:  # no thought: the call parser alone reads it
        assert ours(None, *T.parse_reply(text, T.GEMMA4, SPEC)) == want
    for step in (1, 3, len(text)):
        assert streamed(text, range(0, len(text), step)) == want


@settings(max_examples=100, deadline=None)
@given(text=st.sampled_from(REPLIES), data=st.data())
def test_streaming_any_split(text, data):
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=10))
    assert streamed(text, cuts) == reference(text)


def test_text_that_is_no_call_stays_content():
    for text in (
        "a <|tool_call>call:unknown_fn{x:1}<tool_call|> b",  # not an offered tool
        f"<|tool_call>call:get_weather{{city:{Q}Par",  # cut short, not eager
        "<|tool_call>call:get_weather{city:Paris}<tool_call|>",
    ):  # no string marks
        assert T.parse_reply(text, T.GEMMA4, SPEC) == (text, None)
    none = T.check_tools([WEATHER], "none")
    text = f"<|tool_call>call:get_weather{{city:{Q}x{Q}}}<tool_call|>"
    assert T.parse_reply(text, T.GEMMA4, none) == (text, None)


def test_format_from_the_real_templates(gemma4):
    assert T.format_of(hfconvert.template("google-gemma-4-31B-it")) is T.GEMMA4
    assert T.tool_format(gemma4[1]) is T.GEMMA4
    assert T.format_of(hfconvert.template("google-gemma-2-2b-it")) is T.GENERIC


# ============================================================================ fixture, history


@pytest.fixture(scope="module")
def gemma4():
    _, path = hfconvert.build("gemma4")
    return path, load(path)


def test_history_renders_as_transformers_does(gemma4):
    """OpenAI-shaped history (arguments as JSON text, content None, two calls and their
    results) -> the prompt transformers renders from the shape the template documents."""
    from transformers import AutoTokenizer

    path, m = gemma4
    ht = AutoTokenizer.from_pretrained(path.parent / "hf")
    calls = [
        ("c1", "get_weather", {"city": "Paris", "days": 2}),
        ("c2", "set_level", {"level": 3, "loud": False}),
    ]
    hist = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Go."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                for i, n, a in calls
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"t": 21}'},
        {"role": "tool", "tool_call_id": "c2", "content": "ok"},
    ]
    tc = T.prepare_chat(m, hist, tools=[WEATHER, LEVEL])
    assert tc.fmt is T.GEMMA4
    ref = [dict(x) for x in hist]
    ref[2] = {
        "role": "assistant",
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ],
    }
    want = ht.apply_chat_template(
        ref, tools=[WEATHER, LEVEL], tokenize=False, add_generation_prompt=True
    )
    assert tc.prompt == want
    assert f"<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:2}}<tool_call|>" in want
    assert "<|tool_response>response:set_level{value:" in want


# ============================================================================ grammar, server


def test_grammar_per_choice(gemma4):
    """The grammars compile for the model; named: only that function; none: no call marker
    outside text (the marker is a special token the text never holds)."""
    _, m = gemma4
    for choice in ("auto", "required", "none", {"type": "function", "function": {"name": "note"}}):
        tc = T.prepare_chat(m, [{"role": "user", "content": "hi"}], [WEATHER, LEVEL, NOTE], choice)
        assert tc.grammar is not None
        tc.compiled()
    g = T.tool_grammar(
        T.check_tools([WEATHER, LEVEL], {"type": "function", "function": {"name": "set_level"}}),
        T.GEMMA4,
        m.tokenizer,
    )
    assert "call:set_level{" in g and "get_weather" not in g
    assert "get_weather" not in T.tool_grammar(
        T.check_tools([WEATHER], "none"), T.GEMMA4, m.tokenizer
    )


@pytest.fixture(scope="module")
def srv(gemma4):
    _, m = gemma4
    with Server(m, KVCache(m, max_tokens=4096)) as s:
        yield s, m


@pytest.mark.parametrize(
    "choice",
    [
        "required",
        {"type": "function", "function": {"name": "get_weather"}},
        {"type": "function", "function": {"name": "set_level"}},
    ],
)
def test_calls_through_the_server_and_round_trip(srv, choice):
    """A forced call from the random tiny model validates against its schema, reads back from
    the raw reply as transformers reads it, streams the same; its result goes back through
    Gemma 4's template and the next turn reuses the cached prompt."""
    s, m = srv
    c = s.client()
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    bias = {str(tid(m, "<tool_call|>")): 5, str(tid(m, Q)): 3}  # short strings, short calls
    kw = dict(
        model="tiny",
        messages=msgs,
        tools=[WEATHER, LEVEL],
        tool_choice=choice,
        max_tokens=200,
        temperature=0,
        logit_bias=bias,
    )
    r = c.chat.completions.create(extra_body={"return_tokens": True}, **kw)
    ch = r.choices[0]
    raw = raw_text(m, r.model_extra["tokens"])
    assert ch.finish_reason == "tool_calls", raw
    assert ch.message.content is None and ch.message.tool_calls
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, LEVEL)}
    for call in ch.message.tool_calls:
        if not isinstance(choice, str):
            assert call.function.name == choice["function"]["name"]
        jsonschema.validate(json.loads(call.function.arguments), tools[call.function.name])
    assert ours(None, None, [t.model_dump() for t in ch.message.tool_calls]) == reference(raw)
    _, _, calls, _ = stream_parts(c.chat.completions.create(stream=True, **kw))
    assert [tuple(v) for v in calls.values()] == [
        (t.function.name, t.function.arguments) for t in ch.message.tool_calls
    ]
    msgs += [ch.message.model_dump(exclude_none=True)] + [
        {"role": "tool", "tool_call_id": t.id, "content": "sunny"} for t in ch.message.tool_calls
    ]
    r2 = c.chat.completions.create(
        model="tiny",
        messages=msgs,
        tools=[WEATHER, LEVEL],
        tool_choice="none",
        max_tokens=8,
        temperature=0,
    )
    prompt = T.prepare_chat(m, msgs, [WEATHER, LEVEL]).prompt
    # the calls as the grammar had the model write them are the template's text for them
    assert raw.split("<|tool_response>")[0] in prompt
    assert "<|tool_response>response:" in prompt
    assert r2.usage.prompt_tokens == len(m.tokenize_chat(prompt))
    assert r2.usage.prompt_tokens_details.cached_tokens > 0


def test_thinking_on_thought_then_call(srv):
    """enable_thinking: the grammar lets the reply open its thought channel (steered there by
    logit_bias on <|channel>; <channel|> closes it) before the forced call; the server's
    reasoning_content, content and calls are what transformers' parser reads in the raw reply."""
    s, m = srv
    c = s.client()
    bias = {
        str(tid(m, "<|channel>")): 10,
        str(tid(m, "<channel|>")): 11,
        str(tid(m, "<tool_call|>")): 5,
        str(tid(m, Q)): 3,
    }
    r = c.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Level?"}],
        tools=[WEATHER, LEVEL],
        tool_choice={"type": "function", "function": {"name": "set_level"}},
        max_tokens=80,
        temperature=0,
        logit_bias=bias,
        extra_body={"return_tokens": True, "chat_template_kwargs": {"enable_thinking": True}},
    )
    ch = r.choices[0]
    raw = raw_text(m, r.model_extra["tokens"])
    assert raw.startswith("<|channel>thought\n") and "<channel|><|tool_call>call:" in raw, raw
    assert ch.finish_reason == "tool_calls", raw
    got = ours(
        ch.message.model_extra.get("reasoning_content"),
        ch.message.content,
        [t.model_dump() for t in ch.message.tool_calls],
    )
    assert got == reference(raw) and got[0]  # a thought was written and read
