"""llama-index: OpenAILike (llama-index-llms-openai-like) as a function-calling chat model."""

from __future__ import annotations

import pytest
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
from llama_index.core.llms import ChatMessage
from llama_index.core.program import FunctionCallingProgram
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from llama_index.core.types import PydanticProgramMode
from llama_index.llms.openai_like import OpenAILike

weather = FunctionTool.from_defaults(fn=get_weather)


def _llm(server, mode: PydanticProgramMode = PydanticProgramMode.DEFAULT) -> OpenAILike:
    return OpenAILike(
        model=server.model,
        api_base=server.base_url,
        api_key=server.api_key,
        is_chat_model=True,
        is_function_calling_model=True,
        context_window=8192,
        temperature=TEMPERATURE,
        max_tokens=MAX_TOKENS,
        max_retries=0,
        pydantic_program_mode=mode,
    )


def test_tool_loop(server):
    """chat_with_tools(tool_required=True) forces a call, the tool runs, its result goes back
    as a tool message and chat() answers."""
    llm = _llm(server)
    msgs = [
        ChatMessage(role="system", content=SYSTEM),
        ChatMessage(role="user", content=WEATHER_QUESTION),
    ]
    resp = llm.chat_with_tools([weather], chat_history=list(msgs), tool_required=True)
    calls = llm.get_tool_calls_from_response(resp, error_on_no_tool_call=True)
    assert calls[0].tool_name == "get_weather"
    raw = resp.message.additional_kwargs["tool_calls"][0].function.arguments
    json_args(raw, {"city"})
    msgs.append(resp.message)
    for c in calls:
        out = weather.call(**c.tool_kwargs)
        msgs.append(
            ChatMessage(
                role="tool",
                content=str(out),
                additional_kwargs={"tool_call_id": c.tool_id, "name": c.tool_name},
            )
        )
    final = llm.chat(msgs)
    assert final.message.content and final.message.content.strip(), final


def test_structured_output(server):
    """structured_predict: a function-calling program (the call forced, the schema closed)."""
    person = _llm(server).structured_predict(Person, PromptTemplate(EXTRACT_PROMPT))
    check_person(person)


@pytest.mark.model_bound
def test_structured_output_prompted(server):
    """pydantic_program_mode LLM: the schema in the prompt, the reply parsed as text."""
    llm = _llm(server, PydanticProgramMode.LLM)
    check_person(llm.structured_predict(Person, PromptTemplate(EXTRACT_PROMPT)))


def test_stream(server):
    """stream_chat: the deltas make the chat() reply (temperature 0)."""
    llm = _llm(server)
    msgs = [
        ChatMessage(role="system", content=SYSTEM),
        ChatMessage(role="user", content="Name three colours of the rainbow."),
    ]
    parts = list(llm.stream_chat(msgs))
    assert len(parts) > 2
    text = "".join(p.delta or "" for p in parts)
    assert text == parts[-1].message.content
    assert text.strip() and text == llm.chat(msgs).message.content


def test_stream_structured(server):
    """A FunctionCallingProgram's stream_call: partial objects from the streamed tool-call
    deltas, the last one a complete Person.  (The program is built here with the call forced:
    stream_structured_predict sends tool_choice "auto", where a tiny model answers in text.)"""
    program = FunctionCallingProgram.from_defaults(
        output_cls=Person,
        prompt=PromptTemplate(EXTRACT_PROMPT),
        llm=_llm(server),
        tool_choice="Person",
    )
    parts = list(program.stream_call())
    assert len(parts) > 1, parts
    check_person(Person.model_validate(parts[-1].model_dump()))
