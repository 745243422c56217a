"""openai-agents (the OpenAI Agents SDK) on its Chat Completions model."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from agents import (
    Agent,
    AgentHooks,
    AgentOutputSchema,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    ToolCallItem,
    ToolCallOutputItem,
    function_tool,
    set_tracing_disabled,
)
from common import (
    EXTRACT_PROMPT,
    MAX_TOKENS,
    SYSTEM,
    TEMPERATURE,
    WEATHER_QUESTION,
    Person,
    check_person,
    get_weather,
    json_args,
)
from openai import AsyncOpenAI
from openai.types.responses import ResponseTextDeltaEvent

set_tracing_disabled(True)  # the SDK would otherwise upload traces to OpenAI


def _model(server) -> OpenAIChatCompletionsModel:
    client = AsyncOpenAI(base_url=server.base_url, api_key=server.api_key)
    return OpenAIChatCompletionsModel(model=server.model, openai_client=client)


def _settings(**kw) -> ModelSettings:
    return ModelSettings(temperature=TEMPERATURE, max_tokens=MAX_TOKENS, **kw)


class AnswerAfterTools(AgentHooks):
    """After a tool has run, tool_choice "none": the next turn answers in text (a tiny model
    left on "auto" may call the tool again and again)."""

    async def on_tool_end(self, context, agent, tool, result) -> None:
        agent.model_settings = dataclasses.replace(agent.model_settings, tool_choice="none")


def test_tool_loop(server):
    """tool_choice "required" on the first turn, the tool runs, the model answers in text with
    the tool's result in the conversation."""
    agent = Agent(
        name="weather",
        instructions=SYSTEM,
        model=_model(server),
        tools=[function_tool(get_weather)],
        hooks=AnswerAfterTools(),
        reset_tool_choice=False,
        model_settings=_settings(tool_choice="required"),
    )
    result = Runner.run_sync(agent, WEATHER_QUESTION, max_turns=4)
    calls = [i for i in result.new_items if isinstance(i, ToolCallItem)]
    outputs = [i for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    assert calls and outputs, result.new_items
    assert calls[0].raw_item.name == "get_weather"
    json_args(calls[0].raw_item.arguments, {"city"})
    assert isinstance(result.final_output, str) and result.final_output.strip(), result.final_output


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non_strict"])
def test_structured_output(server, strict):
    """output_type: a strict json_schema response_format, or the SDK's non-strict schema."""
    agent = Agent(
        name="extract",
        instructions="Extract the data.",
        model=_model(server),
        output_type=AgentOutputSchema(Person, strict_json_schema=strict),
        model_settings=_settings(),
    )
    result = Runner.run_sync(agent, EXTRACT_PROMPT, max_turns=1)
    check_person(result.final_output)


def test_stream(server):
    """Runner.run_streamed: the text deltas make the final output, which is the non-streamed
    run's reply (temperature 0)."""
    agent = Agent(
        name="chat", instructions=SYSTEM, model=_model(server), model_settings=_settings()
    )
    question = "Name three colours of the rainbow."

    async def run() -> tuple[str, str]:
        streamed = Runner.run_streamed(agent, question, max_turns=1)
        deltas = [
            ev.data.delta
            async for ev in streamed.stream_events()
            if ev.type == "raw_response_event" and isinstance(ev.data, ResponseTextDeltaEvent)
        ]
        assert len(deltas) > 1, deltas
        assert "".join(deltas) == streamed.final_output
        whole = await Runner.run(agent, question, max_turns=1)
        return streamed.final_output, whole.final_output

    streamed, whole = asyncio.run(run())
    assert streamed.strip() and streamed == whole


def test_prompt_cache_retention(server):
    """ModelSettings.prompt_cache_retention, sent as OpenAI's prompt_cache_retention field (a
    hint about the server's cache that cannot change the reply)."""
    agent = Agent(
        name="chat",
        instructions=SYSTEM,
        model=_model(server),
        model_settings=_settings(prompt_cache_retention="in_memory"),
    )
    result = Runner.run_sync(agent, "Say hello.", max_turns=1)
    assert isinstance(result.final_output, str) and result.final_output.strip()
