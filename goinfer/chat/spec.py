"""A request's tools, checked: OpenAI's ``tools``, ``tool_choice`` and ``parallel_tool_calls``
-> ToolSpec, and the streamed piece of a call (ToolCallDelta) every reply parser emits.

Bad input raises ToolError naming the offending ``param``; every tool's parameter schema must
compile to a grammar (goinfer/constrained.py) before any token is generated.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass, field

from goinfer.chat_template import _to_dicts
from goinfer.constrained import bound_numbers, schema_error
from goinfer.errors import ToolError

__all__ = ["Tool", "ToolSpec", "ToolCallDelta", "check_tools", "new_call_id", "NO_PARAMS"]

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
_CHOICES = ("auto", "none", "required")
NO_PARAMS = {"type": "object", "properties": {}}  # the parameters of a tool that gives none
_ALNUM = string.ascii_letters + string.digits


def new_call_id(n: int = 24, prefix: str = "call_") -> str:
    """A tool call id: prefix and n random letters and digits."""
    return prefix + "".join(secrets.choice(_ALNUM) for _ in range(n))


# ============================================================================ tools


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: dict  # JSON schema of the arguments object
    strict: bool | None = None

    def as_openai(self) -> dict:
        fn: dict = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        fn["parameters"] = self.parameters
        if self.strict is not None:
            fn["strict"] = self.strict
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class ToolSpec:
    """One request's checked tool settings."""

    tools: tuple[Tool, ...]
    choice: str  # "auto" | "none" | "required" | "function"
    function: str | None = None  # the function tool_choice names
    parallel: bool = True
    # tool_choice {"type": "allowed_tools", ...}: the names of the tools the reply may call
    # ("auto" or "required" among them); every tool stays in the prompt.  None: all of them
    allowed: tuple[str, ...] | None = None

    @property
    def callable(self) -> tuple[Tool, ...]:
        """The tools the reply may call."""
        if self.choice == "function":
            return tuple(t for t in self.tools if t.name == self.function)
        if self.choice == "none":
            return ()
        if self.allowed is not None:
            return tuple(t for t in self.tools if t.name in self.allowed)
        return self.tools

    @property
    def forced(self) -> bool:
        """The reply must be tool calls (constrained from its first token)."""
        return self.choice in ("required", "function")

    @property
    def many(self) -> bool:
        """More than one call may be made (a named function is called exactly once)."""
        return self.parallel and self.choice in ("auto", "required")


@dataclass
class ToolCallDelta:
    """A piece of a streamed tool call: the first piece of a call has its id and name."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    # streamed with logprobs: the entries of the tokens taken since the last item sent
    logprobs: list[dict] | None = field(default=None, compare=False, repr=False)
    choice: int = field(default=0, compare=False, repr=False)  # the server's choice (n > 1)

    def as_openai(self) -> dict:
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {
            "index": self.index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


# ============================================================================ checking


def check_tools(tools=None, tool_choice=None, parallel_tool_calls=None) -> ToolSpec | None:
    """Validate the OpenAI tool fields -> a ToolSpec, or None when there are no tools (and
    tool_choice is "auto" or "none").  Raises ToolError with the offending param."""
    checked = _check_tool_list(tools)
    if parallel_tool_calls is None:
        parallel = True
    elif isinstance(parallel_tool_calls, bool):
        parallel = parallel_tool_calls
    else:
        raise ToolError(
            f"parallel_tool_calls must be a boolean, got {_show(parallel_tool_calls)}",
            "parallel_tool_calls",
        )
    choice, function, allowed = _check_choice(tool_choice, checked)
    if not checked:
        return None
    return ToolSpec(tuple(checked), choice, function, parallel, allowed)


def _show(v) -> str:
    try:
        s = json.dumps(v)
    except (TypeError, ValueError):
        s = type(v).__name__
    return s if len(s) <= 60 else s[:57] + "..."


def _check_tool_list(tools) -> list[Tool]:
    if tools is None:
        return []
    tools = _to_dicts(tools)
    if not isinstance(tools, (list, tuple)):
        raise ToolError(f"tools must be a list of function tools, got {_show(tools)}", "tools")
    out: list[Tool] = []
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, Mapping):
            raise ToolError(f"{where} must be an object, got {_show(t)}", where)
        if t.get("type") != "function":
            raise ToolError(
                f"{where}.type must be 'function' (only function tools are "
                f"supported), got {_show(t.get('type'))}",
                f"{where}.type",
            )
        fn = t.get("function")
        if not isinstance(fn, Mapping):
            raise ToolError(
                f"{where}.function must be an object with 'name' and 'parameters'",
                f"{where}.function",
            )
        unknown = set(fn) - {"name", "description", "parameters", "strict"}
        if unknown:
            raise ToolError(
                f"{where}.function has unknown field(s) {sorted(unknown)}", f"{where}.function"
            )
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ToolError(
                f"{where}.function.name must be 1-64 letters, digits, '_' or '-', "
                f"got {_show(name)}",
                f"{where}.function.name",
            )
        if any(x.name == name for x in out):
            raise ToolError(
                f"{where}.function.name {name!r} is given twice", f"{where}.function.name"
            )
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise ToolError(
                f"{where}.function.description must be a string", f"{where}.function.description"
            )
        strict = fn.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ToolError(
                f"{where}.function.strict must be a boolean", f"{where}.function.strict"
            )
        params = fn.get("parameters")
        if params is None:
            params = dict(NO_PARAMS)
        param = f"{where}.function.parameters"
        if not isinstance(params, Mapping):
            raise ToolError(f"{param} must be a JSON schema object, got {_show(params)}", param)
        if params.get("type", "object") != "object":
            raise ToolError(
                f"{param} must describe a JSON object (type 'object'): the arguments "
                f"of a call are an object, got type {_show(params.get('type'))}",
                param,
            )
        err = schema_error(json.dumps(bound_numbers(params), sort_keys=True))  # as grammars
        if err:
            raise ToolError(f"{param} is not a JSON schema goinfer can enforce: {err}", param)
        out.append(Tool(name, desc, json.loads(json.dumps(params)), strict))
    return out


_CHOICE_FORMS = (
    "'auto', 'none', 'required', {'type': 'function', 'function': {'name': ...}} "
    "or {'type': 'allowed_tools', 'allowed_tools': {'mode': 'auto' | 'required', "
    "'tools': [{'type': 'function', 'function': {'name': ...}}, ...]}}"
)


def _check_choice(choice, tools: list[Tool]) -> tuple[str, str | None, tuple[str, ...] | None]:
    """tool_choice -> (choice, the function it names, the names it allows)."""
    if choice is None:
        return "auto", None, None
    choice = _to_dicts(choice)
    if isinstance(choice, str):
        if choice not in _CHOICES:
            raise ToolError(
                f"tool_choice must be one of {_CHOICE_FORMS}, got {choice!r}", "tool_choice"
            )
        if choice == "required" and not tools:
            raise ToolError("tool_choice 'required' needs tools", "tool_choice")
        return choice, None, None
    if isinstance(choice, Mapping) and choice.get("type") == "allowed_tools":
        mode, allowed = _allowed_tools(choice, tools)
        return mode, None, allowed
    if (
        not isinstance(choice, Mapping)
        or choice.get("type") != "function"
        or not isinstance(choice.get("function"), Mapping)
        or not isinstance(choice["function"].get("name"), str)
    ):
        raise ToolError(f"tool_choice must be {_CHOICE_FORMS}, got {_show(choice)}", "tool_choice")
    return "function", _known(choice["function"]["name"], tools, "tool_choice"), None


def _known(name: str, tools: list[Tool], param: str) -> str:
    """name, if it is the name of one of tools (ToolError otherwise)."""
    if not any(t.name == name for t in tools):
        have = [t.name for t in tools]
        raise ToolError(
            f"tool_choice names the function {name!r}, which is not in tools "
            f"({have if have else 'no tools given'})",
            param,
        )
    return name


def _allowed_tools(choice: Mapping, tools: list[Tool]) -> tuple[str, tuple[str, ...]]:
    """OpenAI's {"type": "allowed_tools", "allowed_tools": {"mode", "tools"}} -> (mode, the
    names).  A listed tool is {"type": "function", "function": {"name": ...}} (or the Responses
    API's {"type": "function", "name": ...}) and must be one of tools."""
    P = "tool_choice.allowed_tools"
    spec = choice.get("allowed_tools")
    if set(choice) != {"type", "allowed_tools"} or not isinstance(spec, Mapping):
        raise ToolError(f"tool_choice must be {_CHOICE_FORMS}, got {_show(choice)}", "tool_choice")
    unknown = set(spec) - {"mode", "tools"}
    if unknown:
        raise ToolError(f"{P} has unknown field(s) {sorted(unknown)}", P)
    mode = spec.get("mode")
    if mode not in ("auto", "required"):
        raise ToolError(f"{P}.mode must be 'auto' or 'required', got {_show(mode)}", f"{P}.mode")
    listed = spec.get("tools")
    if not isinstance(listed, (list, tuple)) or not listed:
        raise ToolError(
            f"{P}.tools must be a non-empty list of "
            "{'type': 'function', 'function': {'name': ...}}",
            f"{P}.tools",
        )
    names: list[str] = []
    for i, t in enumerate(listed):
        where = f"{P}.tools[{i}]"
        fn = t.get("function") if isinstance(t, Mapping) else None
        name = (
            fn.get("name")
            if isinstance(fn, Mapping)
            else (t.get("name") if isinstance(t, Mapping) else None)
        )
        if not isinstance(t, Mapping) or t.get("type") != "function" or not isinstance(name, str):
            raise ToolError(
                f"{where} must be {{'type': 'function', 'function': {{'name': ...}}}}"
                f" (only function tools), got {_show(t)}",
                where,
            )
        if name not in names:
            names.append(_known(name, tools, where))
    return mode, tuple(names)
