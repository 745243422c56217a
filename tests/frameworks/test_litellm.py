"""litellm's completion() with the "openai/" provider pointed at the server."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no download at import

import litellm  # noqa: E402
import pytest  # noqa: E402
from common import (  # noqa: E402
    EXTRACT_PROMPT,
    JSON_INSTRUCTIONS,
    MAX_TOKENS,
    SYSTEM,
    TEMPERATURE,
    WEATHER_QUESTION,
    WEATHER_TOOL,
    Person,
    check_person,
    get_weather,
    json_args,
)

litellm.telemetry = False


def _kw(server) -> dict:
    return dict(
        model=f"openai/{server.model}",
        api_base=server.base_url,
        api_key=server.api_key,
        temperature=TEMPERATURE,
        max_tokens=MAX_TOKENS,
    )


def test_tool_loop(server):
    """tool_choice "required" (a tool as a user writes it: no additionalProperties), the
    tool's result sent back, then an answer in text (tool_choice "none")."""
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": WEATHER_QUESTION}]
    r = litellm.completion(
        messages=msgs, tools=[WEATHER_TOOL], tool_choice="required", **_kw(server)
    )
    msg = r.choices[0].message
    assert msg.tool_calls, msg
    call = msg.tool_calls[0]
    assert call.function.name == "get_weather"
    args = json_args(call.function.arguments, {"city"})
    msgs.append(msg.model_dump(exclude_none=True))
    msgs.append({"role": "tool", "tool_call_id": call.id, "content": get_weather(**args)})
    r = litellm.completion(messages=msgs, tools=[WEATHER_TOOL], tool_choice="none", **_kw(server))
    final = r.choices[0].message
    assert not final.tool_calls and final.content and final.content.strip(), final


@pytest.mark.parametrize("mode", ["pydantic", "json_schema", "json_object"])
def test_structured_output(server, mode):
    """response_format: a pydantic class (litellm makes it a strict json_schema), a
    json_schema given as a dict (not strict), json_object with the keys in the prompt."""
    msgs = [{"role": "user", "content": EXTRACT_PROMPT}]
    if mode == "pydantic":
        rf = Person
    elif mode == "json_schema":
        rf = {
            "type": "json_schema",
            "json_schema": {"name": "Person", "schema": Person.model_json_schema()},
        }
    else:
        rf = {"type": "json_object"}
        msgs.insert(0, {"role": "system", "content": JSON_INSTRUCTIONS})
    r = litellm.completion(messages=msgs, response_format=rf, **_kw(server))
    ch = r.choices[0]
    assert ch.finish_reason == "stop", f"finish_reason {ch.finish_reason}: {ch.message.content!r}"
    check_person(Person.model_validate_json(ch.message.content))


def test_stream(server):
    """stream=True: stream_chunk_builder rebuilds the non-streamed reply (temperature 0),
    with the usage of the final chunk."""
    msgs = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Name three colours of the rainbow."},
    ]
    chunks = list(
        litellm.completion(
            messages=msgs, stream=True, stream_options={"include_usage": True}, **_kw(server)
        )
    )
    assert len(chunks) > 2
    built = litellm.stream_chunk_builder(chunks, messages=msgs)
    assert built.usage.completion_tokens > 0
    whole = litellm.completion(messages=msgs, **_kw(server))
    text = built.choices[0].message.content
    assert text and text.strip() and text == whole.choices[0].message.content


def test_stream_tool_call(server):
    """A forced call streamed: the tool-call deltas rebuild a call with complete JSON
    arguments of the schema's keys only."""
    msgs = [{"role": "user", "content": WEATHER_QUESTION}]
    chunks = list(
        litellm.completion(
            messages=msgs, tools=[WEATHER_TOOL], tool_choice="required", stream=True, **_kw(server)
        )
    )
    built = litellm.stream_chunk_builder(chunks, messages=msgs)
    calls = built.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather", built
    json_args(calls[0].function.arguments, {"city"})
