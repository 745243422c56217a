"""The interface of a tool-call format: how a model writes calls, and everything goinfer does
with that (render the history, constrain the reply, read the calls back).

A format is one subclass of ToolFormat in its own module, registered in
goinfer/chat/formats/__init__.py.  The defaults here are those of a call written as a JSON
object inside a pair of markers, one block per call (``<tool_call>\\n{"name": f, "arguments":
{...}}\\n</tool_call>``); a format overrides what it does differently:

- ``detect(template)``: is this the model's format (its chat template's text)?
- ``render(messages, spec)``: (messages, tools) as the chat template takes them;
- ``call_rules(tools, many, tokenizer)``: the Lark rules of the calls (``grammar`` assembles
  the reply around them: free text first unless a call is forced);
- ``scan(text, i, final, schemas)``: the calls of a region that opens at text[i] (just after
  the opening marker), read as far as the text goes;
- ``new_id()`` / ``call_id(written)``: the ids the reply's calls get.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from goinfer.chat.freeform import call_rules as freeform_call_rules
from goinfer.chat.freeform import lark_of
from goinfer.chat.grammar import ANY_TEXT, call_schema, marker, regex, special, text_without
from goinfer.chat.jsonscan import NotACall, Region, close_after, scan_call, skip_ws
from goinfer.chat.spec import ToolSpec, new_call_id
from goinfer.errors import ChatTemplateError

__all__ = ["ToolFormat", "openai_tools", "message_text", "call_fields", "native_message"]


class ToolFormat:
    name: str = ""  # the registry's name of the format
    native: bool = True  # the model's chat template renders tools, calls and results
    open: str = ""  # text that opens calls
    close: str = ""  # text that closes one call ("": the JSON's end closes it)
    args_key: str = "arguments"  # key of the arguments object in a call
    # a reply that opens with "{" is a call, without the opening marker (Llama 3)
    opens_with_json: bool = False
    # detected only in templates that render the tools they are given
    needs_tool_rendering: bool = True

    def __repr__(self) -> str:
        return f"<tool format {self.name}>"

    # ------------------------------------------------------------------ choosing

    def detect(self, template: str) -> bool:
        """Is this the call format of a model with this chat template?"""
        return False

    # ------------------------------------------------------------------ rendering

    def render(self, messages: list, spec: ToolSpec | None) -> tuple[list, list | None]:
        """(messages, tools) to give the chat template: the model's own rendering of tools and
        tool history.  Call arguments given as JSON strings (OpenAI's shape) become objects,
        as templates expect."""
        return [native_message(m) for m in messages], openai_tools(spec)

    # ------------------------------------------------------------------ constraining

    def grammar(self, spec: ToolSpec, tokenizer) -> str:
        """The Lark grammar of a reply under `spec`: "required" and a named function are
        constrained from the first token; "auto" leaves the text free until the opening
        marker, then constrains the call; "none" forbids the marker."""
        if spec.choice == "none":
            return self.no_calls(tokenizer)
        rules, first, after = self.call_rules(spec.callable, spec.many, tokenizer)
        open_ = marker(tokenizer, self.open)
        if spec.forced:
            start = f"{open_} {first}{after}"
        elif special(tokenizer, self.open) is not None:
            rules.append(ANY_TEXT)  # text never holds a special token
            start = f"TEXT | TEXT {open_} {first}{after}"
        else:
            rules += [text_without(self.open), f"head[lazy]: /(?s:.*){regex(self.open)}/"]
            start = f"TEXT | head {first}{after}"
        rules.insert(0, f"start: {start}")
        return "\n".join(rules) + "\n"

    def call_rules(self, tools, many: bool, tokenizer) -> tuple[list[str], str, str]:
        """(rules, the rule of the first call after the opening marker, what may follow it).
        One block per call, laid out as templates write it: a line break, the call, a line
        break, the close marker; more calls each after a line break, and a line break may
        also end the reply, so the model decides between another call and the end after it
        (see ToolChat.compiled)."""
        rules = self.body_rules(tools, tokenizer)
        rules.append(f'first: "\\n" body "\\n" {marker(tokenizer, self.close)}')
        after = f' ("\\n" {marker(tokenizer, self.open)} first)* "\\n"?' if many else ""
        return rules, "first", after

    def body_rules(self, tools, tokenizer) -> list[str]:
        """Rules of one call's text (``body``): a JSON call object.  A free-form tool with a
        Lark grammar (goinfer/chat/freeform.py) has its own rule, the grammar holding its
        input string."""
        free = [t for t in tools if lark_of(t) is not None]
        if not free:
            return ["body: %json " + json.dumps(call_schema(tools, self.args_key))]
        plain = [t for t in tools if lark_of(t) is None]
        rules, alts = [], []
        if plain:
            rules.append(
                "goinfer_json_call: %json " + json.dumps(call_schema(plain, self.args_key))
            )
            alts.append("goinfer_json_call")
        for k, t in enumerate(free):
            r, name = freeform_call_rules(t, self.args_key, k)
            rules += r
            alts.append(name)
        return [f"body: {' | '.join(alts)}"] + rules

    def no_calls(self, tokenizer) -> str:
        """tool_choice "none": any text that does not open a call."""
        if special(tokenizer, self.open) is not None:
            return "start: TEXT\n" + ANY_TEXT + "\n"  # the special marker cannot appear in text
        return "start: TEXT\n" + text_without(self.open) + "\n"

    def answer_grammar(self, response_format, tokenizer):
        """A compiled grammar holding the reply's answer to a JSON response_format where the
        format puts the answer after other messages (None: the request's own constraint
        holds the whole reply)."""
        return None

    # ------------------------------------------------------------------ parsing

    @property
    def args_keys(self) -> tuple[str, ...]:
        """The keys a call's arguments object may have when read (this format's first)."""
        return (self.args_key,) + tuple(
            k for k in ("arguments", "parameters") if k != self.args_key
        )

    def scan(self, s: str, j: int, final: bool, schemas: Mapping) -> Region:
        """The calls of the region at s[j] (after the opening marker and whitespace): one
        JSON object (a list of objects is read too), then the close marker.  NotACall when
        the text is no call.  schemas: {name: the tool's parameters}."""
        r = Region()
        listed = j < len(s) and s[j] == "["
        if listed:
            j = skip_ws(s, j + 1)
        while True:
            c = scan_call(s, j, self.args_keys)
            r.calls.append(c)
            if c.end is None:
                return r
            j = skip_ws(s, c.end)
            if listed:
                if j >= len(s):
                    return r
                if s[j] == ",":
                    j = skip_ws(s, j + 1)
                    continue
                if s[j] != "]":
                    raise NotACall
                j = skip_ws(s, j + 1)
            return close_after(r, s, j, self.close, final)

    def new_id(self) -> str:
        """A tool call id."""
        return new_call_id()

    def call_id(self, written: str | None) -> str:
        """The id of a call the reply made (written: the id the model wrote in it, if any)."""
        return self.new_id()


# ============================================================================ message helpers


def openai_tools(spec: ToolSpec | None) -> list[dict] | None:
    """The request's tools in OpenAI's shape, as chat templates take them."""
    return [t.as_openai() for t in spec.tools] if spec is not None else None


def message_text(content) -> str:
    """Message content as text (a list of text parts joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, Mapping) else str(p) for p in content)
    return json.dumps(content, ensure_ascii=False)


def call_fields(call) -> tuple[str, object]:
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


def native_message(m):
    """A message with its calls' arguments as objects (templates index into them)."""
    if not isinstance(m, Mapping) or not m.get("tool_calls"):
        return m
    calls = []
    for c in m["tool_calls"]:
        name, args = call_fields(c)
        c = dict(c)
        c["function"] = dict(c.get("function", {}), name=name, arguments=args)
        calls.append(c)
    return dict(m, tool_calls=calls)
