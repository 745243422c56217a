"""pydantic-ai on OpenAIChatModel (Chat Completions) with an OpenAIProvider at the server."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from common import (
    EXTRACT_PROMPT,
    JSON_INSTRUCTIONS,
    MAX_TOKENS,
    SYSTEM,
    TEMPERATURE,
    WEATHER_QUESTION,
    Person,
    check_person,
    get_weather,
    json_args,
)
from pydantic_ai import Agent, NativeOutput, PromptedOutput, ToolOutput
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ModelResponse, ToolCallPart, ToolReturnPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

SETTINGS = {"temperature": TEMPERATURE, "max_tokens": MAX_TOKENS}


def _model(server) -> OpenAIChatModel:
    return OpenAIChatModel(
        server.model, provider=OpenAIProvider(base_url=server.base_url, api_key=server.api_key)
    )


@dataclass
class ForceFirstStep(AbstractCapability):
    """The first model request must call one of `tools`; later ones answer in text
    (tool_choice "none"), as pydantic-ai documents for per-step tool choice."""

    tools: list[str]

    def get_model_settings(self):
        return lambda ctx: {"tool_choice": self.tools if ctx.run_step <= 1 else "none"}


def get_time(city: str) -> str:
    """Get the local time in a city.

    Args:
        city: the city's name
    """
    return f"It is noon in {city}."


def get_population(city: str) -> str:
    """Get the population of a city.

    Args:
        city: the city's name
    """
    return f"{city} has two million people."


def _calls(result) -> list[ToolCallPart]:
    return [
        p
        for m in result.all_messages()
        if isinstance(m, ModelResponse)
        for p in m.parts
        if isinstance(p, ToolCallPart)
    ]


def _returns(result) -> list[ToolReturnPart]:
    return [p for m in result.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)]


def test_tool_loop(server):
    """A named forced call on the first step (tool_choice {"type": "function"}), the tool
    runs, the next step answers in text."""
    agent = Agent(
        _model(server),
        instructions=SYSTEM,
        tools=[get_weather],
        capabilities=[ForceFirstStep(["get_weather"])],
        model_settings=SETTINGS,
    )
    result = agent.run_sync(WEATHER_QUESTION)
    calls = _calls(result)
    assert calls and calls[0].tool_name == "get_weather", result.all_messages()
    json_args(calls[0].args_as_json_str(), {"city"})
    assert _returns(result), result.all_messages()
    assert isinstance(result.output, str) and result.output.strip(), result.output


def test_tool_subset(server):
    """The first step may use two of three tools: pydantic-ai sends tool_choice
    {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [...]}} and
    keeps all three tools declared."""
    agent = Agent(
        _model(server),
        instructions=SYSTEM,
        tools=[get_weather, get_time, get_population],
        capabilities=[ForceFirstStep(["get_weather", "get_time"])],
        model_settings=SETTINGS,
    )
    result = agent.run_sync(WEATHER_QUESTION)
    calls = _calls(result)
    assert calls and calls[0].tool_name in ("get_weather", "get_time"), result.all_messages()
    json_args(calls[0].args_as_json_str(), {"city"})
    assert isinstance(result.output, str) and result.output.strip(), result.output


def _braces(text: str) -> str:
    """A text as a str.format template (PromptedOutput's template is one)."""
    return text.replace("{", "{{").replace("}", "}}")


@pytest.mark.parametrize("mode", ["tool", "native"])
def test_structured_output(server, mode):
    """The output modes that give the server the schema: an output tool (ToolOutput, the
    default) and the model's structured output (NativeOutput: a json_schema
    response_format)."""
    output_type = {"tool": ToolOutput(Person), "native": NativeOutput(Person)}[mode]
    agent = Agent(_model(server), output_type=output_type, model_settings=SETTINGS)
    check_person(agent.run_sync(EXTRACT_PROMPT).output)


@pytest.mark.model_bound
def test_structured_output_prompted(server):
    """PromptedOutput: the schema in the instructions (after the template's text, here an
    example) and response_format json_object; tiny models copy the schema."""
    output_type = PromptedOutput(Person, template=_braces(JSON_INSTRUCTIONS))
    agent = Agent(_model(server), output_type=output_type, model_settings=SETTINGS)
    check_person(agent.run_sync(EXTRACT_PROMPT).output)


def test_stream(server):
    """run_stream: the text deltas make the output, which is the non-streamed run's."""
    agent = Agent(_model(server), instructions=SYSTEM, model_settings=SETTINGS)
    question = "Name three colours of the rainbow."

    async def run() -> tuple[list[str], str]:
        async with agent.run_stream(question) as r:
            # debounce_by=None: each delta as it arrives (the default groups 0.1 s)
            deltas = [d async for d in r.stream_text(delta=True, debounce_by=None)]
            return deltas, await r.get_output()

    deltas, output = asyncio.run(run())
    assert len(deltas) > 1, deltas
    assert "".join(deltas) == output
    assert output.strip() and output == agent.run_sync(question).output
