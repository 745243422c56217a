"""LangChain (langchain-openai's ChatOpenAI) and LangGraph (a tool-calling graph)."""

from __future__ import annotations

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
from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

weather = tool(get_weather)


def _llm(server) -> ChatOpenAI:
    return ChatOpenAI(
        model=server.model,
        base_url=server.base_url,
        api_key=server.api_key,
        temperature=TEMPERATURE,
        max_tokens=MAX_TOKENS,
        max_retries=0,
    )


def test_tool_loop(server):
    """A LangGraph agent: the first model step must call a tool (tool_choice "required"), a
    ToolNode runs it, the next step answers in text (tool_choice "none")."""
    llm = _llm(server)
    forced = llm.bind_tools([weather], tool_choice="required")
    answer = llm.bind_tools([weather], tool_choice="none")

    def agent(state: MessagesState) -> dict:
        used = any(isinstance(m, ToolMessage) for m in state["messages"])
        return {"messages": [(answer if used else forced).invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([weather]))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    out = g.compile().invoke(
        {"messages": [("system", SYSTEM), ("user", WEATHER_QUESTION)]}, {"recursion_limit": 6}
    )
    msgs = out["messages"]
    first = msgs[2]
    assert isinstance(first, AIMessage) and first.tool_calls, first
    call = first.tool_calls[0]
    assert call["name"] == "get_weather"
    assert not first.invalid_tool_calls, first.invalid_tool_calls
    assert set(call["args"]) <= {"city"}, f"undeclared argument keys in {call['args']}"
    result = next(m for m in msgs if isinstance(m, ToolMessage))
    assert result.status == "success", result
    final = msgs[-1]
    assert isinstance(final, AIMessage) and not final.tool_calls and final.text.strip(), final


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_structured_output(server, method):
    """with_structured_output in each of its methods; json_mode (response_format json_object)
    leaves the keys to the prompt."""
    prompt = [("user", EXTRACT_PROMPT)]
    if method == "json_mode":
        prompt.insert(0, ("system", JSON_INSTRUCTIONS))
    llm = _llm(server).with_structured_output(Person, method=method, include_raw=True)
    out = llm.invoke(prompt)
    raw = out["raw"]
    finish = raw.response_metadata.get("finish_reason")
    assert out["parsing_error"] is None, f"{out['parsing_error']!r} (finish_reason {finish})"
    bad = [c.get("args") for c in getattr(raw, "invalid_tool_calls", [])]
    assert out["parsed"] is not None, f"nothing parsed (finish_reason {finish}), invalid: {bad}"
    check_person(out["parsed"])


def test_stream(server):
    """stream(): the chunks make the invoke() reply (temperature 0), with usage at the end."""
    llm = ChatOpenAI(
        model=server.model,
        base_url=server.base_url,
        api_key=server.api_key,
        temperature=TEMPERATURE,
        max_tokens=MAX_TOKENS,
        stream_usage=True,
    )
    msgs = [("system", SYSTEM), ("user", "Name three colours of the rainbow.")]
    chunks = list(llm.stream(msgs))
    assert len(chunks) > 2
    whole = chunks[0]
    for c in chunks[1:]:
        whole += c
    assert whole.usage_metadata and whole.usage_metadata["output_tokens"] > 0
    assert whole.text.strip() and whole.text == llm.invoke(msgs).text


def test_stream_tool_call(server):
    """A forced tool call streamed: the tool_call_chunks add up to a call with valid JSON
    arguments, the schema's keys only."""
    llm = _llm(server).bind_tools([weather], tool_choice="required")
    whole: AIMessageChunk | None = None
    for c in llm.stream([("user", WEATHER_QUESTION)]):
        whole = c if whole is None else whole + c
    assert whole is not None and whole.tool_call_chunks, whole
    assert not whole.invalid_tool_calls, whole.invalid_tool_calls
    assert whole.tool_calls[0]["name"] == "get_weather"
    json_args(whole.tool_call_chunks[0]["args"], {"city"})
