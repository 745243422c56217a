"""The Responses API's ``input`` items and ``tools``, as the chat layer takes them.

Input items -> chat messages (OpenAI Chat shape: role, content text, tool_calls, tool_call_id,
reasoning_content):

- ``message`` (roles user, assistant, system, developer; ``developer`` is ``system``), its
  content a string or ``input_text`` / ``output_text`` / ``refusal`` parts, in place;
- the assistant side of a turn -- a ``reasoning`` item, an assistant ``message``, then
  ``function_call`` / ``custom_tool_call`` / ``tool_search_call`` items -- is one assistant
  message (reasoning_content, content, tool_calls), the shape the model wrote it in, so a
  conversation sent back turn after turn renders as a pure append of the prompt;
- ``function_call_output`` / ``custom_tool_call_output`` / ``tool_search_output`` are tool
  results;
- items of hosted tools goinfer never runs (``web_search_call``, ...) are left out.

Tools -> function tools: ``function`` as it is; the functions of a ``namespace`` as
``NAMESPACE__NAME``; a ``custom`` (free-form) tool as a function of one string argument
``input`` (its Lark or regex grammar, if any, holds that string: goinfer/chat/freeform.py); a
client-run ``tool_search`` as the function ``tool_search``.  Hosted tools (web search, file
search, computer use, ...) are left out of the prompt and reported in the reply.

Nothing per request (item ids, statuses, metadata) reaches the prompt, and tools render the
same way each turn.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from goinfer.chat.freeform import INPUT_KEY, custom_tool_function, lark_error
from goinfer.server.errors import bad

__all__ = [
    "ToolMap",
    "translate_tools",
    "translate_choice",
    "conversation",
    "seal_reasoning",
    "open_reasoning",
    "HOSTED_TOOLS",
    "HOSTED_ITEMS",
]

HOSTED_TOOLS = {
    "web_search",
    "web_search_preview",
    "web_search_2025_08_26",
    "web_search_preview_2025_03_11",
    "file_search",
    "computer",
    "computer_use",
    "computer_use_preview",
    "code_interpreter",
    "image_generation",
    "mcp",
    "local_shell",
    "shell",
    "apply_patch",
}
HOSTED_ITEMS = {
    "web_search_call",
    "file_search_call",
    "computer_call",
    "computer_call_output",
    "code_interpreter_call",
    "image_generation_call",
    "local_shell_call",
    "local_shell_call_output",
    "shell_call",
    "shell_call_output",
    "apply_patch_call",
    "apply_patch_call_output",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
    "mcp_call",
    "compaction",
}
TEXT_PARTS = {"input_text", "output_text", "text", "summary_text", "reasoning_text"}
NS_SEP = "__"  # a namespaced function as the model sees it: NAMESPACE__NAME
TOOL_SEARCH = "tool_search"


# ============================================================================ tools


@dataclass
class ToolMap:
    """A request's tools as the chat layer takes them, and the way back from a call."""

    chat: list[dict] = field(default_factory=list)  # OpenAI Chat function tools
    params: list[str] = field(default_factory=list)  # the Responses field of each one
    # the name the model calls -> (kind, name, namespace); kind: "function" | "custom" |
    # "tool_search"
    calls: dict[str, tuple[str, str, str | None]] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)  # hosted tool types, not run

    def flat(self, kind: str, name: str, namespace: str | None = None) -> str:
        """The name the model sees for a tool (a call in the history)."""
        if kind == "tool_search":
            return TOOL_SEARCH
        return f"{namespace}{NS_SEP}{name}" if namespace else name

    def item_type(self, flat: str) -> str:
        """The output item type of a call to the tool the model calls `flat`."""
        kind = self.calls.get(flat, ("function",))[0]
        return {"function": "function_call", "custom": "custom_tool_call"}.get(
            kind, "tool_search_call"
        )

    def add(self, kind: str, name: str, ns: str | None, fn: dict, param: str) -> None:
        flat = self.flat(kind, name, ns)
        self.chat.append({"type": "function", "function": fn | {"name": flat}})
        self.params.append(param)
        self.calls[flat] = (kind, name, ns)

    def chat_param(self, param: str | None) -> str | None:
        """A chat-layer error's param ("tools[2].function.parameters") as the Responses
        field it came from ("tools[1].tools[0].parameters")."""
        if not param or not param.startswith("tools["):
            return param
        i = int(param[6 : param.index("]")])
        rest = param[param.index("]") + 1 :].replace(".function", "", 1)
        return (self.params[i] + rest) if i < len(self.params) else "tools"


def translate_tools(tools) -> ToolMap:
    """The Responses ``tools`` list -> ToolMap (400 naming the field on bad input)."""
    out = ToolMap()
    if tools is None:
        return out
    if not isinstance(tools, list):
        raise bad("'tools' must be a list", "tools", "invalid_type")
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, Mapping) or not isinstance(t.get("type"), str):
            raise bad(f"{where} must be an object with a 'type'", where, "invalid_type")
        kind = t["type"]
        if kind == "function":
            out.add("function", _name(t, where), None, _function(t), where)
        elif kind == "custom":
            name = _name(t, where)
            fmt = _custom_format(t.get("format"), f"{where}.format")
            out.add("custom", name, None, custom_tool_function(t.get("description"), fmt), where)
        elif kind == "namespace":
            ns = _name(t, where)
            inner = t.get("tools")
            if not isinstance(inner, list):
                raise bad(f"{where}.tools must be a list", f"{where}.tools", "invalid_type")
            for j, f in enumerate(inner):
                w = f"{where}.tools[{j}]"
                if not isinstance(f, Mapping) or f.get("type") not in ("function", "custom"):
                    raise bad(
                        f"{w} must be a function or custom tool", f"{w}.type", "invalid_value"
                    )
                if f.get("defer_loading"):
                    continue
                name = _name(f, w)
                if f["type"] == "function":
                    out.add("function", name, ns, _function(f), w)
                else:
                    fmt = _custom_format(f.get("format"), f"{w}.format")
                    out.add("custom", name, ns, custom_tool_function(f.get("description"), fmt), w)
        elif kind == "tool_search" and t.get("execution", "server") == "client":
            fn = {
                "description": t.get("description") or "Search for more tools.",
                "parameters": t.get("parameters") or {"type": "object", "properties": {}},
            }
            out.add("tool_search", TOOL_SEARCH, None, fn, where)
        elif kind in HOSTED_TOOLS or kind == "tool_search":
            out.left_out.append(kind)
        else:
            raise bad(
                f"{where}.type {kind!r} is not a tool type goinfer knows",
                f"{where}.type",
                "invalid_value",
            )
    return out


def _name(t: Mapping, where: str) -> str:
    name = t.get("name")
    if not isinstance(name, str) or not name:
        raise bad(f"{where}.name must be a non-empty string", f"{where}.name", "invalid_value")
    return name


def _function(t: Mapping) -> dict:
    """A Responses function tool's fields in a Chat tool's ``function`` object (``strict``
    changes nothing: goinfer holds every call to its schema)."""
    fn: dict = {}
    if t.get("description") is not None:
        fn["description"] = t["description"]
    if t.get("parameters") is not None:
        fn["parameters"] = t["parameters"]
    if t.get("strict") is not None:
        fn["strict"] = t["strict"]
    return fn


def _custom_format(fmt, where: str) -> dict:
    if fmt is None:
        return {"type": "text"}
    if not isinstance(fmt, Mapping) or fmt.get("type") not in ("text", "grammar"):
        raise bad(
            f"{where} must be {{'type': 'text'}} or {{'type': 'grammar', 'syntax': "
            "'lark' | 'regex', 'definition': ...}",
            where,
            "invalid_value",
        )
    if fmt["type"] == "grammar":
        if fmt.get("syntax") not in ("lark", "regex") or not isinstance(fmt.get("definition"), str):
            raise bad(
                f"{where}: a grammar needs 'syntax' ('lark' or 'regex') and a 'definition'",
                where,
                "invalid_value",
            )
        err = lark_error(fmt["definition"]) if fmt["syntax"] == "lark" else ""
        if err:
            raise bad(
                f"{where}: the grammar cannot hold the tool's input: {err}",
                where,
                "invalid_grammar",
            )
    return dict(fmt)


def translate_choice(choice, tools: ToolMap):
    """Responses ``tool_choice`` -> the Chat one."""
    if choice is None or isinstance(choice, str):
        return choice
    if not isinstance(choice, Mapping):
        raise bad("'tool_choice' must be a string or an object", "tool_choice", "invalid_type")
    kind = choice.get("type")
    if kind in ("function", "custom") and isinstance(choice.get("name"), str):
        ns = choice.get("namespace")
        return {"type": "function", "function": {"name": tools.flat(kind, choice["name"], ns)}}
    if kind == "allowed_tools":
        mode = choice.get("mode", "auto")
        allowed = choice.get("tools")
        if mode not in ("auto", "required") or not isinstance(allowed, list):
            raise bad(
                "'tool_choice' allowed_tools needs 'mode' ('auto' or 'required') and 'tools'",
                "tool_choice",
                "invalid_value",
            )
        names = set()
        for a in allowed:
            if not isinstance(a, Mapping) or not isinstance(a.get("name"), str):
                raise bad(
                    "'tool_choice' allowed_tools: each tool needs a 'name'",
                    "tool_choice",
                    "invalid_value",
                )
            names.add(tools.flat(a.get("type", "function"), a["name"], a.get("namespace")))
        if names >= set(tools.calls):
            return mode
        if mode == "required" and len(names) == 1:
            return {"type": "function", "function": {"name": names.pop()}}
        raise bad(
            "'tool_choice' allowed_tools: goinfer restricts calls to all tools or to "
            "one required tool",
            "tool_choice",
            "unsupported_value",
        )
    if kind in HOSTED_TOOLS or kind == "tool_search":
        raise bad(
            f"'tool_choice' cannot force the hosted tool {kind!r}: goinfer does not run it",
            "tool_choice",
            "unsupported_value",
        )
    raise bad(
        "'tool_choice' must be 'auto', 'none', 'required', {'type': 'function', "
        "'name': ...}, {'type': 'custom', 'name': ...} or {'type': 'allowed_tools', ...}",
        "tool_choice",
        "invalid_value",
    )


# ============================================================================ reasoning


_SEAL = "gi1_"


def seal_reasoning(text: str) -> str:
    """A reasoning item's ``encrypted_content``: the model's reasoning text, opaque to the
    client and given back verbatim, so the next turn renders exactly what the model wrote."""
    return _SEAL + base64.urlsafe_b64encode(zlib.compress(text.encode("utf-8"))).decode("ascii")


def open_reasoning(sealed: str) -> str | None:
    """The text of an ``encrypted_content`` goinfer sealed (None: not goinfer's)."""
    if not isinstance(sealed, str) or not sealed.startswith(_SEAL):
        return None
    try:
        return zlib.decompress(base64.urlsafe_b64decode(sealed[len(_SEAL) :])).decode("utf-8")
    except (ValueError, zlib.error, UnicodeDecodeError):
        return None


# ============================================================================ input


def conversation(inp, tools: ToolMap) -> list[dict]:
    """The ``input`` (a string or a list of items) -> chat messages (400 on bad input)."""
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    if not isinstance(inp, list):
        raise bad("'input' must be a string or a list of items", "input", "invalid_type")
    b = _Builder(tools)
    for i, item in enumerate(inp):
        b.add(item, f"input[{i}]")
    for m in b.out:  # a turn of reasoning alone: an empty answer
        if m["role"] == "assistant" and m["content"] is None and not m.get("tool_calls"):
            m["content"] = ""
    return b.out


class _Builder:
    def __init__(self, tools: ToolMap):
        self.tools = tools
        self.out: list[dict] = []
        self.turn: dict | None = None  # the assistant message of the turn being read

    def add(self, item, where: str) -> None:
        if not isinstance(item, Mapping):
            raise bad(f"{where} must be an object", "input", "invalid_type")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            self._message(item, where)
        elif kind == "reasoning":
            text = _reasoning_text(item)
            self.turn = {"role": "assistant", "content": None}
            if text:
                self.turn["reasoning_content"] = text
            self.out.append(self.turn)
        elif kind in ("function_call", "custom_tool_call", "tool_search_call"):
            self._call(kind, item, where)
        elif kind in ("function_call_output", "custom_tool_call_output", "tool_search_output"):
            self._result(kind, item, where)
        elif kind in HOSTED_ITEMS:
            pass  # a hosted tool's call or result: goinfer never ran it, the model never sees it
        elif kind == "item_reference":
            raise bad(
                f"{where}: item references are not supported; send the item itself or "
                "use previous_response_id",
                "input",
                "unsupported_value",
            )
        else:
            raise bad(f"{where}: unknown input item type {kind!r}", "input", "invalid_value")

    def _message(self, item: Mapping, where: str) -> None:
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise bad(
                f"{where}: 'role' must be 'user', 'assistant', 'system' or 'developer', "
                f"got {role!r}",
                "input",
                "invalid_value",
            )
        text = _text(item.get("content"), where)
        if role == "assistant":
            t = self.turn
            if t is not None and t["content"] is None and not t.get("tool_calls"):
                t["content"] = text
            else:
                self.turn = {"role": "assistant", "content": text}
                self.out.append(self.turn)
            return
        self.turn = None
        self.out.append({"role": "system" if role == "developer" else role, "content": text})

    def _call(self, kind: str, item: Mapping, where: str) -> None:
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            raise bad(f"{where}: 'call_id' must be a string", "input", "invalid_value")
        if kind == "function_call":
            name, args = item.get("name"), item.get("arguments")
            if not isinstance(name, str) or not isinstance(args, str):
                raise bad(
                    f"{where}: a function_call needs 'name' and 'arguments' strings",
                    "input",
                    "invalid_value",
                )
            flat = self.tools.flat("function", name, item.get("namespace"))
        elif kind == "custom_tool_call":
            name, text = item.get("name"), item.get("input")
            if not isinstance(name, str) or not isinstance(text, str):
                raise bad(
                    f"{where}: a custom_tool_call needs 'name' and 'input' strings",
                    "input",
                    "invalid_value",
                )
            flat = self.tools.flat("custom", name, item.get("namespace"))
            args = json.dumps({INPUT_KEY: text}, ensure_ascii=False)
        else:
            flat = TOOL_SEARCH
            args = json.dumps(item.get("arguments") or {}, ensure_ascii=False)
        call = {"id": call_id, "type": "function", "function": {"name": flat, "arguments": args}}
        t = self.turn
        if t is None:
            self.turn = t = {"role": "assistant", "content": None}
            self.out.append(t)
        t.setdefault("tool_calls", []).append(call)

    def _result(self, kind: str, item: Mapping, where: str) -> None:
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            raise bad(f"{where}: 'call_id' must be a string", "input", "invalid_value")
        if kind == "tool_search_output":
            found = translate_tools(item.get("tools") or [])
            text = "\n".join(json.dumps(t, ensure_ascii=False) for t in found.chat)
        else:
            text = _text(item.get("output"), where, "output")
        self.turn = None
        self.out.append({"role": "tool", "tool_call_id": call_id, "content": text})


def _text(content, where: str, name: str = "content") -> str:
    """Message content (a string or text parts) as text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"{where}: '{name}' must be a string or a list of parts", "input", "invalid_type")
    parts = []
    for p in content:
        kind = p.get("type") if isinstance(p, Mapping) else None
        if kind in TEXT_PARTS and isinstance(p.get("text"), str):
            parts.append(p["text"])
        elif kind == "refusal" and isinstance(p.get("refusal"), str):
            parts.append(p["refusal"])
        else:
            raise bad(
                f"{where}: only text parts are supported (got {kind!r})",
                "input",
                "unsupported_content",
            )
    return "".join(parts)


def _reasoning_text(item: Mapping) -> str:
    """The reasoning a reasoning item carries: goinfer's sealed text, else its reasoning_text
    content (a summary is not what the model wrote, so it is not rendered)."""
    text = open_reasoning(item.get("encrypted_content"))
    if text is not None:
        return text
    content = item.get("content")
    if isinstance(content, list):
        return "".join(
            p.get("text", "")
            for p in content
            if isinstance(p, Mapping) and p.get("type") == "reasoning_text"
        )
    return ""
