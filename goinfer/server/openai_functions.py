"""OpenAI's deprecated function calling (``functions`` / ``function_call``), which some
frameworks still send, served as tools.

The request's ``functions`` become function tools and ``function_call`` the tool_choice (one
call per reply, as that API makes); a history's assistant ``function_call`` and ``function``
results become tool calls and tool results (ids made up from their place in the history, so
every turn renders the same prompt); the reply carries ``message.function_call`` (streamed as
``delta.function_call``) and finish_reason "function_call", as OpenAI answers such a request.
"""

from __future__ import annotations

import re

from goinfer.chat.spec import ToolCallDelta
from goinfer.server.errors import bad

__all__ = ["tool_fields", "history", "reply_message", "stream_delta", "finish_reason"]


def tool_fields(body: dict) -> tuple[list | None, object, object, bool]:
    """(tools, tool_choice, parallel_tool_calls, legacy) of a Chat Completions body: its own
    tool fields, or its functions as tools (legacy=True).  Both at once: a 400."""
    functions, call = body.get("functions"), body.get("function_call")
    if functions is None and call is None:
        return body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"), False
    for theirs in ("tools", "tool_choice", "parallel_tool_calls"):
        if body.get(theirs) is not None:
            raise bad(
                f"give 'functions' / 'function_call' (deprecated) or '{theirs}', not both",
                "functions" if functions is not None else "function_call",
                "invalid_value",
            )
    if functions is not None and not isinstance(functions, list):
        raise bad(
            "'functions' must be a list of {'name', 'description', 'parameters'}",
            "functions",
            "invalid_type",
        )
    tools = [{"type": "function", "function": f} for f in functions or []] or None
    if call is None or call in ("auto", "none"):
        choice = call
    elif isinstance(call, dict) and set(call) == {"name"} and isinstance(call["name"], str):
        choice = {"type": "function", "function": {"name": call["name"]}}
    else:
        raise bad(
            "'function_call' must be 'auto', 'none' or {'name': ...}",
            "function_call",
            "invalid_value",
        )
    return tools, choice, False, True


_TOOLS_PARAM = re.compile(r"^tools(\[\d+\])(\.function)?")


def param(p: str | None) -> str | None:
    """The field of a functions request a tool error names (tools[0].function.name ->
    functions[0].name, tool_choice -> function_call)."""
    if p is None:
        return p
    if p.startswith("tool_choice"):
        return "function_call"
    return _TOOLS_PARAM.sub(lambda m: "functions" + m.group(1), p).replace("tools", "functions")


def history(messages: list) -> list:
    """A history with assistant function_call messages as tool calls and function results as
    tool results (the last call of that name)."""
    out, last = [], {}
    for i, m in enumerate(messages):
        if (
            isinstance(m, dict)
            and m.get("role") == "assistant"
            and m.get("function_call") is not None
        ):
            fc = m["function_call"]
            if (
                not isinstance(fc, dict)
                or not isinstance(fc.get("name"), str)
                or not isinstance(fc.get("arguments", ""), str)
            ):
                raise bad(
                    f"messages[{i}].function_call must be {{'name': str, 'arguments': str}}",
                    "messages",
                    "invalid_value",
                )
            cid = f"call{i:05d}"  # 9 letters and digits, as Mistral's templates want
            last[fc["name"]] = cid
            m = {k: v for k, v in m.items() if k != "function_call"}
            m["tool_calls"] = [
                {
                    "id": cid,
                    "type": "function",
                    "function": {"name": fc["name"], "arguments": fc.get("arguments", "")},
                }
            ]
        elif isinstance(m, dict) and m.get("role") == "function":
            name = m.get("name")
            if not isinstance(name, str):
                raise bad(
                    f"messages[{i}]: a 'function' message needs its function's 'name'",
                    "messages",
                    "invalid_value",
                )
            m = {
                "role": "tool",
                "tool_call_id": last.get(name, f"call{i:05d}"),
                "name": name,
                "content": m.get("content"),
            }
        out.append(m)
    return out


def reply_message(message: dict) -> dict:
    """A reply's message with its (one) tool call as function_call."""
    calls = message.pop("tool_calls", None)
    if calls:
        fn = calls[0]["function"]
        message["function_call"] = {"name": fn["name"], "arguments": fn["arguments"]}
    return message


def stream_delta(ev: ToolCallDelta) -> dict:
    """A piece of the streamed call as delta.function_call."""
    if ev.id is None:
        return {"function_call": {"arguments": ev.arguments}}
    return {"function_call": {"name": ev.name, "arguments": ev.arguments}}


def finish_reason(reason: str | None) -> str | None:
    return "function_call" if reason == "tool_calls" else reason
