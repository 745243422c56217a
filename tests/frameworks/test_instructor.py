"""instructor over the openai client, in each of its OpenAI modes."""

from __future__ import annotations

from collections.abc import Iterable

import instructor
import pytest
from common import (
    EXTRACT_PROMPT,
    LIST_PROMPT,
    MAX_TOKENS,
    SYSTEM,
    TEMPERATURE,
    WEATHER_QUESTION,
    Person,
    check_person,
    get_weather,
)
from openai import OpenAI
from pydantic import BaseModel, Field


def _client(server, mode: instructor.Mode) -> instructor.Instructor:
    return instructor.from_openai(
        OpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0), mode=mode
    )


KW = dict(temperature=TEMPERATURE, max_tokens=MAX_TOKENS, max_retries=1)


class GetWeather(BaseModel):
    """Get the current weather in a city."""

    city: str = Field(description="the city's name, e.g. Paris")


def test_tool_loop(server):
    """The call extracted as a tool call (TOOLS mode forces the function), the tool runs, its
    result goes back with the call, the model answers (response_model=None: a plain reply)."""
    client = _client(server, instructor.Mode.TOOLS)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": WEATHER_QUESTION}]
    call, completion = client.chat.completions.create_with_completion(
        model=server.model, response_model=GetWeather, messages=msgs, **KW
    )
    assert isinstance(call, GetWeather) and call.city.strip(), call
    tc = completion.choices[0].message.tool_calls[0]
    msgs.append(
        {
            "role": "assistant",
            "content": completion.choices[0].message.content,
            "tool_calls": [tc.model_dump()],
        }
    )
    msgs.append({"role": "tool", "tool_call_id": tc.id, "content": get_weather(call.city)})
    final = client.chat.completions.create(
        model=server.model,
        response_model=None,
        messages=msgs,
        temperature=TEMPERATURE,
        max_tokens=MAX_TOKENS,
    )
    text = final.choices[0].message.content
    assert text and text.strip(), final


@pytest.mark.parametrize("mode", ["TOOLS", "TOOLS_STRICT", "JSON_SCHEMA"])
def test_structured_output(server, mode):
    """response_model=Person in each mode that gives the server the schema: a forced tool
    call (TOOLS; TOOLS_STRICT with additionalProperties false) or a json_schema
    response_format (JSON_SCHEMA).  (FUNCTIONS is sent as TOOLS by this version.)"""
    out = _client(server, instructor.Mode[mode]).chat.completions.create(
        model=server.model,
        response_model=Person,
        messages=[{"role": "user", "content": EXTRACT_PROMPT}],
        **KW,
    )
    check_person(out)


@pytest.mark.model_bound
@pytest.mark.parametrize("mode", ["JSON", "MD_JSON", "PARALLEL_TOOLS"])
def test_structured_output_prompted(server, mode):
    """The modes that leave the schema to the model: JSON and MD_JSON write it into the
    prompt (JSON adds response_format json_object, any object), PARALLEL_TOOLS sends
    tool_choice "auto".  Tiny models copy the schema or talk instead of calling."""
    model = Iterable[Person] if mode == "PARALLEL_TOOLS" else Person
    out = _client(server, instructor.Mode[mode]).chat.completions.create(
        model=server.model,
        response_model=model,
        messages=[{"role": "user", "content": EXTRACT_PROMPT}],
        **KW,
    )
    people = list(out) if mode == "PARALLEL_TOOLS" else [out]
    assert people, out
    for p in people:
        check_person(p)


@pytest.mark.parametrize(
    "mode",
    [
        "TOOLS",
        # the schema's only key is "tasks" (a list of Person): gemma3-270m writes a task there
        pytest.param("JSON_SCHEMA", marks=pytest.mark.model_bound),
    ],
)
def test_iterable(server, mode):
    """create_iterable: a list of people, streamed one by one."""
    client = _client(server, instructor.Mode[mode])
    people = list(
        client.chat.completions.create_iterable(
            model=server.model,
            response_model=Person,
            messages=[{"role": "user", "content": LIST_PROMPT}],
            **KW,
        )
    )
    assert people
    for p in people:
        check_person(p)


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_stream(server, mode):
    """create_partial: partial objects while the reply streams, the last one complete."""
    client = _client(server, instructor.Mode[mode])
    partials = list(
        client.chat.completions.create_partial(
            model=server.model,
            response_model=Person,
            messages=[{"role": "user", "content": EXTRACT_PROMPT}],
            **KW,
        )
    )
    assert len(partials) > 1, partials
    check_person(Person.model_validate(partials[-1].model_dump()))
