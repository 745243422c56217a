"""POST /v1/responses (OpenAI's Responses API), driven by the official openai client on a tiny
random model: replies equal ChatSession.chat of the same conversation, streams are the typed
events in their order with sequence numbers, structured output parses, tool calls validate
against their schemas, stored responses continue (previous_response_id) exactly as the same
items sent back, round-trip, are retrieved, listed and deleted; bad input is a 400 in OpenAI's
shape; hosted tools are left out and reported; a Codex-shaped conversation (developer items,
namespaced tools, a free-form tool, reasoning items) is a pure append of the prompt turn after
turn, so the prefix cache holds it."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pydantic
import pytest
from test_server import Server, lone, msgs

from fixtures import tinymodels
from fixtures.compare import load
from goinfer import KVCache
from goinfer.chat.request import alternates_roles, join_same_roles
from goinfer.chat_template import GEMMA_TEMPLATE

# strings bounded: a random tiny model would not end one by itself
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
LEVEL = {
    "type": "function",
    "name": "set_level",
    "parameters": {
        "type": "object",
        "properties": {"level": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["level"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def model(tiny):
    # room for the built-in tool prompt (the tiny vocabulary spells it byte by byte)
    return load(tiny("llama", 5, max_position_embeddings=8192)[1])


@pytest.fixture(scope="module")
def srv(model):
    with Server(model, KVCache(model, max_tokens=16384)) as s:
        yield s


def sse_events(text: str) -> list:
    """A Responses stream's body -> its events' data (dicts; "ping" for a keep-alive)."""
    out = []
    for block in text.split("\n\n"):
        if block.startswith(":"):
            out.append("ping")
        for line in block.split("\n"):
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
    return out


def _lone_text(model, messages, n, **kw):
    return lone(model, chat=messages, max_tokens=n, temperature=0.0, **kw)


# ============================================================================ text


def test_create_equals_chat_and_reports_usage(srv, model):
    c = srv.client()
    r = c.responses.create(
        model="tiny",
        input="Tell me a story.",
        instructions="Be brief.",
        max_output_tokens=12,
        temperature=0,
    )
    ref = _lone_text(model, msgs("Tell me a story.", system="Be brief."), 12)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text == ref.content
    msg = r.output[-1]
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert (
        (r.status, r.incomplete_details.reason) == ("incomplete", "max_output_tokens")
        if ref.finish_reason == "length"
        else r.status == "completed"
    )
    u = r.usage
    assert (u.input_tokens, u.output_tokens) == (ref.prompt_tokens, ref.completion_tokens)
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.output_tokens_details.reasoning_tokens == 0
    assert r.instructions == "Be brief." and r.max_output_tokens == 12
    # developer items are system messages, in place; a list of text parts is its text
    r2 = c.responses.create(
        model="tiny",
        max_output_tokens=12,
        temperature=0,
        input=[
            {
                "type": "message",
                "role": "developer",
                "content": [
                    {"type": "input_text", "text": "Be "},
                    {"type": "input_text", "text": "brief."},
                ],
            },
            {"role": "user", "content": "Tell me a story."},
        ],
    )
    assert r2.output_text == ref.content
    assert r2.usage.input_tokens_details.cached_tokens > 0  # the same prompt again


def test_stream_events_in_order_with_sequence_numbers(srv, model):
    body = {
        "model": "tiny",
        "input": "Hello there.",
        "max_output_tokens": 10,
        "temperature": 0,
        "stream": True,
    }
    raw = srv.post("/v1/responses", body)
    assert raw.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in raw.text.split("\n\n") if b and not b.startswith(":")]
    names = [b.split("\n")[0].removeprefix("event: ") for b in blocks]
    evs = [e for e in sse_events(raw.text) if e != "ping"]
    assert [e["type"] for e in evs] == names  # the event: line names the data's type
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    ref = _lone_text(model, msgs("Hello there."), 10)
    end = "response.incomplete" if ref.finish_reason == "length" else "response.completed"
    deltas = [e for e in evs if e["type"] == "response.output_text.delta"]
    assert names == (
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ]
        + ["response.output_text.delta"] * len(deltas)
        + [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            end,
        ]
    )
    text = "".join(d["delta"] for d in deltas)
    assert text == ref.content
    item_id = evs[2]["item"]["id"]
    assert all(d["item_id"] == item_id and d["output_index"] == 0 for d in deltas)
    final = evs[-1]["response"]
    assert final["output"] == [evs[-2]["item"]] and final["output"][0]["content"][0]["text"] == text
    assert final["usage"]["input_tokens"] == ref.prompt_tokens
    assert evs[0]["response"]["status"] == "in_progress" and evs[0]["response"]["output"] == []
    # the client's stream helper assembles the same reply
    with srv.client().responses.stream(
        model="tiny", input="Hello there.", temperature=0, max_output_tokens=400
    ) as st:
        for _ in st:
            pass
        got = st.get_final_response()
    assert got.output_text == _lone_text(model, msgs("Hello there."), 400).content


def test_sampling_settings_reach_the_generation(srv, model):
    r = srv.client().responses.create(
        model="tiny",
        input="Pick words.",
        max_output_tokens=16,
        temperature=0.9,
        top_p=0.8,
        extra_body={"seed": 11},
    )
    ref = lone(model, chat=msgs("Pick words."), max_tokens=16, temperature=0.9, top_p=0.8, seed=11)
    assert r.output_text == ref.content


# ============================================================================ structured output


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=12)
    population_millions: float = pydantic.Field(ge=0, le=50)


def test_parse_with_a_pydantic_model(srv):
    r = srv.client().responses.parse(
        model="tiny",
        input="Describe Paris.",
        text_format=City,
        max_output_tokens=200,
        temperature=0,
    )
    assert r.status == "completed"
    assert isinstance(r.output_parsed, City)
    City.model_validate_json(r.output_text)  # the text itself validates


# ============================================================================ tools


def _valid(call, tool):
    assert call.type == "function_call" and call.call_id and call.id.startswith("fc_")
    assert call.name == tool["name"]
    jsonschema.validate(json.loads(call.arguments), tool["parameters"])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "set_level"}])
def test_forced_tool_call_validates(srv, choice):
    r = srv.client().responses.create(
        model="tiny",
        input="Set the level.",
        tools=[WEATHER, LEVEL],
        tool_choice=choice,
        parallel_tool_calls=False,
        max_output_tokens=300,
        temperature=0,
    )
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and r.status == "completed"
    _valid(
        calls[0],
        LEVEL
        if isinstance(choice, dict)
        else {"get_weather": WEATHER, "set_level": LEVEL}[calls[0].name],
    )


def test_tool_round_trip_with_and_without_previous_response_id(srv):
    c = srv.client()
    tools = [WEATHER]
    first = c.responses.create(
        model="tiny",
        input="Weather in Paris?",
        tools=tools,
        instructions="Use the tools.",
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=300,
        temperature=0,
    )
    call = next(o for o in first.output if o.type == "function_call")
    _valid(call, WEATHER)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
    chained = c.responses.create(
        model="tiny",
        previous_response_id=first.id,
        input=[result],
        instructions="Use the tools.",
        tools=tools,
        max_output_tokens=16,
        temperature=0,
    )
    items = (
        [{"role": "user", "content": "Weather in Paris?"}]
        + [o.model_dump(exclude_none=True) for o in first.output]
        + [result]
    )
    resent = c.responses.create(
        model="tiny",
        input=items,
        instructions="Use the tools.",
        tools=tools,
        max_output_tokens=16,
        temperature=0,
        store=False,
    )
    # the same conversation either way: the same prompt, the same reply
    assert chained.previous_response_id == first.id
    assert chained.usage.input_tokens == resent.usage.input_tokens
    assert [o.model_dump(exclude={"id", "call_id"}) for o in chained.output] == [
        o.model_dump(exclude={"id", "call_id"}) for o in resent.output
    ]
    # the first turn's prompt and the call the model wrote come from the cache
    assert chained.usage.input_tokens_details.cached_tokens > first.usage.input_tokens
    # input items of a stored response, with ids; store=False keeps nothing
    listed = list(c.responses.input_items.list(chained.id, order="asc"))
    assert [x.type for x in listed] == ["function_call_output"] and listed[0].id
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(resent.id)


def test_stored_responses_retrieve_list_and_delete(srv):
    c = srv.client()
    r = c.responses.create(
        model="tiny",
        input=[
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ],
        max_output_tokens=4,
        temperature=0,
        metadata={"k": "v"},
    )
    got = c.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump() and got.metadata == {"k": "v"}
    asc = list(c.responses.input_items.list(r.id, order="asc"))
    assert [x.content[0].text for x in asc] == ["a", "b", "c"]
    desc = c.responses.input_items.list(r.id, limit=2)  # newest first, OpenAI's default
    assert [x.content[0].text for x in desc.data] == ["c", "b"] and desc.has_more
    c.responses.delete(r.id)
    for call in (
        lambda: c.responses.retrieve(r.id),
        lambda: c.responses.delete(r.id),
        lambda: c.responses.input_items.list(r.id),
    ):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        assert e.value.body["code"] == "response_not_found"
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.create(model="tiny", input="x", previous_response_id=r.id)
    assert e.value.body["param"] == "previous_response_id"


def test_the_store_is_bounded_oldest_first(srv):
    from goinfer.server.responses_store import ResponseStore, Stored

    s = ResponseStore(max_responses=3)
    for i in range(5):
        s.put(f"r{i}", Stored({"id": i}, [], []))
    assert [s.get(f"r{i}") is not None for i in range(5)] == [False, False, True, True, True]
    small = ResponseStore(max_bytes=200)
    small.put("a", Stored({"t": "x" * 100}, [], []))
    small.put("b", Stored({"t": "y" * 100}, [], []))
    assert small.get("a") is None and small.get("b") is not None and small.evicted == 1


def test_namespaced_and_free_form_tools(srv):
    c = srv.client()
    ns = {
        "type": "namespace",
        "name": "agents",
        "description": "Sub-agents.",
        "tools": [
            {
                "type": "function",
                "name": "spawn",
                "parameters": {
                    "type": "object",
                    "properties": {"task": {"type": "string", "maxLength": 8}},
                    "required": ["task"],
                    "additionalProperties": False,
                },
            }
        ],
    }
    r = c.responses.create(
        model="tiny",
        input="Spawn one.",
        tools=[WEATHER, ns],
        tool_choice={"type": "function", "name": "spawn", "namespace": "agents"},
        max_output_tokens=300,
        temperature=0,
    )
    call = r.output[-1]
    assert (call.type, call.name, call.namespace) == ("function_call", "spawn", "agents")
    assert isinstance(json.loads(call.arguments)["task"], str)
    code = {
        "type": "custom",
        "name": "code",
        "description": "A code.",
        "format": {"type": "grammar", "syntax": "regex", "definition": "[A-Z]{2}-[0-9]{3}"},
    }
    r = c.responses.create(
        model="tiny",
        input="A code.",
        tools=[code],
        tool_choice={"type": "custom", "name": "code"},
        max_output_tokens=300,
        temperature=0,
    )
    call = r.output[-1]
    assert call.type == "custom_tool_call" and call.id.startswith("ctc_")
    assert re.fullmatch("[A-Z]{2}-[0-9]{3}", call.input)
    # streamed: announced, then its input, then done
    raw = srv.post(
        "/v1/responses",
        {
            "model": "tiny",
            "input": "A code.",
            "tools": [code],
            "tool_choice": {"type": "custom", "name": "code"},
            "max_output_tokens": 300,
            "temperature": 0,
            "stream": True,
        },
    )
    evs = [e for e in sse_events(raw.text) if e != "ping"]
    kinds = [e["type"] for e in evs]
    assert kinds[2:] == [
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert evs[3]["delta"] == call.input and evs[-2]["item"]["input"] == call.input
    # sent back, a free-form call renders as the call the model wrote: cached to its end
    again = c.responses.create(
        model="tiny",
        tools=[code],
        max_output_tokens=4,
        temperature=0,
        input=[
            {"role": "user", "content": "A code."},
            call.model_dump(exclude_none=True),
            {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "ok"},
        ],
    )
    assert again.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens


PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files.",
    "format": {
        "type": "grammar",
        "syntax": "lark",
        "definition": 'start: "*** Begin Patch" LF line+ "*** End Patch" LF?\n'
        'line: ("+" | "-") /[a-z" ]{0,6}/ LF  // a line of the patch\n'
        "%import common.LF\n",
    },
}
# the same language, written independently as a Python regex
PATCH_RE = r'\*\*\* Begin Patch\n([+-][a-z" ]{0,6}\n)+\*\*\* End Patch\n?'
QUOTE = {
    "type": "custom",
    "name": "quote",
    "format": {
        "type": "grammar",
        "syntax": "lark",
        "definition": 'start: "say \\"" WORD "\\\\" DIGIT "\\"" LF\n'
        "%import common.WORD\n%import common (DIGIT, LF)\n",
    },
}
QUOTE_RE = r'say "[A-Za-z]+\\[0-9]"\n'


@pytest.mark.parametrize("tool,pattern", [(PATCH, PATCH_RE), (QUOTE, QUOTE_RE)])
def test_a_lark_grammar_holds_a_free_form_input(srv, tool, pattern):
    """The call is a JSON call object, its input string held to the tool's Lark grammar
    through the JSON escapes of quotes, backslashes and line breaks."""
    choice = {"type": "custom", "name": tool["name"]}
    for seed in range(3):
        r = srv.client().responses.create(
            model="tiny",
            input="Patch it.",
            tools=[tool, WEATHER],
            tool_choice=choice,
            max_output_tokens=400,
            temperature=1.0,
            extra_body={"seed": seed},
        )
        call = r.output[-1]
        assert r.status == "completed" and call.type == "custom_tool_call"
        assert re.fullmatch(pattern, call.input), call.input


def test_hosted_tools_are_left_out_and_reported(srv, model):
    tools = [
        {"type": "web_search"},
        {"type": "file_search", "vector_store_ids": ["v"]},
        {
            "type": "computer_use_preview",
            "display_width": 10,
            "display_height": 10,
            "environment": "linux",
        },
    ]
    r = srv.client().responses.create(
        model="tiny", input="Hi.", tools=tools, max_output_tokens=8, temperature=0
    )
    assert r.status in ("completed", "incomplete")
    assert r.model_dump()["tools_left_out"] == ["web_search", "file_search", "computer_use_preview"]
    assert r.output_text == _lone_text(model, msgs("Hi."), 8).content  # no tool prompt
    # items of a hosted tool sent back are left out too
    r2 = srv.client().responses.create(
        model="tiny",
        max_output_tokens=8,
        temperature=0,
        input=[
            {"role": "user", "content": "Hi."},
            {
                "type": "web_search_call",
                "id": "ws_1",
                "status": "completed",
                "action": {"type": "search", "query": "x"},
            },
        ],
    )
    assert r2.usage.input_tokens == r.usage.input_tokens


# ============================================================================ errors


BAD = [
    ({"input": "x", "frobnicate": 1}, "frobnicate", "unknown_parameter"),
    ({}, "input", "invalid_value"),
    ({"input": 5}, "input", "invalid_type"),
    ({"input": [{"type": "mystery"}]}, "input", "invalid_value"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "input",
        "unsupported_content",
    ),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input", "unsupported_value"),
    (
        {"input": "x", "tools": [{"type": "function", "name": "bad name!"}]},
        "tools[0].name",
        "invalid_value",
    ),
    ({"input": "x", "tools": [{"type": "teleport"}]}, "tools[0].type", "invalid_value"),
    (
        {"input": "x", "tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}},
        "tool_choice",
        "invalid_value",
    ),
    (
        {"input": "x", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}},
        "tool_choice",
        "unsupported_value",
    ),
    (
        {"input": "x", "tools": [dict(WEATHER, parameters={"type": "array"})]},
        "tools[0].parameters",
        "invalid_value",
    ),
    (
        {"input": "x", "text": {"format": {"type": "json_schema", "name": "a b", "schema": {}}}},
        "text.format.name",
        "invalid_value",
    ),
    ({"input": "x", "reasoning": {"effort": "enormous"}}, "reasoning.effort", "invalid_value"),
    (
        {
            "input": "x",
            "tools": [
                {
                    "type": "custom",
                    "name": "c",
                    "format": {
                        "type": "grammar",
                        "syntax": "lark",
                        "definition": "start: x\n%ignore y",
                    },
                }
            ],
        },
        "tools[0].format",
        "invalid_grammar",
    ),
    ({"input": "x", "include": ["everything"]}, "include", "invalid_value"),
    ({"input": "x", "background": True}, "background", "unsupported_value"),
    ({"input": "x", "temperature": 3}, "temperature", "invalid_value"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
]


@pytest.mark.parametrize("body,param,code", BAD)
def test_bad_requests_are_400_in_openais_shape(srv, body, param, code):
    n0 = srv.engine.n_finished
    with pytest.raises(openai.BadRequestError) as e:
        srv.client().responses.create(
            model="tiny", **body
        ) if "frobnicate" not in body else srv.client().responses.create(
            model="tiny", input="x", extra_body={"frobnicate": 1}
        )
    err = e.value.body
    assert (err["param"], err["code"], err["type"]) == (param, code, "invalid_request_error")
    assert srv.engine.n_finished == n0  # nothing was generated


def test_context_overflow_is_a_400(srv):
    r = srv.post("/v1/responses", {"model": "tiny", "input": "x", "max_output_tokens": 10**6})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


# ============================================================================ agents' turns


CODEX_TOOLS = [
    dict(WEATHER, strict=False),
    {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Sub-agents.",
        "tools": [
            {
                "type": "function",
                "name": "spawn_agent",
                "strict": False,
                "parameters": {
                    "type": "object",
                    "properties": {"message": {"type": "string"}},
                    "additionalProperties": False,
                },
            }
        ],
    },
    {
        "type": "custom",
        "name": "apply_patch",
        "description": "Edit files.",
        "format": {
            "type": "grammar",
            "syntax": "lark",
            "definition": 'start: "*** Begin Patch" LF line+ "*** End Patch" LF?\n'
            'line: "+" /[a-z ]*/ LF\n%import common.LF\n',
        },
    },
    {"type": "web_search", "external_web_access": False},
]


def _codex_turn(items: list, key: str) -> dict:
    """A request as Codex sends it: no instructions (developer items), streamed, store off,
    encrypted reasoning asked for, a session key, and per-turn metadata never rendered."""
    return {
        "model": "tiny",
        "input": items,
        "tools": CODEX_TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": key,
        "client_metadata": {"turn_id": f"turn-{len(items)}"},
        "max_output_tokens": 12,
        "temperature": 0,
    }


def _final(raw) -> dict:
    evs = [e for e in sse_events(raw.text) if e != "ping"]
    return evs[-1]["response"]


def test_codex_shaped_turns_are_pure_appends(srv):
    """Turn after turn the prompt of the previous turn, and the reply the model wrote, come
    from the cache: nothing per request is rendered, the tools render the same way each turn,
    the items sent back render as the model wrote them."""
    items = [
        {
            "type": "message",
            "id": "msg_a",
            "role": "developer",
            "content": [{"type": "input_text", "text": "You are a coding agent."}],
        },
        {
            "type": "message",
            "id": "msg_b",
            "role": "developer",
            "content": [{"type": "input_text", "text": "Sandbox: read-only."}],
        },
        {
            "type": "message",
            "id": "msg_c",
            "role": "user",
            "content": [{"type": "input_text", "text": "<environment_context/>"}],
        },
        {
            "type": "message",
            "id": "msg_d",
            "role": "user",
            "content": [{"type": "input_text", "text": "say hi"}],
        },
    ]
    from goinfer.server.openai_responses import ROUTE
    from goinfer.server.runner import prompt_ids

    prev, prev_out, block = None, 0, srv.cache.block_size
    for turn in range(3):
        body = _codex_turn(items, "sess-1")
        ids, _ = prompt_ids(srv.model, ROUTE.parse(body, srv.model.vocab_size))
        out = _final(srv.post("/v1/responses", body))
        u = out["usage"]
        assert out["tools_left_out"] == ["web_search"] and u["input_tokens"] == len(ids)
        if prev is not None:
            assert ids[: len(prev)] == prev  # the prompt grew by appending
            # the previous prompt and the reply the model wrote (all but its last token, never
            # fed) came from the cache, in whole blocks
            done = len(prev) + prev_out - 1
            assert u["input_tokens_details"]["cached_tokens"] >= done // block * block
        prev, prev_out = ids, u["output_tokens"]
        items = (
            items
            + [dict(o) for o in out["output"]]
            + [
                {
                    "type": "message",
                    "id": f"msg_u{turn}",
                    "role": "user",
                    "content": [{"type": "input_text", "text": f"again {turn}"}],
                }
            ]
        )
    metrics = httpx.get(srv.url + "/metrics").text
    assert re.search(r'goinfer_cache_key_requests_total\{key="sess-1"\} 3', metrics)
    cached = re.search(r'goinfer_cache_key_cached_tokens_total\{key="sess-1"\} (\d+)', metrics)
    assert int(cached.group(1)) > 0


THINK = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['reasoning_content'] is defined and m['reasoning_content'] %}<think>\n"
    "{{ m['reasoning_content'] }}\n</think>\n\n{% endif %}"
    "{{ m['content'] if m['content'] is not none else '' }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)


@pytest.fixture(scope="module")
def think_srv(tiny, tmp_path_factory):
    hf, _ = tiny("llama", 5, max_position_embeddings=8192)
    path = tinymodels.write_gguf(
        hf, "llama", tmp_path_factory.mktemp("think") / "t.gguf", chat_template=THINK
    )
    m = load(path)
    with Server(m, KVCache(m, max_tokens=8192)) as s:
        yield s


def test_reasoning_items_round_trip(think_srv):
    c = think_srv.client()
    ask = {"role": "user", "content": "Think."}
    first = c.responses.create(
        model="tiny",
        input=[ask],
        max_output_tokens=10,
        temperature=0,
        include=["reasoning.encrypted_content"],
        reasoning={"summary": "auto"},
    )
    rs = first.output[0]
    assert rs.type == "reasoning" and rs.id.startswith("rs_") and rs.encrypted_content
    text = rs.content[0].text
    assert text and rs.summary[0].text == text
    assert first.usage.output_tokens_details.reasoning_tokens > 0
    # the reasoning sent back (only its opaque value) renders as stored: the same prompt
    more = {"role": "user", "content": "More."}
    sent = [
        {"type": "reasoning", "id": rs.id, "summary": [], "encrypted_content": rs.encrypted_content}
    ] + [o.model_dump(exclude_none=True) for o in first.output[1:]]
    a = c.responses.create(
        model="tiny", input=[ask] + sent + [more], max_output_tokens=4, temperature=0
    )
    b = c.responses.create(
        model="tiny",
        previous_response_id=first.id,
        input=[more],
        max_output_tokens=4,
        temperature=0,
    )
    assert a.usage.input_tokens == b.usage.input_tokens
    assert b.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    # streamed: reasoning deltas in a reasoning item before the answer's
    raw = think_srv.post(
        "/v1/responses",
        {
            "model": "tiny",
            "input": "Think.",
            "stream": True,
            "max_output_tokens": 10,
            "temperature": 0,
        },
    )
    kinds = [e["type"] for e in sse_events(raw.text) if e != "ping"]
    assert kinds[2:5] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
    ]


# ============================================================================ roles


# Gemma 3's own template (as Hugging Face ships it) refuses two turns of one role in a row
ALTERNATING = (
    "{% for m in messages %}{% if loop.index0 > 0 and m['role'] == "
    "messages[loop.index0 - 1]['role'] %}"
    "{{ raise_exception('Conversation roles must alternate') }}{% endif %}"
    "<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
)


def test_templates_that_want_alternating_roles_get_runs_joined():
    assert alternates_roles(ALTERNATING)
    assert not alternates_roles(tinymodels.CHATML) and not alternates_roles(GEMMA_TEMPLATE)
    m = [
        {"role": "system", "content": "a"},
        {"role": "system", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "user", "content": "d"},
        {"role": "assistant", "content": "e"},
        {"role": "user", "content": "f"},
    ]
    assert join_same_roles(m) == [
        {"role": "system", "content": "a\n\nb"},
        {"role": "user", "content": "c\n\nd"},
        m[4],
        m[5],
    ]
