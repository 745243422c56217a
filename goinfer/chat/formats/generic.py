"""The generic format, for any model whose template does not render tools in a format goinfer
reads (SmolLM2, Gemma 3, ...): calls written as Hermes's ``<tool_call>`` blocks, taught by a
built-in tool prompt in the system message; calls in the history are written as those blocks
and results as ``<tool_response>`` blocks in a user message."""

from __future__ import annotations

import json
from collections.abc import Mapping

from goinfer.chat.formats.base import call_fields, message_text
from goinfer.chat.formats.hermes import Hermes
from goinfer.chat.spec import ToolSpec
from goinfer.errors import ChatTemplateError


class Generic(Hermes):
    name = "generic"
    native = False

    def detect(self, template: str) -> bool:
        return False  # the fallback, never detected

    def render(self, messages: list, spec: ToolSpec | None) -> tuple[list, None]:
        out: list[dict] = []
        for m in messages:
            if not isinstance(m, Mapping):
                raise ChatTemplateError(f"a chat message must be a dict, got {m!r}")
            role = m.get("role")
            if role == "tool":
                block = f"<tool_response>\n{message_text(m.get('content'))}\n</tool_response>"
                if out and out[-1].get("_tool_results"):
                    out[-1]["content"] += "\n" + block
                else:
                    out.append({"role": "user", "content": block, "_tool_results": True})
            elif role == "assistant" and m.get("tool_calls"):
                calls = "\n".join(_call_block(c) for c in m["tool_calls"])
                text = message_text(m.get("content"))
                msg = {k: v for k, v in m.items() if k != "tool_calls"}
                msg["content"] = f"{text}\n{calls}" if text else calls
                out.append(msg)
            else:
                out.append(dict(m))
        out = [{k: v for k, v in m.items() if k != "_tool_results"} for m in out]
        if spec is not None:
            prompt = tool_prompt(spec.tools)
            if out and out[0].get("role") in ("system", "developer"):
                first = message_text(out[0].get("content"))
                out[0] = dict(out[0], content=f"{first}\n\n{prompt}" if first else prompt)
            else:
                out.insert(0, {"role": "system", "content": prompt})
        return out, None


def tool_prompt(tools) -> str:
    """The built-in tool prompt: the tools and the exact call format."""
    lines = "\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\n"
        "You can call functions to help with the user's request. The functions are listed "
        "as JSON schemas inside <tools></tools>:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "To call a function, answer with one <tool_call></tool_call> block per call, each "
        "holding a JSON object with the function's name and its arguments, exactly like this:\n"
        "<tool_call>\n"
        '{"name": "<function-name>", "arguments": {"<argument>": <value>}}\n'
        "</tool_call>\n"
        "Each result comes back inside <tool_response></tool_response>."
    )


def _call_block(call) -> str:
    name, args = call_fields(call)
    raw = call.get("function", call).get("arguments")
    if isinstance(raw, str) and isinstance(args, dict):
        body = raw.strip()  # the text the model wrote, so the prompt repeats it token for token
    else:
        body = json.dumps(args, ensure_ascii=False)
    name = json.dumps(name, ensure_ascii=False)
    return f'<tool_call>\n{{"name": {name}, "arguments": {body}}}\n</tool_call>'


FORMAT = Generic()
