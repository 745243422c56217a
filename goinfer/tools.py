"""Tool calling: the OpenAI ``tools`` protocol over each model family's own call format.

A request's tools go through four steps, all in this file:

1. **check** -- ``tools``, ``tool_choice`` and ``parallel_tool_calls`` are validated
   (``check_tools``); bad input raises ToolError naming the offending ``param``, and every
   tool's parameter schema must compile to a grammar before any token is generated.
2. **render** -- the model's own chat template renders the tools and the tool history where it
   knows a call format we parse (``chat_inputs``); for any other model (SmolLM2, Gemma 3, ...)
   a built-in tool prompt lists the tools and the exact call format, and calls and results in
   the history are written in that format (the "generic" format).
3. **constrain** -- ``tool_grammar`` writes a Lark grammar (llguidance, JSON schemas embedded
   with ``%json``): "required" and a named function are constrained from the first token, so
   even a 135M model returns a call whose arguments validate against the tool's schema; "auto"
   leaves the text free until the format's opening marker, then constrains the call; "none"
   forbids the marker.  ``parallel_tool_calls`` chooses one call or one-or-more.
4. **parse** -- ``CallParser`` turns the reply into content and OpenAI ``tool_calls``,
   incrementally for streaming (OpenAI's ``delta.tool_calls``: index, id and name first, then
   pieces of the arguments) or at once (``parse_reply``).  Call text that does not parse stays
   in the content; nothing is dropped.

Formats (a call as the model writes it; chosen from the chat template):

- hermes: ``<tool_call>\\n{"name": f, "arguments": {...}}\\n</tool_call>``, one block per
  call (templates with <tool_call>: Qwen 2.5 / 3, Hermes);
- llama3: ``{"name": f, "parameters": {...}}`` opening the reply, or after
  ``<|python_tag|>``; several joined by ``; `` (Llama 3.x templates);
- mistral: ``[TOOL_CALLS][{"name": f, "arguments": {...}}, ...]`` (templates with
  [TOOL_CALLS]);
- qwen_xml: ``<tool_call>\n<function=f>\n<parameter=k>\nvalue\n</parameter>\n</function>\n``
  ``</tool_call>``, one block per call; a string value as it is, any other as JSON (templates
  with ``<function=``: Qwen3.5, Qwen3-Coder);
- gemma4: ``<|tool_call>call:f{key:<|"|>text<|"|>,n:3}<tool_call|>``, one block per call:
  keys bare, strings between ``<|"|>`` marks, other values as JSON (Gemma 4 templates);
- harmony: ``<|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}``
  ended by ``<|call|>``, one call per reply (gpt-oss; read by channels.ReplyParser with the
  reply's reasoning and answer);
- generic: as hermes, taught by the built-in tool prompt (any other template: SmolLM2,
  Gemma 3, ...).

Reasoning (``<think>`` blocks, harmony's analysis channel) is parsed apart from the answer by
goinfer/channels.py; the grammars here let the reply reason before what they constrain.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import json
import re
import secrets
import string
from collections.abc import Mapping
from dataclasses import dataclass, field

from goinfer.channels import (
    Channels,
    Reasoning,
    ReplyParser,
    channels_of,
    think_grammar_prefix,
    think_text_rule,
)
from goinfer.chat_template import _to_dicts, render_chat_template
from goinfer.constrained import MAX_SAFE_INT, NUMBER_STEP, VALUE_KEYS as _VALUE_KEYS  # noqa: F401
from goinfer.constrained import bound_numbers as _bounded, schema_error as _schema_error
from goinfer.errors import ChatTemplateError, TokenizerError, ToolError

__all__ = [
    "Tool", "ToolSpec", "ToolFormat", "ToolCallDelta", "CallParser", "check_tools",
    "tool_format", "chat_inputs", "tool_prompt", "tool_grammar", "parse_reply", "ToolChat",
    "prepare_chat", "HERMES", "LLAMA3", "MISTRAL", "QWEN_XML", "GEMMA4", "HARMONY", "GENERIC",
]

# ============================================================================ checking


_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
_CHOICES = ("auto", "none", "required")
_NO_PARAMS = {"type": "object", "properties": {}}


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

    @property
    def callable(self) -> tuple[Tool, ...]:
        """The tools the reply may call."""
        if self.choice == "function":
            return tuple(t for t in self.tools if t.name == self.function)
        return self.tools if self.choice != "none" else ()

    @property
    def forced(self) -> bool:
        """The reply must be tool calls (constrained from its first token)."""
        return self.choice in ("required", "function")

    @property
    def many(self) -> bool:
        """More than one call may be made (a named function is called exactly once)."""
        return self.parallel and self.choice in ("auto", "required")


def check_tools(tools=None, tool_choice=None, parallel_tool_calls=None) -> ToolSpec | None:
    """Validate the OpenAI tool fields -> a ToolSpec, or None when there are no tools (and
    tool_choice is "auto" or "none").  Raises ToolError with the offending param."""
    checked = _check_tool_list(tools)
    if parallel_tool_calls is None:
        parallel = True
    elif isinstance(parallel_tool_calls, bool):
        parallel = parallel_tool_calls
    else:
        raise ToolError(f"parallel_tool_calls must be a boolean, got {_show(parallel_tool_calls)}",
                        "parallel_tool_calls")
    choice, function = _check_choice(tool_choice, checked)
    if not checked:
        return None
    return ToolSpec(tuple(checked), choice, function, parallel)


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
            raise ToolError(f"{where}.type must be 'function' (only function tools are "
                            f"supported), got {_show(t.get('type'))}", f"{where}.type")
        fn = t.get("function")
        if not isinstance(fn, Mapping):
            raise ToolError(f"{where}.function must be an object with 'name' and 'parameters'",
                            f"{where}.function")
        unknown = set(fn) - {"name", "description", "parameters", "strict"}
        if unknown:
            raise ToolError(f"{where}.function has unknown field(s) {sorted(unknown)}",
                            f"{where}.function")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ToolError(f"{where}.function.name must be 1-64 letters, digits, '_' or '-', "
                            f"got {_show(name)}", f"{where}.function.name")
        if any(x.name == name for x in out):
            raise ToolError(f"{where}.function.name {name!r} is given twice",
                            f"{where}.function.name")
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise ToolError(f"{where}.function.description must be a string",
                            f"{where}.function.description")
        strict = fn.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ToolError(f"{where}.function.strict must be a boolean",
                            f"{where}.function.strict")
        params = fn.get("parameters")
        if params is None:
            params = dict(_NO_PARAMS)
        param = f"{where}.function.parameters"
        if not isinstance(params, Mapping):
            raise ToolError(f"{param} must be a JSON schema object, got {_show(params)}", param)
        if params.get("type", "object") != "object":
            raise ToolError(f"{param} must describe a JSON object (type 'object'): the arguments "
                            f"of a call are an object, got type {_show(params.get('type'))}",
                            param)
        err = _schema_error(json.dumps(params, sort_keys=True))
        if err:
            raise ToolError(f"{param} is not a JSON schema goinfer can enforce: {err}", param)
        out.append(Tool(name, desc, json.loads(json.dumps(params)), strict))
    return out


def _check_choice(choice, tools: list[Tool]) -> tuple[str, str | None]:
    if choice is None:
        return "auto", None
    choice = _to_dicts(choice)
    if isinstance(choice, str):
        if choice not in _CHOICES:
            raise ToolError(f"tool_choice must be one of {list(_CHOICES)} or "
                            f"{{'type': 'function', 'function': {{'name': ...}}}}, got {choice!r}",
                            "tool_choice")
        if choice == "required" and not tools:
            raise ToolError("tool_choice 'required' needs tools", "tool_choice")
        return choice, None
    if not isinstance(choice, Mapping) or choice.get("type") != "function" or not isinstance(
            choice.get("function"), Mapping) or not isinstance(choice["function"].get("name"), str):
        raise ToolError("tool_choice must be 'auto', 'none', 'required' or "
                        f"{{'type': 'function', 'function': {{'name': ...}}}}, got {_show(choice)}",
                        "tool_choice")
    name = choice["function"]["name"]
    if not any(t.name == name for t in tools):
        have = [t.name for t in tools]
        raise ToolError(f"tool_choice names the function {name!r}, which is not in tools "
                        f"({have if have else 'no tools given'})", "tool_choice")
    return "function", name


# ============================================================================ formats


@dataclass(frozen=True)
class ToolFormat:
    name: str  # "hermes" | "llama3" | "mistral" | "qwen_xml" | "gemma4" | "harmony" | "generic"
    native: bool  # the model's chat template renders tools, calls and results
    open: str  # text that opens calls
    close: str  # text that closes one call ("": the JSON's end closes it)
    args_key: str  # key of the arguments object in a call

    def new_id(self) -> str:
        """A tool call id; Mistral's templates want exactly 9 letters and digits."""
        if self.name == "mistral":
            return "".join(secrets.choice(_ALNUM) for _ in range(9))
        return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


_ALNUM = string.ascii_letters + string.digits

HERMES = ToolFormat("hermes", True, "<tool_call>", "</tool_call>", "arguments")
LLAMA3 = ToolFormat("llama3", True, "<|python_tag|>", "", "parameters")
MISTRAL = ToolFormat("mistral", True, "[TOOL_CALLS]", "", "arguments")
QWEN_XML = ToolFormat("qwen_xml", True, "<tool_call>", "</tool_call>", "arguments")
GEMMA4 = ToolFormat("gemma4", True, "<|tool_call>", "<tool_call|>", "arguments")
HARMONY = ToolFormat("harmony", True, "to=functions.", "<|call|>", "arguments")
GENERIC = ToolFormat("generic", False, "<tool_call>", "</tool_call>", "arguments")

_PROBE = "goinfer_probe_tool"


def tool_format(model) -> ToolFormat:
    """The call format of `model`, from its chat template (None: the generic format)."""
    return _format_of(getattr(model, "chat_template", None) or "")


@functools.lru_cache(maxsize=32)
def _format_of(template: str) -> ToolFormat:
    if channels_of(template) is not None and channels_of(template).kind == "harmony":
        return HARMONY  # gpt-oss: its calls are messages of the reply (channels.py)
    if not template or not _renders_tools(template):
        return GENERIC
    if "<|tool_call>call:" in template:  # Gemma 4
        return GEMMA4
    if "<function=" in template and "<tool_call>" in template:  # Qwen3-Coder / Qwen3.5
        return QWEN_XML
    if "<tool_call>" in template:
        return HERMES
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<|python_tag|>" in template or ("<|start_header_id|>" in template
                                         and '"parameters"' in template):
        return LLAMA3
    return GENERIC  # renders tools, but in a format we cannot parse: use ours


def _renders_tools(template: str) -> bool:
    """Does the template show the tools it is given?  (Rendered with a probe tool.)"""
    probe = [{"type": "function", "function": {
        "name": _PROBE, "description": "probe", "parameters": dict(_NO_PARAMS)}}]
    try:
        out = render_chat_template(template, [{"role": "user", "content": "hi"}], tools=probe)
    except ChatTemplateError:
        return False
    return _PROBE in out


# ============================================================================ rendering


def tool_prompt(tools) -> str:
    """The built-in tool prompt (generic format): the tools and the exact call format."""
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
        "Each result comes back inside <tool_response></tool_response>.")


def chat_inputs(messages, fmt: ToolFormat, spec: ToolSpec | None) -> tuple[list[dict], list | None]:
    """(messages, tools) to give the chat template: the model's own rendering of tools and tool
    history for a native format; for the generic format, the tool prompt in the system
    message, calls written as <tool_call> blocks and results as <tool_response> blocks in a
    user message.  Call arguments given as JSON strings (OpenAI's shape) become objects, as
    templates expect."""
    messages = _to_dicts(getattr(messages, "messages", messages))
    if not isinstance(messages, (list, tuple)):
        raise ChatTemplateError(f"messages must be a list of dicts, got {type(messages).__name__}")
    tools = [t.as_openai() for t in spec.tools] if spec is not None else None
    if fmt.name == "harmony":  # gpt-oss's template writes every tool's description
        tools = [dict(t, function=dict(t["function"], description=t["function"].get(
            "description", ""))) for t in tools] if tools is not None else None
        return [x for m in messages for x in _harmony_messages(m)], tools
    if fmt.name == "qwen_xml":
        return [_xml_message(m) for m in messages], tools
    if fmt.native:
        return [_native_message(m) for m in messages], tools
    out: list[dict] = []
    for m in messages:
        if not isinstance(m, Mapping):
            raise ChatTemplateError(f"a chat message must be a dict, got {m!r}")
        role = m.get("role")
        if role == "tool":
            block = f"<tool_response>\n{_text(m.get('content'))}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        elif role == "assistant" and m.get("tool_calls"):
            calls = "\n".join(_generic_call(c) for c in m["tool_calls"])
            text = _text(m.get("content"))
            msg = {k: v for k, v in m.items() if k != "tool_calls"}
            msg["content"] = f"{text}\n{calls}" if text else calls
            out.append(msg)
        else:
            out.append(dict(m))
    out = [{k: v for k, v in m.items() if k != "_tool_results"} for m in out]
    if spec is not None:
        prompt = tool_prompt(spec.tools)
        if out and out[0].get("role") in ("system", "developer"):
            first = _text(out[0].get("content"))
            out[0] = dict(out[0], content=f"{first}\n\n{prompt}" if first else prompt)
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out, None


def _text(content) -> str:
    """Message content as text (a list of text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, Mapping) else str(p) for p in content)
    return json.dumps(content, ensure_ascii=False)


def _call_fields(call) -> tuple[str, object]:
    """(name, arguments) of a history tool call; arguments parsed from JSON when a string."""
    if not isinstance(call, Mapping):
        raise ChatTemplateError(f"a tool call must be a dict, got {call!r}")
    fn = call.get("function", call)
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise ChatTemplateError(f"a tool call needs function.name, got {call!r}")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            pass  # kept as the string the client sent
    return fn["name"], args


def _native_message(m):
    if not isinstance(m, Mapping) or not m.get("tool_calls"):
        return m
    calls = []
    for c in m["tool_calls"]:
        name, args = _call_fields(c)
        c = dict(c)
        c["function"] = dict(c.get("function", {}), name=name, arguments=args)
        calls.append(c)
    return dict(m, tool_calls=calls)


def _xml_message(m):
    """Qwen3.5 / Qwen3-Coder: argument values that are not strings as JSON text (the
    template writes a scalar with |string: Python's True, not the model's true)."""
    m = _native_message(m)
    if not isinstance(m, Mapping) or not m.get("tool_calls"):
        return m
    calls = []
    for c in m["tool_calls"]:
        args = c["function"]["arguments"]
        if isinstance(args, Mapping):
            args = {k: v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
                    for k, v in args.items()}
        calls.append(dict(c, function=dict(c["function"], arguments=args)))
    return dict(m, tool_calls=calls)


def _harmony_messages(m) -> list:
    """An OpenAI message as gpt-oss's template takes it: reasoning in "thinking", no null
    content, one call per assistant message (the template renders the first call only)."""
    m = _native_message(m)
    if not isinstance(m, Mapping) or m.get("role") != "assistant":
        return [m]
    m = {k: v for k, v in m.items() if not (k == "content" and v is None)}
    reasoning = m.pop("reasoning_content", None)
    if reasoning:
        m["thinking"] = reasoning
    calls = m.get("tool_calls")
    if not calls:
        return [m]
    if m.get("content") and m.get("thinking"):  # the template takes one preamble with a call
        m["thinking"] = f"{m['thinking']}\n{_text(m.pop('content'))}"
    first = dict(m, tool_calls=[calls[0]])
    return [first] + [{"role": "assistant", "tool_calls": [c]} for c in calls[1:]]


def _generic_call(call) -> str:
    name, args = _call_fields(call)
    raw = call.get("function", call).get("arguments")
    if isinstance(raw, str) and isinstance(args, dict):
        body = raw.strip()  # the text the model wrote, so the prompt repeats it token for token
    else:
        body = json.dumps(args, ensure_ascii=False)
    name = json.dumps(name, ensure_ascii=False)
    return f'<tool_call>\n{{"name": {name}, "arguments": {body}}}\n</tool_call>'


# ============================================================================ grammars

# The JSON the grammar allows is laid out as json.dumps writes it (and as chat templates show
# calls): ", " and ": " separators and no other whitespace, so a small model cannot wander off
# into runs of blank space, and the call it writes is the text the next turn's prompt repeats.
_JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def tool_grammar(spec: ToolSpec | None, fmt: ToolFormat, tokenizer=None,
                 channels: Channels | None = None) -> str | None:
    """The Lark grammar (llguidance) of a reply under `spec` in format `fmt`, or None when
    nothing is constrained.  `tokenizer` tells which markers are special tokens of the model
    (written as ``<[id]>``); without it every marker is text.  channels: the reply's reasoning
    format (channels.py); a think block may come first (must, when the prompt opened one)."""
    if spec is None:
        return None
    if fmt.name == "harmony":
        return _harmony_grammar(spec, tokenizer)
    g = _tool_grammar(spec, fmt, tokenizer)
    if channels is None or channels.kind != "think":
        return g
    head, _, rest = g.partition("\n")
    assert head.startswith("start: ")
    special = _special(tokenizer, channels.close_mark) is not None
    prefix = think_grammar_prefix(channels, lambda t: _marker(tokenizer, t), special)
    rule = think_text_rule(special, channels.close_mark)
    return f"start: {prefix} ({head[len('start: '):]})\n{rule}\n{rest}"


def _harmony_grammar(spec: ToolSpec, tokenizer) -> str:
    """gpt-oss: an optional analysis message, then the final answer (tool_choice "auto",
    "none") or one call (forced, "auto"); its end is a stop token (<|return|>, <|call|>).
    A call is written `` to=functions.f<|channel|>commentary json<|message|>{...}``, as the
    template renders calls (harmony also allows the recipient after the channel, which the
    parser reads too)."""
    m = functools.partial(_marker, tokenizer)
    ch, msg = m("<|channel|>"), m("<|message|>")
    special = _special(tokenizer, "<|end|>") is not None
    rules = ["TEXT: /(?s:.*)/" if special else _text_without("<|"),
             f'analysis: {ch} "analysis" {msg} TEXT {m("<|end|>")} {m("<|start|>")} "assistant"',
             f'final: {ch} "final" {msg} TEXT']
    tools = spec.callable
    alts = []
    for i, t in enumerate(tools):
        schema = dict(_bounded(t.parameters))
        schema["x-guidance"] = dict(_JSON_LAYOUT)
        rules.append(f"args{i}: %json " + json.dumps(schema))
        # the recipient in the header, before the channel: the form gpt-oss's template
        # writes calls in the history, so the next turn's prompt repeats the reply verbatim
        alts.append(f'" to=functions.{t.name}" {ch} "commentary json" {msg} args{i}')
    if spec.choice == "none" or not alts:
        start = "analysis? final"
    else:
        rules.append("call: " + " | ".join(alts))
        start = "analysis? call" if spec.forced else "analysis? (final | call)"
    return f"start: {start}\n" + "\n".join(rules) + "\n"


def _harmony_json(response_format, tokenizer):
    """gpt-oss with a JSON response_format -> its compiled grammar (constrained.Grammar): an
    optional analysis message, then the final one holding the JSON (None: a schema that is
    not an object, kept as the request gave it).  GrammarError naming response_format."""
    from goinfer.constrained import (
        JSON_WHITESPACE,
        _response_format_schema,
        json_schema_source,
        request_source,
        token_view,
    )

    rf = _response_format_schema(response_format)
    if rf is None or not isinstance(rf[1], dict):
        return None
    json_schema_source(rf[1])  # checked here, so an error names response_format
    schema = dict(_bounded(rf[1]))
    schema["x-guidance"] = {"whitespace_pattern": JSON_WHITESPACE}
    g = _harmony_grammar(ToolSpec((), "none"), tokenizer)
    head, _, rest = g.partition("\n")
    rules = [r for r in rest.splitlines() if not r.startswith("final:")]
    ch, msg = _marker(tokenizer, "<|channel|>"), _marker(tokenizer, "<|message|>")
    rules.append(f'final: {ch} "final" {msg} %json ' + json.dumps(schema))
    lark = head + "\n" + "\n".join(rules) + "\n"
    _, _, source = request_source(grammar=lark)
    return token_view(tokenizer).compile(source, "lark", "response_format")


def _tool_grammar(spec: ToolSpec, fmt: ToolFormat, tokenizer) -> str:
    if spec.choice == "none":
        return _no_calls(fmt, tokenizer)
    tools = spec.callable
    many, forced = spec.many, spec.forced
    rules: list[str] = []
    if fmt.name == "llama3":
        rules.append("body: %json " + json.dumps(_call_schema(tools, "parameters")))
        calls = 'body (";" " "? body)*' if many else "body"
        if forced:
            start = calls
        else:
            # A reply that opens with "{" is a call; any other reply is free text.
            rules.append(r"TEXT: /(?s:([^{].*)?)/")
            start = f"TEXT | {calls}"
            tag = _special(tokenizer, fmt.open)
            if tag is not None:
                start += f" | <[{tag}]> {calls}"
        rules.insert(0, f"start: {start}")
        return "\n".join(rules) + "\n"
    if fmt.name == "mistral":
        schema = _call_schema(tools, "arguments", array=True, many=many, with_id=True)
        rules.append("body: %json " + json.dumps(schema))
        first = "body"
        after = ""
    elif fmt.name == "gemma4":  # one <|tool_call> block per call, no separator
        rules += _gemma_rules(tools, tokenizer)
        first = "first"
        rules.append(f"first: body {_marker(tokenizer, fmt.close)}")
        # after the calls the model may ask for their results (<|tool_response>, as the
        # template writes after a call without results), which ends the reply
        after = (f" ({_marker(tokenizer, fmt.open)} first)*" if many else "") + \
            f" {_marker(tokenizer, _G_RESULTS)}?"
    else:  # hermes, generic, qwen_xml: one <tool_call> block per call
        if fmt.name == "qwen_xml":
            rules += _xml_rules(tools)
        else:
            rules.append("body: %json " + json.dumps(_call_schema(tools, "arguments")))
        close = _marker(tokenizer, fmt.close)
        rules.append(f'first: "\\n" body "\\n" {close}')  # laid out as templates write it
        first = "first"
        # more calls, each after a line break; a line break may also end the reply, so the
        # model decides between another call and the end after it (see ToolChat.compiled)
        after = f' ("\\n" {_marker(tokenizer, fmt.open)} first)* "\\n"?' if many else ""
    open_ = _marker(tokenizer, fmt.open)
    if forced:
        start = f"{open_} {first}{after}"
    elif _special(tokenizer, fmt.open) is not None:
        rules.append(r"TEXT: /(?s:.*)/")  # text never holds a special token
        start = f"TEXT | TEXT {open_} {first}{after}"
    else:
        rules += [_text_without(fmt.open), f"head[lazy]: /(?s:.*){_regex(fmt.open)}/"]
        start = f"TEXT | head {first}{after}"
    rules.insert(0, f"start: {start}")
    return "\n".join(rules) + "\n"


def _xml_rules(tools) -> list[str]:
    """Rules of a qwen_xml call body: one function block, its parameters in the schema's
    order (the required ones always), each value a JSON value of its schema or, for a
    string, the text itself (anything without the closing tag)."""
    rules = [r"XML_TEXT: /(?s:.*)/ & ~/(?s:.*)\n<\/parameter>(?s:.*)/"]
    fns = []
    for i, t in enumerate(tools):
        params = _bounded(t.parameters)
        defs = {k: params[k] for k in ("$defs", "definitions") if k in params}
        required = set(params.get("required", ()))
        parts = []
        for j, (key, sub) in enumerate((params.get("properties") or {}).items()):
            if _xml_string(sub):  # the text itself: an enum's values, or any text
                words = sub.get("enum", [sub["const"]] if "const" in sub else None)
                value = "XML_TEXT" if words is None else "(" + " | ".join(
                    json.dumps(w) for w in words) + ")"
            else:
                schema = dict(sub if isinstance(sub, Mapping) else {}, **defs)
                schema["x-guidance"] = dict(_JSON_LAYOUT)
                rules.append(f"v{i}_{j}: %json " + json.dumps(schema))
                value = f"v{i}_{j}"
            rules.append(f'p{i}_{j}: {json.dumps(f"<parameter={key}>")} "\\n" {value} '
                         f'"\\n" "</parameter>" "\\n"')
            parts.append(f"p{i}_{j}" + ("" if key in required else "?"))
        fns.append(f'{json.dumps(f"<function={t.name}>")} "\\n" {" ".join(parts)} '
                   '"</function>"')
    rules.append("body: " + " | ".join(f"({f})" for f in fns))
    return rules


def _gemma_rules(tools, tokenizer) -> list[str]:
    """Rules of a gemma4 call body: call:NAME{key:value,...}, the keys in sorted order (as
    the template writes them; the required ones always), a string value between <|"|> marks
    (an enum's words, or any text without the mark), an integer, number or boolean as JSON
    held to its schema, any other value a Gemma 4 value of any shape (gval)."""
    q = _marker(tokenizer, _G_QUOTE)
    if _special(tokenizer, _G_QUOTE) is not None:
        text = ["G_TEXT: /(?s:.*)/", f"gstr: {q} G_TEXT {q}"]  # text never holds the mark
    else:  # the shortest text that ends with the mark (lazy: a greedy one could not end)
        text = [f"g_text[lazy]: /(?s:.*){_regex(_G_QUOTE)}/", f"gstr: {q} g_text"]
    rules = text + [r"G_NUM: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/",
                    r"G_KEY: /[A-Za-z_][A-Za-z0-9_]*/",
                    'gval: gstr | G_NUM | "true" | "false" | "null" | gobj | garr',
                    'gobj: "{" (G_KEY ":" gval ("," G_KEY ":" gval)*)? "}"',
                    'garr: "[" (gval ("," gval)*)? "]"']
    fns = []
    for i, t in enumerate(tools):
        params = _bounded(t.parameters)
        required = set(params.get("required", ()))
        props = sorted((params.get("properties") or {}).items())
        parts = []  # (rule, required)
        for j, (key, sub) in enumerate(props):
            sub = sub if isinstance(sub, Mapping) else {}
            kind = sub.get("type")
            if _xml_string(sub):
                words = sub.get("enum", [sub["const"]] if "const" in sub else None)
                value = "gstr" if words is None else f"{q} (" + " | ".join(
                    json.dumps(w) for w in words) + f") {q}"
            elif kind in ("integer", "number", "boolean"):
                schema = dict(sub)
                schema["x-guidance"] = dict(_JSON_LAYOUT)
                rules.append(f"v{i}_{j}: %json " + json.dumps(schema))
                value = f"v{i}_{j}"
            else:
                value = "gval"
            rules.append(f"p{i}_{j}: {json.dumps(key + ':')} {value}")
            parts.append((f"p{i}_{j}", key in required))
        alts = []
        for k, (rule, req) in enumerate(parts):
            rest = " ".join(f'("," {r})' + ("" if q_ else "?") for r, q_ in parts[k + 1:])
            alts.append(f"{rule} {rest}".strip())
            if req:
                break  # a required key opens every later alternative's list
        inner = " | ".join(f"({a})" for a in alts)
        if inner and not any(req for _, req in parts):
            inner = f"({inner})?"
        fns.append(f'{json.dumps("call:" + t.name + "{")} {inner} "}}"'.replace("  ", " "))
    rules.append("body: " + " | ".join(f"({f})" for f in fns))
    return rules


def _xml_string(schema) -> bool:
    """Is a qwen_xml parameter written as its text (a string schema; the enum or const, if
    any, all strings)?  Its other string rules (pattern, lengths) are not held."""
    if not isinstance(schema, Mapping) or schema.get("type") != "string":
        return False
    words = schema.get("enum", [schema["const"]] if "const" in schema else [])
    return all(isinstance(w, str) for w in words)


def _no_calls(fmt: ToolFormat, tokenizer) -> str:
    """tool_choice "none": any text that does not open a call."""
    if fmt.name == "llama3" or _special(tokenizer, fmt.open) is not None:
        return "start: TEXT\nTEXT: /(?s:.*)/\n"  # the special marker cannot appear in text
    return "start: TEXT\n" + _text_without(fmt.open) + "\n"


def _text_without(marker: str) -> str:
    return f"TEXT: /(?s:.*)/ & ~/(?s:.*){_regex(marker)}(?s:.*)/"


def _regex(text: str) -> str:
    return re.escape(text).replace("/", "\\/")


def _special(tokenizer, text: str) -> int | None:
    """The id of `text` when the model's vocabulary has it as one control token (special in
    constrained.TokenView too; asked of the tokenizer, so rendering a prompt, as the Ray
    ingress does to route it, builds no token view)."""
    if tokenizer is None:
        return None
    try:
        i = tokenizer.token_to_id(text)
    except (TokenizerError, KeyError):
        return None
    return i if tokenizer.is_control(i) else None


def _marker(tokenizer, text: str) -> str:
    i = _special(tokenizer, text)
    return f"<[{i}]>" if i is not None else json.dumps(text)


def _call_schema(tools, args_key: str, *, array: bool = False, many: bool = True,
                 with_id: bool = False) -> dict:
    """JSON schema of one call object (or, array=True, of a list of calls) to any of `tools`.
    Each tool's parameters go under $defs, their own "#..." references rebased there.
    with_id: the call may carry Mistral's 9-character "id" after its arguments."""
    defs, alts = {}, []
    for i, t in enumerate(tools):
        key = f"goinfer_tool_{i}"
        defs[key] = _rebase(_bounded(t.parameters), f"#/$defs/{key}")
        props = {"name": {"const": t.name}, args_key: {"$ref": f"#/$defs/{key}"}}
        if with_id:
            props["id"] = {"type": "string", "pattern": "^[A-Za-z0-9]{9}$"}
        alts.append({"type": "object", "properties": props,
                     "required": ["name", args_key], "additionalProperties": False})
    one = alts[0] if len(alts) == 1 else {"anyOf": alts}
    if array:
        schema = {"type": "array", "items": one, "minItems": 1}
        if not many:
            schema["maxItems"] = 1
    else:
        schema = dict(one)
    schema["$defs"] = defs
    schema["x-guidance"] = dict(_JSON_LAYOUT)
    return schema


def _rebase(schema, base: str):
    """Copy of `schema` with every local "$ref" ("#...") moved under `base`."""
    if isinstance(schema, list):
        return [_rebase(x, base) for x in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "$ref" and isinstance(v, str) and v.startswith("#"):
            out[k] = base + v[1:]
        elif k in _VALUE_KEYS:
            out[k] = copy.deepcopy(v)
        else:
            out[k] = _rebase(v, base)
    return out


# ============================================================================ parsing


@dataclass
class ToolCallDelta:
    """A piece of a streamed tool call: the first piece of a call has its id and name."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    # streamed with logprobs: the entries of the tokens taken since the last item sent
    logprobs: list[dict] | None = field(default=None, compare=False, repr=False)

    def as_openai(self) -> dict:
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


class _Incomplete(Exception):
    """The text ends before the JSON does."""


class _Bad(Exception):
    """The text is not a call."""


_WS = " \t\n\r"
_SCALAR = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?|true|false|null")


def _skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _scan_string(s: str, i: int) -> int:
    """s[i] == '"' -> index after the closing quote."""
    j = i + 1
    n = len(s)
    while j < n:
        c = s[j]
        if c == "\\":
            j += 2
            continue
        if c == '"':
            return j + 1
        if c < " ":
            raise _Bad
        j += 1
    raise _Incomplete


def _scan_container(s: str, i: int) -> int:
    """s[i] in '{[' -> index after its matching bracket (strings skipped; the inside is checked
    by json.loads once complete)."""
    stack = []
    j, n = i, len(s)
    pairs = {"{": "}", "[": "]"}
    while j < n:
        c = s[j]
        if c == '"':
            j = _scan_string(s, j)
            continue
        if c in pairs:
            stack.append(pairs[c])
        elif c in "}]":
            if not stack or stack.pop() != c:
                raise _Bad
            if not stack:
                return j + 1
        j += 1
    raise _Incomplete


@dataclass
class _Call:
    """One call object as far as the text goes."""

    name: str | None = None
    args: tuple[int, int | None] | None = None  # span of the arguments value (end None: open)
    id: str | None = None
    end: int | None = None  # index after the closing brace
    json: str | None = None  # the arguments as JSON text, when not a span of the text (xml)


def _scan_call(s: str, i: int, args_keys: tuple[str, ...]) -> _Call:
    """Scan the call object at s[i] ('{') as far as s goes; raise _Bad if it is not one."""
    call = _Call()
    if i >= len(s):
        return call
    if s[i] != "{":
        raise _Bad
    try:
        j = _skip_ws(s, i + 1)
        first = True
        while True:
            if j >= len(s):
                return call
            if s[j] == "}" and first:
                call.end = j + 1
                return call
            if s[j] != '"':
                raise _Bad
            k = _scan_string(s, j)
            key = json.loads(s[j:k])
            j = _skip_ws(s, k)
            if j >= len(s):
                return call
            if s[j] != ":":
                raise _Bad
            j = _skip_ws(s, j + 1)
            if j >= len(s):
                return call
            v = j
            if key in args_keys:
                call.args = (v, None)
                if s[v] != "{":
                    raise _Bad  # arguments are an object
            if s[v] == '"':
                end = _scan_string(s, v)
            elif s[v] in "{[":
                end = _scan_container(s, v)
            else:
                m = _SCALAR.match(s, v)
                if not m:
                    raise _Bad
                end = m.end()
                if end >= len(s):
                    return call  # a number may go on
            if key == "name":
                call.name = json.loads(s[v:end])
                if not isinstance(call.name, str):
                    raise _Bad
            elif key == "id":
                x = json.loads(s[v:end])
                call.id = x if isinstance(x, str) else None
            elif key in args_keys:
                try:
                    ok = isinstance(json.loads(s[v:end]), dict)
                except ValueError:
                    ok = False
                if not ok:
                    raise _Bad
                call.args = (v, end)
            j = _skip_ws(s, end)
            if j >= len(s):
                return call
            if s[j] == "}":
                call.end = j + 1
                return call
            if s[j] != ",":
                raise _Bad
            j = _skip_ws(s, j + 1)
            first = False
    except _Incomplete:
        return call


@dataclass
class _Region:
    """Calls found after an opening marker, as far as the text goes."""

    calls: list[_Call] = field(default_factory=list)
    end: int | None = None  # index after the region (None: it may go on)


def _scan_region(fmt: ToolFormat, s: str, i: int, final: bool, schemas=None) -> _Region:
    """The calls of the region that starts at s[i] (just after the opening marker; for a
    llama3 reply that opens with '{', at the brace).  Raises _Bad.  schemas: {name: the
    tool's parameters} (qwen_xml reads values by them)."""
    keys = ("parameters", "arguments") if fmt.name == "llama3" else ("arguments", "parameters")
    r = _Region()
    j = _skip_ws(s, i)
    if fmt.name == "qwen_xml":
        return _scan_xml(fmt, s, j, final, schemas or {})
    if fmt.name == "gemma4":
        return _scan_gemma(fmt, s, j, final)
    if fmt.name == "mistral":
        if j >= len(s):
            return r
        if s[j] == "{":  # a single object without the list
            c = _scan_call(s, j, keys)
            r.calls.append(c)
            r.end = c.end
            return r
        if s[j] != "[":
            raise _Bad
        j = _skip_ws(s, j + 1)
        while True:
            c = _scan_call(s, j, keys)
            r.calls.append(c)
            if c.end is None:
                return r
            j = _skip_ws(s, c.end)
            if j >= len(s):
                return r
            if s[j] == "]":
                r.end = j + 1
                return r
            if s[j] != ",":
                raise _Bad
            j = _skip_ws(s, j + 1)
    if fmt.name == "llama3":
        while True:
            c = _scan_call(s, j, keys)
            r.calls.append(c)
            if c.end is None:
                return r
            k = _skip_ws(s, c.end)
            if k >= len(s):
                if final:
                    r.end = c.end
                return r
            if s[k] != ";":
                r.end = c.end
                return r
            j = _skip_ws(s, k + 1)
    # hermes, generic: one object (a list of objects is accepted too), then the close marker
    listed = j < len(s) and s[j] == "["
    if listed:
        j = _skip_ws(s, j + 1)
    while True:
        c = _scan_call(s, j, keys)
        r.calls.append(c)
        if c.end is None:
            return r
        j = _skip_ws(s, c.end)
        if listed:
            if j >= len(s):
                return r
            if s[j] == ",":
                j = _skip_ws(s, j + 1)
                continue
            if s[j] != "]":
                raise _Bad
            j = _skip_ws(s, j + 1)
        rest = s[j:j + len(fmt.close)]
        if rest == fmt.close:
            r.end = j + len(fmt.close)
            return r
        if not fmt.close.startswith(rest):
            raise _Bad
        if final:  # the reply ended after the JSON, without (all of) the close marker
            r.end = len(s)
        return r


class CallParser:
    """Reply text -> content and tool calls, incrementally.

    ``push(text)`` returns what may be sent now: content strings and ToolCallDelta pieces;
    ``finish()`` returns the rest, after which ``content`` and ``tool_calls`` hold the whole
    message.  eager=True (streaming) sends a call's id and name as soon as the name is known,
    then its arguments as they come; this assumes the call is well formed (a grammar made
    sure of it).  eager=False sends a call only once all of it parsed; text that does not
    parse as a call stays in the content.  Whitespace next to calls is not content."""

    def __init__(self, fmt: ToolFormat, spec: ToolSpec | None, *, eager: bool = True):
        self.fmt = fmt
        self.names = {t.name for t in spec.callable} if spec is not None else set()
        self.schemas = {t.name: t.parameters for t in spec.callable} if spec is not None else {}
        self.active = bool(self.names)  # tool_choice "none" / no tools: all text is content
        self.eager = eager
        self.text = ""
        self.i = 0  # text[:i] is decided
        self.region: int | None = None  # start of the call region being read
        self.region_at = 0  # where its opening marker starts (content if it is no call)
        self.held = ""  # whitespace held back: content, unless a call comes next
        self.after_call = False  # drop the whitespace that follows a call
        self.sent: list[dict] = []  # calls of the current region already begun
        self.calls: list[dict] = []  # every call begun: {"id", "name", "arguments"}
        self.parts: list[str] = []  # content sent
        self.done = False

    # ------------------------------------------------------------------ public

    def push(self, text: str) -> list:
        if self.done:
            raise RuntimeError("push() after finish()")
        self.text += text
        out: list = []
        self._advance(out, final=False)
        return out

    def finish(self) -> list:
        out: list = []
        if not self.done:
            self._advance(out, final=True)
            if self.held and not self.calls:
                self._send(out, self.held)
            self.held = ""
            self.done = True
        return out

    @property
    def content(self) -> str | None:
        text = "".join(self.parts)
        return None if self.calls and not text else text

    @property
    def tool_calls(self) -> list[dict] | None:
        if not self.calls:
            return None
        return [{"id": c["id"], "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in self.calls]

    # ------------------------------------------------------------------ content

    def _send(self, out: list, s: str) -> None:
        if s:
            out.append(s)
            self.parts.append(s)

    def _content(self, out: list, s: str) -> None:
        """Send text as content, holding back trailing whitespace (dropped if a call comes
        next); whitespace after a call is kept only between two pieces of text."""
        s = self.held + s
        body = s.rstrip(_WS)
        self.held = s[len(body):]
        if not body:
            return
        if self.after_call and not self.parts:
            body = body.lstrip(_WS)
        self.after_call = False
        self._send(out, body)

    # ------------------------------------------------------------------ scanning

    def _open_at(self, final: bool) -> tuple[int | None, int]:
        """(where the next call region opens or None, how far text is surely content)."""
        s, i = self.text, self.i
        k = s.find(self.fmt.open, i)
        if self.fmt.name == "llama3" and not self.calls and not self.parts:  # nothing said yet
            j = _skip_ws(s, i)
            if j < len(s) and s[j] == "{" and (k < 0 or j < k):
                return j, j  # a reply that opens with a JSON object
            if j >= len(s) and not final:
                return None, i  # only whitespace yet: a "{" may come
        if k >= 0:
            return k, k
        if final:
            return None, len(s)
        # hold back a tail that may be the start of the marker
        safe = len(s)
        for n in range(min(len(self.fmt.open) - 1, len(s) - i), 0, -1):
            if self.fmt.open.startswith(s[len(s) - n:]):
                safe = len(s) - n
                break
        return None, safe

    def _advance(self, out: list, final: bool) -> None:
        if not self.active:
            self._send(out, self.text[self.i:])
            self.i = len(self.text)
            return
        while True:
            if self.region is None:
                k, safe = self._open_at(final)
                self._content(out, self.text[self.i:safe])
                self.i = safe
                if k is None:
                    return
                self.region_at = k
                self.region = k if self.text.startswith("{", k) and self.fmt.name == "llama3" \
                    and not self.text.startswith(self.fmt.open, k) else k + len(self.fmt.open)
                self.i = self.region
                self.sent = []
            if not self._region(out, final):
                return

    def _region(self, out: list, final: bool) -> bool:
        """Read the current region; True when it is over (scanning goes on after it)."""
        s = self.text
        try:
            r = _scan_region(self.fmt, s, self.region, final, self.schemas)
            for c in r.calls:
                if c.name is not None and c.name not in self.names:
                    raise _Bad
            complete = r.end is not None and all(c.end is not None for c in r.calls)
            if complete and any(c.name is None or c.args is None or c.args[1] is None
                                for c in r.calls):
                raise _Bad
        except _Bad:
            return self._not_a_call(out, final)
        if complete or self.eager:
            self._send_calls(out, r.calls)
        if complete:
            self.held = ""
            self.after_call = True
            self.i = r.end
            self.region = None
            return True
        if final:
            if self.sent:  # cut short (max_tokens): the call stays, as OpenAI does
                self.i = len(s)
                self.region = None
                return False
            return self._not_a_call(out, final)
        return False

    def _send_calls(self, out: list, calls: list[_Call]) -> None:
        s = self.text
        for n, c in enumerate(calls):
            if c.name is None or c.args is None:
                return  # the name goes out with the first character of the arguments
            if n == len(self.sent):
                cid = c.id if self.fmt.name == "mistral" and c.id and re.fullmatch(
                    r"[A-Za-z0-9]{9}", c.id) else self.fmt.new_id()
                entry = {"id": cid, "name": c.name, "arguments": "", "index": len(self.calls)}
                self.sent.append(entry)
                self.calls.append(entry)
                out.append(ToolCallDelta(entry["index"], cid, c.name, ""))
                self.held = ""
            entry = self.sent[n]
            a0, a1 = c.args
            if c.json is not None:  # converted arguments (qwen_xml, gemma4): whole once read
                piece = c.json[len(entry["arguments"]):]
            else:
                piece = s[a0 + len(entry["arguments"]):len(s) if a1 is None else a1]
            entry["end"] = len(s) if a1 is None else a1
            if piece:
                entry["arguments"] += piece
                if isinstance(out[-1] if out else None, ToolCallDelta) and \
                        out[-1].index == entry["index"]:
                    out[-1].arguments += piece
                else:
                    out.append(ToolCallDelta(entry["index"], arguments=piece))

    def _not_a_call(self, out: list, final: bool) -> bool:
        """The region is no call: its text is content.  A call already begun (eager) keeps
        what it has; the rest of the text is content."""
        if self.sent:
            self.region = None
            self.after_call = True
            self.i = max(self.i, self.sent[-1].get("end", self.i))
            return True
        start = self.region_at
        end = len(self.text)
        if self.fmt.close:
            k = self.text.find(self.fmt.close, self.region)
            if k >= 0:
                end = k + len(self.fmt.close)
            elif not final:
                end = self.region  # just the marker; what follows is read as text again
        self.region = None
        self._content(out, self.text[start:end])
        self.i = end
        return True


_XML_FN, _XML_PARAM = "<function=", "<parameter="
_XML_END_PARAM, _XML_END_FN = "</parameter>", "</function>"


def _xml_value(text: str, schema) -> object:
    """A qwen_xml parameter's text -> its value: as it is for a string parameter, else JSON
    (text that is no JSON stays a string)."""
    if _xml_string(schema):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _xml_tag(s: str, j: int, tag: str) -> int | None:
    """s[j:] opens `tag`NAME> -> index of NAME; None: the text ends inside the tag's start;
    _Bad when it is not the tag."""
    rest = s[j:j + len(tag)]
    if rest == tag:
        return j + len(tag)
    if tag.startswith(rest):
        return None
    raise _Bad


def _scan_xml(fmt: ToolFormat, s: str, j: int, final: bool, schemas: dict) -> _Region:
    """One qwen_xml call after <tool_call>: <function=NAME> <parameter=K>\nV\n</parameter>
    ... </function> </tool_call>.  The call gets its name at once and its arguments (JSON
    text, keys in the order written) when </function> is read."""
    r = _Region()
    c = _Call()
    r.calls.append(c)
    k = _xml_tag(s, j, _XML_FN)
    if k is None:
        return r
    e = s.find(">", k)
    if e < 0:
        if "\n" in s[k:] or "<" in s[k:]:
            raise _Bad
        return r
    name = s[k:e]
    if not name or "\n" in name or "<" in name:
        raise _Bad
    c.name = name
    params = (schemas.get(name) or {}).get("properties") or {}
    args: dict = {}
    j = _skip_ws(s, e + 1)
    while True:
        if j >= len(s):
            return r
        if s.startswith(_XML_END_FN, j):
            c.json = json.dumps(args, ensure_ascii=False)
            c.args = (j, j)
            c.end = j + len(_XML_END_FN)
            break
        if _XML_END_FN.startswith(s[j:]) and not final:
            return r
        k = _xml_tag(s, j, _XML_PARAM)
        if k is None:
            return r
        e = s.find(">", k)
        if e < 0:
            return r
        key = s[k:e]
        v0 = e + 1 + (s.startswith("\n", e + 1))
        close = s.find(_XML_END_PARAM, v0)
        if close < 0:
            return r
        v1 = close - 1 if s.startswith("\n", close - 1) and close - 1 >= v0 else close
        args[key] = _xml_value(s[v0:v1], params.get(key))
        j = _skip_ws(s, close + len(_XML_END_PARAM))
    j = _skip_ws(s, c.end)
    rest = s[j:j + len(fmt.close)]
    if rest == fmt.close:
        r.end = j + len(fmt.close)
    elif not fmt.close.startswith(rest):
        raise _Bad
    elif final:
        r.end = len(s)
    return r


_G_QUOTE = '<|"|>'  # Gemma 4's string delimiter (a special token of its vocabulary)
_G_CALL = "call:"
_G_SCALAR = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?|true|false|null|None")
_G_WORD = re.compile(r"[^,{}\[\]<\s]*")
_G_KEY = re.compile(r"[^:{}\[\],<>\s]+")


def _gemma_value(s: str, i: int, final: bool) -> tuple[object, int]:
    """The Gemma 4 value at s[i] -> (value, index after it): <|"|>text<|"|>, {key:value,...}
    (keys bare or quoted), [value,...], or a JSON scalar.  _Incomplete: the text ends inside
    it; _Bad: it is no value."""
    if i >= len(s):
        raise _Incomplete
    if s.startswith(_G_QUOTE, i):
        k = s.find(_G_QUOTE, i + len(_G_QUOTE))
        if k < 0:
            raise _Incomplete
        return s[i + len(_G_QUOTE):k], k + len(_G_QUOTE)
    if _G_QUOTE.startswith(s[i:]):
        raise _Incomplete
    c = s[i]
    if c in "{[":
        obj = c == "{"
        out: dict | list = {} if obj else []
        j = i + 1
        if j >= len(s):
            raise _Incomplete
        if s[j] == ("}" if obj else "]"):
            return out, j + 1
        while True:
            if obj:
                if s.startswith(_G_QUOTE, j):
                    key, j = _gemma_value(s, j, final)
                else:
                    m = _G_KEY.match(s, j)
                    if m is None:
                        raise _Incomplete if j >= len(s) or _G_QUOTE.startswith(s[j:]) else _Bad
                    key, j = m.group(), m.end()
                if j >= len(s):
                    raise _Incomplete
                if s[j] != ":":
                    raise _Bad
                v, j = _gemma_value(s, j + 1, final)
                out[key] = v
            else:
                v, j = _gemma_value(s, j, final)
                out.append(v)
            if j >= len(s):
                raise _Incomplete
            if s[j] == ("}" if obj else "]"):
                return out, j + 1
            if s[j] != ",":
                raise _Bad
            j += 1
    end = _G_WORD.match(s, i).end()
    if end >= len(s) and not final:
        raise _Incomplete  # a number or word may go on
    word = s[i:end]
    if not _G_SCALAR.fullmatch(word):
        raise _Bad
    return (None if word == "None" else json.loads(word)), end


def _scan_gemma(fmt: ToolFormat, s: str, j: int, final: bool) -> _Region:
    """One Gemma 4 call after <|tool_call>: call:NAME{key:value,...} <tool_call|>.  The call
    gets its name at its "{" and its arguments (JSON text, keys in the order written) at its
    "}".  A <|tool_response> right after the close (the model asking for the results) is part
    of the region."""
    r = _Region()
    c = _Call()
    r.calls.append(c)
    head = s[j:j + len(_G_CALL)]
    if head != _G_CALL:
        if _G_CALL.startswith(head):
            return r
        raise _Bad
    k = j + len(_G_CALL)
    e = s.find("{", k)
    if e < 0:
        if not re.fullmatch(r"[A-Za-z0-9_.-]*", s[k:]):
            raise _Bad
        return r
    name = s[k:e]
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise _Bad
    c.name = name
    try:
        args, end = _gemma_value(s, e, final)
    except _Incomplete:
        if final:
            raise _Bad from None
        return r
    if not isinstance(args, dict):
        raise _Bad
    c.json = json.dumps(args, ensure_ascii=False)
    c.args = (e, end)
    c.end = end
    j = _skip_ws(s, end)
    rest = s[j:j + len(fmt.close)]
    if rest == fmt.close:
        j += len(fmt.close)
        more = s[j:j + len(_G_RESULTS)]
        if more == _G_RESULTS:
            r.end = j + len(_G_RESULTS)
        elif _G_RESULTS.startswith(more) and more and not final:
            return r
        elif not more and not final:
            return r  # a <|tool_response> may follow
        else:
            r.end = j
    elif not fmt.close.startswith(rest):
        raise _Bad
    elif final:
        r.end = len(s)
    return r


_G_RESULTS = "<|tool_response>"


def parse_reply(text: str, fmt: ToolFormat, spec: ToolSpec | None
                ) -> tuple[str | None, list[dict] | None]:
    """A whole reply -> (content, tool_calls in OpenAI's shape or None)."""
    p = CallParser(fmt, spec, eager=False)
    p.text = text
    p.finish()
    return p.content, p.tool_calls


# ============================================================================ one chat request


@dataclass
class ToolChat:
    """The tool side of one chat request: its prompt, its grammar (None: unconstrained) and
    the parser of its reply.  ``Session.chat`` and the server both use one."""

    spec: ToolSpec | None
    fmt: ToolFormat
    prompt: str
    grammar: str | None
    tokenizer: object = field(default=None, repr=False)  # the model's (compiles the grammar)
    # the reply's reasoning format (channels.py; None: all of it is answer)
    channels: Channels | None = None

    @property
    def parses(self) -> bool:
        """Are calls read out of the reply?  (Not without tools, nor with tool_choice none.)"""
        return self.spec is not None and bool(self.spec.callable)

    @property
    def splits(self) -> bool:
        """Is the reply parsed (calls, or reasoning apart from the answer)?"""
        return self.parses or self.channels is not None

    def parser(self, eager: bool = True):
        """The reply's parser: CallParser, or channels.ReplyParser where the reply has
        reasoning (its answer going on to a CallParser)."""
        if self.channels is None:
            return CallParser(self.fmt, self.spec, eager=eager)
        if self.channels.kind == "harmony":
            names = {t.name for t in self.spec.callable} if self.spec is not None else set()
            return ReplyParser(self.channels, names=names, eager=eager, new_id=self.fmt.new_id)
        calls = CallParser(self.fmt, self.spec, eager=eager) if self.parses else None
        return ReplyParser(self.channels, calls, eager=eager)

    def constraint(self, response_format=None, grammar=None) -> tuple:
        """(response_format, grammar) to generate with: the tools' grammar, or the request's
        own response_format or grammar when it brings one (only with tool_choice "none": one
        reply cannot be held to a schema and to the call format at once; ToolError)."""
        theirs = grammar is not None or not (
            response_format is None or response_format == {"type": "text"})
        if theirs and self.fmt.name == "harmony" and grammar is None and (
                self.spec is None or self.spec.choice == "none"):
            g = _harmony_json(response_format, self.tokenizer)
            if g is not None:  # the schema holds the final message, after any analysis
                return None, g
        if theirs and self.channels is not None and self.channels.kind == "think":
            # the request's own constraint holds the whole reply: no think block is read out
            # of it (a prompt that opened one gets the constrained text as its answer)
            self.channels = None
        if self.grammar is None:
            return response_format, grammar
        if not theirs:
            return None, self.compiled()
        if self.spec is not None and self.spec.choice == "none":
            return response_format, grammar
        raise ToolError("tools with a response_format or grammar need tool_choice 'none' "
                        "(goinfer cannot hold one reply to both)",
                        "grammar" if grammar is not None else "response_format")

    def compiled(self):
        """The tools' grammar compiled for the model (constrained.Grammar; GrammarError).
        Where calls are made, the end of the reply takes the probability of every token the
        grammar forbids where it may end (``end_takes_forbidden``): after a complete call
        the grammar allows only another call or the end, and a model that would rather go on
        with prose, which is not allowed after a call, ends its reply (finish_reason
        "tool_calls") instead of being pushed into calls it did not mean, over and over until
        max_tokens.  With tool_choice "auto" only from the call marker on: in the free text
        before it the grammar forbids little (control tokens, bytes that would not be valid
        UTF-8), and a model's prose must not end because of those.  With tool_choice "none"
        nothing is folded: the reply is plain text."""
        from goinfer.constrained import compile_request

        g = compile_request(self.tokenizer, grammar=self.grammar)
        if not self.parses:
            return g
        return dataclasses.replace(g, end_takes_forbidden=True,
                                   calls_begun=_calls_begun(self.spec, self.fmt, self.tokenizer))

    def finish(self, result, parser: CallParser | None = None):
        """Set result.content, .tool_calls and finish_reason ("tool_calls" when the reply made
        calls and ended by itself) from the reply text; returns result."""
        if not self.splits:
            return result
        if parser is None:
            parser = self.parser()
            parser.push(result.text)
        parser.finish()
        result.content, result.tool_calls = parser.content, parser.tool_calls
        result.reasoning_content = getattr(parser, "reasoning", None)
        if result.tool_calls and result.finish_reason == "stop":
            result.finish_reason = "tool_calls"
        return result

    def stream(self, items):
        """Stream items of a generation (text pieces, then the result) -> content pieces and
        ToolCallDelta pieces, then the finished result.  With logprobs (the pieces are
        generation.Piece): each item carries the entries of the tokens taken since the last item
        (text the parser holds back waits for the next one; what is left at the end comes in
        an empty Piece), so the items' entries add up to the result's list."""
        if not self.splits:
            yield from items
            return
        from goinfer.generation import Piece

        parser = self.parser()
        carry: list[dict] | None = None  # None: no logprobs asked for

        def tag(out):
            nonlocal carry
            for x in out:
                if carry is not None:
                    lps, carry = carry, []
                    if isinstance(x, Reasoning):
                        x = Reasoning(x)
                        x.logprobs = lps
                    elif isinstance(x, str):
                        x = Piece(x, lps)
                    else:
                        x.logprobs = lps
                yield x

        for item in items:
            if isinstance(item, str):
                if isinstance(item, Piece):
                    carry = (carry or []) + item.logprobs
                yield from tag(parser.push(str(item)))
            else:
                yield from tag(parser.finish())
                if carry:
                    yield Piece("", carry)
                yield self.finish(item, parser)


def _calls_begun(spec: ToolSpec, fmt: ToolFormat, tokenizer):
    """(tokens, text) -> has the reply opened a call?  None: it does from its first token."""
    if spec.forced:
        return None
    sid = _special(tokenizer, fmt.open)
    brace = fmt.name == "llama3"  # a Llama 3 reply that opens with "{" is a call

    def begun(tokens, text: str) -> bool:
        return (brace and text.startswith("{")) or (
            sid in tokens if sid is not None else fmt.open in text)
    return begun


def prepare_chat(model, messages, tools=None, tool_choice=None, parallel_tool_calls=None,
                 template_kwargs: Mapping | None = None) -> ToolChat:
    """Check the tool fields (ToolError), render the conversation with the model's chat
    template (ChatTemplateError; template_kwargs: more variables for it, e.g.
    ``enable_thinking=False``) and write the reply's grammar."""
    spec = check_tools(tools, tool_choice, parallel_tool_calls)
    fmt = tool_format(model)
    msgs, template_tools = chat_inputs(messages, fmt, spec)
    kwargs = dict(template_kwargs or {})
    for k in ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token"):
        if k in kwargs:
            raise ChatTemplateError(f"chat_template_kwargs cannot set {k!r}")
    prompt = model.apply_chat_template(msgs, add_generation_prompt=True, tools=template_tools,
                                       **kwargs)
    channels = channels_of(getattr(model, "chat_template", None) or "")
    if channels is not None:
        channels = channels.opened(prompt)
    return ToolChat(spec, fmt, prompt, tool_grammar(spec, fmt, model.tokenizer, channels),
                    model.tokenizer, channels)
