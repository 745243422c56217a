"""Reasoning apart from the answer (goinfer/chat/channels.py) and gpt-oss's harmony tool calls.

Parser: real format strings (gpt-oss's harmony as its template and the model write it,
<think> blocks as Qwen3.5 / SmolLM3 templates open them) parse to the split the format defines
(written out by hand here), streamed in any split of the text as well as at once.
History: goinfer's OpenAI-shaped messages render through gpt-oss's own template exactly as
transformers renders the same conversation in the shape that template documents ("thinking",
arguments as objects).
Server (official openai client): tiny gpt-oss and Qwen3.5 fixtures (fixtures/hfconvert.py, their
real chat templates) steered by logit_bias through the tools' grammar; reasoning_content and
content checked against the raw reply (return_tokens, split here with a regex), streamed
deltas against the whole reply, calls against their tools' schemas.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_server import Server

from fixtures import hfconvert
from fixtures.compare import load
from goinfer import KVCache
from goinfer import chat as T
from goinfer.chat import channels as C

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
LEVEL = {
    "type": "function",
    "function": {
        "name": "set_level",
        "parameters": {
            "type": "object",
            "properties": {"level": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["level"],
            "additionalProperties": False,
        },
    },
}


def spec(*tools, choice="auto"):
    return T.check_tools(list(tools or [WEATHER, LEVEL]), choice)


def chat(fmt, channels, s):
    return T.ToolChat(s, fmt, "", None, None, channels)


# ============================================================================ parser: real strings

HARMONY = C.HARMONY_CHANNELS
OPEN, SELF = C.Channels("think", True), C.Channels("think", False)
ARGS = '{"city": "Paris"}'
# (tool format, channels, reply text, reasoning, content, calls [(name, arguments)])
PARSES = [
    # gpt-oss: analysis, then a call as the model writes it (recipient after the channel)
    (
        T.HARMONY,
        HARMONY,
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
        f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{ARGS}",
        "Need the weather.",
        None,
        [("get_weather", ARGS)],
    ),
    # ... the recipient before the channel, as the template writes calls in the history
    (
        T.HARMONY,
        HARMONY,
        f" to=functions.get_weather<|channel|>commentary json<|message|>{ARGS}<|call|>",
        None,
        None,
        [("get_weather", ARGS)],
    ),
    # analysis then final (the stop token <|return|> is not in the text)
    (
        T.HARMONY,
        HARMONY,
        "<|channel|>analysis<|message|>Say hi.<|end|><|start|>assistant"
        "<|channel|>final<|message|>Hello!",
        "Say hi.",
        "Hello!",
        [],
    ),
    (T.HARMONY, HARMONY, "<|channel|>final<|message|>Just this.", None, "Just this.", []),
    # a call to a function not offered: its message stays visible as content
    (
        T.HARMONY,
        HARMONY,
        '<|channel|>commentary to=functions.other <|constrain|>json<|message|>{"a": 1}',
        None,
        '{"a": 1}',
        [],
    ),
    # not harmony at all: all content
    (T.HARMONY, HARMONY, "plain words", None, "plain words", []),
    # Qwen3.5: the prompt opened the block
    (
        T.GENERIC,
        OPEN,
        "\nThe user wants Paris.\n</think>\n\n<tool_call>\n"
        f'{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_call>',
        "The user wants Paris.",
        None,
        [("get_weather", ARGS)],
    ),
    (T.HERMES, OPEN, "\nHmm.\n</think>\n\nIt is sunny.", "Hmm.", "It is sunny.", []),
    # SmolLM3 / Qwen3: the model opens the block itself
    (T.HERMES, SELF, "<think>\nPlan.\n</think>\nDone.", "Plan.", "Done.", []),
    (T.HERMES, SELF, "No thinking here.", None, "No thinking here.", []),
    # thinking turned off in the prompt (Qwen3.5 writes an empty block there)
    (
        T.HERMES,
        SELF,
        f'<tool_call>\n{{"name": "get_weather", "arguments": {ARGS}}}\n</tool_call>',
        None,
        None,
        [("get_weather", ARGS)],
    ),
    # Qwen3.5 / Qwen3-Coder XML calls (the layout the template's tool prompt shows): a string
    # value as written (several lines), any other as JSON; after a think block; two calls
    (
        T.QWEN_XML,
        OPEN,
        "\nPlan.\n</think>\n\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nNew York\nState\n</parameter>\n</function>\n</tool_call>",
        "Plan.",
        None,
        [("get_weather", '{"city": "New York\\nState"}')],
    ),
    (
        T.QWEN_XML,
        SELF,
        "Setting it.\n\n<tool_call>\n<function=set_level>\n<parameter=level>\n3"
        "\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\n42\n</parameter>\n</function>\n</tool_call>",
        None,
        "Setting it.",
        [("set_level", '{"level": 3}'), ("get_weather", '{"city": "42"}')],
    ),
    # an XML block naming no offered function stays content
    (
        T.QWEN_XML,
        SELF,
        "<tool_call>\n<function=nope>\n</function>\n</tool_call>",
        None,
        "<tool_call>\n<function=nope>\n</function>\n</tool_call>",
        [],
    ),
    # cut short inside the reasoning (max_tokens): all of it is reasoning
    (T.GENERIC, OPEN, "\nStill thinking about", "Still thinking about", "", []),
]


def whole(fmt, channels, text):
    p = chat(fmt, channels, spec()).parser(eager=False)
    p.push(text)
    p.finish()
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in p.tool_calls or []]
    return p.reasoning, p.content, calls


def streamed(fmt, channels, text, cuts):
    p = chat(fmt, channels, spec()).parser()
    items, i = [], 0
    for j in sorted(set(cuts)) + [len(text)]:
        items += p.push(text[i:j])
        i = j
    items += p.finish()
    reasoning = "".join(x for x in items if isinstance(x, C.Reasoning)) or None
    content = "".join(x for x in items if isinstance(x, str) and not isinstance(x, C.Reasoning))
    calls: dict[int, list] = {}
    for x in items:
        if isinstance(x, T.ToolCallDelta):
            if x.id is not None:
                calls[x.index] = [x.name, ""]
            calls[x.index][1] += x.arguments
    # reasoning comes before the answer
    kinds = [isinstance(x, C.Reasoning) for x in items]
    assert kinds == sorted(kinds, reverse=True)
    return (
        reasoning,
        (None if calls and not content else content),
        [tuple(calls[k]) for k in sorted(calls)],
    )


@pytest.mark.parametrize("fmt,channels,text,reasoning,content,calls", PARSES)
def test_replies_split_into_reasoning_content_and_calls(
    fmt, channels, text, reasoning, content, calls
):
    assert whole(fmt, channels, text) == (reasoning, content, calls)
    for step in (1, 2, 5, len(text)):
        assert streamed(fmt, channels, text, range(0, len(text), step)) == (
            reasoning,
            content,
            calls,
        )


@settings(max_examples=120, deadline=None)
@given(case=st.sampled_from(PARSES), data=st.data())
def test_streaming_any_split(case, data):
    fmt, channels, text, reasoning, content, calls = case
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=10))
    assert streamed(fmt, channels, text, cuts) == (reasoning, content, calls)


def test_formats_from_the_real_templates():
    """Which template reads which way (llama.cpp's models/templates)."""
    assert T.format_of(hfconvert.template("openai-gpt-oss-120b")) is T.HARMONY
    assert C.channels_of(hfconvert.template("openai-gpt-oss-120b")) == C.HARMONY_CHANNELS
    for name in ("Qwen3.5-4B", "HuggingFaceTB-SmolLM3-3B", "Qwen-Qwen3-0.6B"):
        assert C.channels_of(hfconvert.template(name)) == C.THINK
    assert C.channels_of(hfconvert.template("Qwen-Qwen2.5-7B-Instruct")) is None
    for name in ("Qwen3.5-4B", "Qwen3-Coder"):
        assert T.format_of(hfconvert.template(name)) is T.QWEN_XML


# ============================================================================ fixtures


@pytest.fixture(scope="module")
def gptoss():
    _, path = hfconvert.build("gpt-oss")
    return path, load(path)


@pytest.fixture(scope="module")
def qwen35():
    _, path = hfconvert.build("qwen35")
    return path, load(path)


def tid(m, text):
    """The id of a special token, or of the one token a text is."""
    if text.startswith("<"):
        return m.tokenizer.token_to_id(text)
    (i,) = m.tokenize(text, False)
    return i


# ============================================================================ history through gpt-oss's template


def test_harmony_history_renders_as_transformers_does(gptoss):
    """A tool round trip in OpenAI's shape (reasoning_content, two calls with JSON-string
    arguments, null content, tool results) renders as transformers renders the conversation
    in the shape gpt-oss's template documents (one call per message, "thinking")."""
    from transformers import AutoTokenizer

    path, m = gptoss
    ours = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Two cities.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
    ]
    theirs = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "thinking": "Two cities",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Rome"}},
                }
            ],
        },
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "rain"},
    ]
    theirs[1]["thinking"] += "."
    tools = [dict(WEATHER, function=dict(WEATHER["function"], description=""))]
    tok = AutoTokenizer.from_pretrained(path.parent / "hf")
    want = tok.apply_chat_template(theirs, tools=tools, tokenize=False, add_generation_prompt=True)
    tc = T.prepare_chat(m, ours, [WEATHER])
    date = re.compile(r"Current date: \d{4}-\d\d-\d\d")
    assert date.sub("", tc.prompt) == date.sub("", want)
    assert "<|channel|>analysis<|message|>Two cities.<|end|>" in tc.prompt
    assert tc.prompt.endswith("<|start|>assistant")


# ============================================================================ through the server

HARMONY_SPLIT = re.compile(r"<\|channel\|>analysis<\|message\|>(.*?)<\|end\|>", re.S)


def raw_text(m, tokens):
    return m.tokenizer.decode(tokens)


def stream_parts(chunks):
    """(reasoning, content, calls {index: [name, arguments]}, order of kinds) of a stream."""
    reasoning, content, calls, kinds = "", "", {}, []
    for x in chunks:
        if not x.choices:
            continue
        d = x.choices[0].delta
        r = (d.model_extra or {}).get("reasoning_content")
        if r:
            reasoning += r
            kinds.append("r")
        if d.content:
            content += d.content
            kinds.append("c")
        for t in d.tool_calls or []:
            if t.id is not None:
                calls[t.index] = [t.function.name, ""]
            calls[t.index][1] += t.function.arguments
            kinds.append("t")
    return reasoning or None, content or None, calls, kinds


@pytest.fixture(scope="module")
def oss_srv(gptoss):
    _, m = gptoss
    with Server(m, KVCache(m, max_tokens=2048)) as s:
        yield s, m


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "set_level"}}, "none", "auto"]
)
def test_gptoss_reasoning_and_calls_through_the_server(oss_srv, choice):
    """gpt-oss, steered into its analysis channel (logit_bias on <|channel|> and on "a" after
    it, and on <|end|> so the analysis is short): reasoning_content is the analysis message of the raw
    reply, content the final one (no channel markers), a forced call validates against its
    schema with finish_reason "tool_calls"; the stream sends the same, reasoning first."""
    srv, m = oss_srv
    c = srv.client()
    bias = {
        str(tid(m, "<|channel|>")): 10,
        str(tid(m, "a")): 10,
        str(tid(m, "<|end|>")): 8,
        str(tid(m, "<|return|>")): 6,
    }
    kw = dict(
        model="tiny",
        messages=[{"role": "user", "content": "Set level 3."}],
        tools=[LEVEL],
        tool_choice=choice,
        max_tokens=160,
        temperature=0,
        logit_bias=bias,
    )
    r = c.chat.completions.create(extra_body={"return_tokens": True}, **kw)
    ch = r.choices[0]
    raw = raw_text(m, r.model_extra["tokens"])
    got = HARMONY_SPLIT.search(raw)
    assert got is not None, raw  # the bias put the model in its analysis channel
    assert ch.message.model_extra["reasoning_content"] == got.group(1)
    if choice == "none" or (choice == "auto" and "to=functions." not in raw):
        assert ch.finish_reason in ("stop", "length") and not ch.message.tool_calls
        final = raw.split("<|start|>assistant<|channel|>final<|message|>", 1)[1]
        assert ch.message.content == final and "<|" not in final
    else:
        assert ch.finish_reason == "tool_calls" and ch.message.content is None
        (call,) = ch.message.tool_calls
        assert call.function.name == "set_level"
        jsonschema.validate(json.loads(call.function.arguments), LEVEL["function"]["parameters"])
        assert raw.endswith("<|message|>" + call.function.arguments)
    reasoning, content, calls, kinds = stream_parts(c.chat.completions.create(stream=True, **kw))
    assert reasoning == ch.message.model_extra["reasoning_content"]
    assert content == ch.message.content
    assert [tuple(v) for v in calls.values()] == [
        (t.function.name, t.function.arguments) for t in ch.message.tool_calls or []
    ]
    assert kinds[0] == "r" and "r" not in kinds[kinds.index("r") + kinds.count("r") :]


def test_gptoss_tool_round_trip(oss_srv):
    """The reply's message (reasoning_content, tool_calls) and the tool's result go back
    through gpt-oss's template: the next turn reuses the cached prompt and answers."""
    srv, m = oss_srv
    c = srv.client()
    bias = {str(tid(m, " ")): 10}  # " to=functions...": straight to the call
    msgs = [{"role": "user", "content": "Set level 3."}]
    r = c.chat.completions.create(
        model="tiny",
        messages=msgs,
        tools=[LEVEL],
        tool_choice="required",
        max_tokens=120,
        temperature=0,
        logit_bias=bias,
        extra_body={"return_tokens": True},
    )
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls"
    first = T.prepare_chat(m, msgs, [LEVEL]).prompt
    msgs += [
        msg.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "ok"},
    ]
    r2 = c.chat.completions.create(
        model="tiny",
        messages=msgs,
        tools=[LEVEL],
        tool_choice="none",
        max_tokens=40,
        temperature=0,
        logit_bias={str(tid(m, "f")): 10},
    )
    prompt = T.prepare_chat(m, msgs, [LEVEL]).prompt
    assert '<|start|>functions.set_level to=assistant<|channel|>commentary<|message|>"ok"' in prompt
    # the call as the grammar has the model write it is the template's text for it: the next
    # prompt repeats the first prompt and the reply verbatim (then <|call|>, the stop token)
    raw = raw_text(m, r.model_extra["tokens"])
    assert prompt.startswith(first + raw + "<|call|>"), (raw, prompt[len(first) :])
    assert r2.usage.prompt_tokens == len(m.tokenize_chat(prompt))
    assert r2.usage.prompt_tokens_details.cached_tokens > 0
    assert "<|" not in (r2.choices[0].message.content or "")


@pytest.fixture(scope="module")
def qwen_srv(qwen35):
    _, m = qwen35
    with Server(m, KVCache(m, max_tokens=2048)) as s:
        yield s, m


def test_qwen35_think_block_then_call(qwen_srv):
    """Qwen3.5's prompt opens <think>: the grammar lets the reply finish its thought (kept
    short by logit_bias on </think>), then holds it to a call; reasoning_content is the
    thought of the raw reply, the call validates, the stream gives the same, thought first."""
    srv, m = qwen_srv
    c = srv.client()
    kw = dict(
        model="tiny",
        messages=[{"role": "user", "content": "Set level 3."}],
        tools=[LEVEL],
        tool_choice="required",
        max_tokens=120,
        temperature=0,
        logit_bias={str(tid(m, "</think>")): 1},
    )
    r = c.chat.completions.create(extra_body={"return_tokens": True}, **kw)
    ch = r.choices[0]
    raw = raw_text(m, r.model_extra["tokens"])
    thought = raw.split("</think>", 1)[0].strip()
    assert thought, raw
    assert ch.message.model_extra["reasoning_content"] == thought
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    (call,) = ch.message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), LEVEL["function"]["parameters"])
    reasoning, content, calls, kinds = stream_parts(c.chat.completions.create(stream=True, **kw))
    assert (reasoning, content) == (thought, None)
    assert [tuple(v) for v in calls.values()] == [(call.function.name, call.function.arguments)]
    assert kinds[0] == "r" and kinds[-1] == "t" and kinds.count("r") == kinds.index("t")
    # the call goes back through the template as the very text the model wrote (XML format)
    assert raw.split("</think>", 1)[1].lstrip().startswith("<tool_call>\n<function=set_level>")
    msgs = kw["messages"] + [
        ch.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "done"},
    ]
    assert raw.split("</think>", 1)[1].strip() in T.prepare_chat(m, msgs, [LEVEL]).prompt
    r2 = c.chat.completions.create(**dict(kw, messages=msgs, max_tokens=4, tool_choice="none"))
    assert r2.usage.prompt_tokens_details.cached_tokens > 0


def test_qwen35_thinking_off(qwen_srv):
    """chat_template_kwargs {"enable_thinking": false} reaches the template (the prompt ends
    with its empty block): no reasoning, the call still parses."""
    srv, m = qwen_srv
    c = srv.client()
    msgs = [{"role": "user", "content": "Set level 3."}]
    r = c.chat.completions.create(
        model="tiny",
        messages=msgs,
        tools=[LEVEL],
        tool_choice="required",
        max_tokens=80,
        temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    prompt = T.prepare_chat(m, msgs, [LEVEL], template_kwargs={"enable_thinking": False}).prompt
    assert prompt.endswith("<think>\n\n</think>\n\n")
    assert r.usage.prompt_tokens == len(m.tokenize_chat(prompt))
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and "reasoning_content" not in ch.message.model_extra
    jsonschema.validate(
        json.loads(ch.message.tool_calls[0].function.arguments), LEVEL["function"]["parameters"]
    )
    with pytest.raises(Exception) as e:
        c.chat.completions.create(
            model="tiny",
            messages=msgs,
            max_tokens=2,
            extra_body={"chat_template_kwargs": {"messages": []}},
        )
    assert e.value.body["param"] == "chat_template_kwargs"


def test_harmony_stop_tokens(gptoss):
    """<|end|> closes a message inside a gpt-oss reply (the analysis before the answer), so
    it does not end the generation; <|return|> and <|call|> do (as llama.cpp has it)."""
    _, m = gptoss
    tok = m.tokenizer
    assert tok.token_to_id("<|end|>") not in tok.stop_ids
    assert {tok.token_to_id("<|return|>"), tok.token_to_id("<|call|>")} <= tok.stop_ids


def test_qwen35_xml_history_renders_as_transformers_does(qwen35):
    """A call in OpenAI's shape (JSON-string arguments) and its result render through
    Qwen3.5's template as transformers renders the same conversation (arguments as an
    object), so the call block is the text the grammar lets the model write."""
    from transformers import AutoTokenizer

    path, m = qwen35
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "set_level", "arguments": '{"level": 3}'},
    }
    ours = [
        {"role": "user", "content": "Set level 3."},
        {"role": "assistant", "content": None, "reasoning_content": "Easy.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "done"},
    ]
    theirs = [
        ours[0],
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Easy.",
            "tool_calls": [
                {"type": "function", "function": {"name": "set_level", "arguments": {"level": 3}}}
            ],
        },
        ours[2],
    ]
    tok = AutoTokenizer.from_pretrained(path.parent / "hf")
    want = tok.apply_chat_template(
        theirs, tools=[LEVEL], tokenize=False, add_generation_prompt=True
    )
    tc = T.prepare_chat(m, ours, [LEVEL])
    assert tc.fmt is T.QWEN_XML and tc.prompt == want
    block = (
        "<tool_call>\n<function=set_level>\n<parameter=level>\n3\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    assert block in tc.prompt
    p = tc.parser(eager=False)  # the prompt opened a think block
    p.push("</think>\n\n" + block)
    p.finish()
    assert p.tool_calls[0]["function"]["arguments"] == call["function"]["arguments"]


def test_smollm3_model_opens_its_think_block(tmp_path):
    """SmolLM3 (its template leaves <think> to the model), Python API: the tools' grammar
    lets the reply open a think block first; ChatSession.chat gives reasoning_content and the
    call, and its stream the same as Reasoning pieces, then the call."""
    _, path = hfconvert.build("smollm3")
    m = load(path)
    bias = {tid(m, "<think>"): 10, tid(m, "</think>"): 1}
    kw = dict(tools=[LEVEL], tool_choice="required", max_tokens=120, temperature=0, logit_bias=bias)
    msgs = [{"role": "user", "content": "Set level 3."}]
    r = m.session().chat(msgs, **kw)
    raw = m.tokenizer.decode(r.tokens)
    assert raw.startswith("<think>"), raw
    assert r.reasoning_content == raw[len("<think>") :].split("</think>", 1)[0].strip()
    assert r.finish_reason == "tool_calls" and r.content is None
    jsonschema.validate(
        json.loads(r.tool_calls[0]["function"]["arguments"]), LEVEL["function"]["parameters"]
    )
    items = list(m.session().chat(msgs, stream=True, **kw))
    assert "".join(x for x in items if isinstance(x, C.Reasoning)) == r.reasoning_content
    deltas = [x for x in items if isinstance(x, T.ToolCallDelta)]
    assert "".join(d.arguments for d in deltas) == r.tool_calls[0]["function"]["arguments"]
    assert items[-1].tool_calls[0]["function"] == r.tool_calls[0]["function"]
    assert r.message()["reasoning_content"] == r.reasoning_content


def test_gptoss_structured_output_in_the_final_channel(oss_srv):
    """response_format with gpt-oss: the schema holds the final message (after the analysis
    message the bias leads into, cut short by the bias on <|end|>); content is the JSON,
    valid against the schema, no channel markers; a bad schema is still a 400 naming
    response_format."""
    srv, m = oss_srv
    c = srv.client()
    schema = LEVEL["function"]["parameters"]
    bias = {str(tid(m, "a")): 10, str(tid(m, "<|end|>")): 14}
    r = c.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "A level?"}],
        max_tokens=120,
        temperature=0,
        logit_bias=bias,
        extra_body={"return_tokens": True},
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    )
    raw = raw_text(m, r.model_extra["tokens"])
    msg = r.choices[0].message
    assert HARMONY_SPLIT.search(raw), raw  # an (empty) analysis message, then the final one
    assert msg.model_extra.get("reasoning_content") == (HARMONY_SPLIT.search(raw).group(1) or None)
    assert raw.endswith("<|channel|>final<|message|>" + msg.content)
    jsonschema.validate(json.loads(msg.content), schema)
    with pytest.raises(Exception) as e:
        c.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "x"}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
            },
        )
    assert e.value.body["param"] == "response_format"
