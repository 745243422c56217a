"""smolagents: a ToolCallingAgent (every step a forced tool call: tool_choice "required";
the run ends with a call of its final_answer tool) on OpenAIServerModel.

A tiny model left to choose calls final_answer at once or get_weather again and again; so
the first step is offered get_weather only and, once it has been called, a step callback
swaps it for final_answer: each step's forced call has one tool to call."""

from __future__ import annotations

import json

import pytest
from common import EXTRACT_PROMPT, MAX_TOKENS, TEMPERATURE, WEATHER_QUESTION, Person, check_person
from common import get_weather as _get_weather
from smolagents import ActionStep, OpenAIServerModel, ToolCallingAgent, tool


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
        city: the city's name, e.g. Paris
    """
    return _get_weather(city)


def _model(server) -> OpenAIServerModel:
    return OpenAIServerModel(
        model_id=server.model,
        api_base=server.base_url,
        api_key=server.api_key,
        temperature=TEMPERATURE,
        max_tokens=MAX_TOKENS,
    )


class WeatherThenAnswer:
    """Takes final_answer out of the agent's tools until get_weather has been called, then
    get_weather out."""

    def __init__(self, agent: ToolCallingAgent):
        self.final_answer = agent.tools.pop("final_answer")

    def __call__(self, step: ActionStep, agent: ToolCallingAgent) -> None:
        if any(c.name == "get_weather" for c in step.tool_calls or []):
            agent.tools.pop("get_weather", None)
            agent.tools["final_answer"] = self.final_answer


def _run(server, stream: bool) -> None:
    agent = ToolCallingAgent(
        tools=[get_weather],
        model=_model(server),
        max_steps=3,
        stream_outputs=stream,
        verbosity_level=0,
    )
    agent.step_callbacks.register(ActionStep, WeatherThenAnswer(agent))
    result = agent.run(WEATHER_QUESTION, return_full_result=True)
    steps = [s for s in agent.memory.steps if isinstance(s, ActionStep)]
    errors = [str(s.error).splitlines()[0] for s in steps if s.error]
    assert result.state == "success", f"{result.state}: step errors {errors}"
    called = [c.name for s in steps for c in (s.tool_calls or [])]
    assert "get_weather" in called, f"tools called: {called}, step errors {errors}"
    assert not errors, errors
    assert str(result.output).strip(), result.output


def test_tool_loop(server):
    """The agent calls get_weather, gets its result and calls final_answer."""
    _run(server, stream=False)


def test_stream(server):
    """The same run with stream_outputs: the tool calls are assembled from streamed deltas."""
    _run(server, stream=True)


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non_strict"])
def test_structured_output(server, strict):
    """Model.generate with a json_schema response_format (what smolagents' CodeAgent uses for
    structured outputs), strict (additionalProperties false) or not."""
    schema = Person.model_json_schema()
    if strict:
        schema["additionalProperties"] = False
    rf = {
        "type": "json_schema",
        "json_schema": {"name": "Person", "schema": schema, "strict": strict},
    }
    msg = _model(server).generate(
        [{"role": "user", "content": [{"type": "text", "text": EXTRACT_PROMPT}]}],
        response_format=rf,
    )
    check_person(Person.model_validate(json.loads(msg.content)))
