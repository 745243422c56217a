"""Harmony (gpt-oss): a call is a message of the reply,
``<|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}`` ended by
``<|call|>``, one call per reply.  It is read with the reply's reasoning and answer by
goinfer/chat/channels.py (ReplyParser), not by the call parser."""

from __future__ import annotations

import json
from collections.abc import Mapping

from goinfer.chat.channels import channels_of
from goinfer.chat.formats.base import ToolFormat, message_text, native_message, openai_tools
from goinfer.chat.grammar import (
    ANY_TEXT,
    json_rule,
    marker,
    special,
    text_without,
    tool_parameters,
)
from goinfer.chat.spec import ToolSpec
from goinfer.constrained import enforced_schema


class Harmony(ToolFormat):
    name = "harmony"
    open, close = "to=functions.", "<|call|>"
    needs_tool_rendering = False  # known from the template's channels

    def detect(self, template: str) -> bool:
        ch = channels_of(template)
        return ch is not None and ch.kind == "harmony"

    def render(self, messages: list, spec: ToolSpec | None) -> tuple[list, list | None]:
        """gpt-oss's template writes every tool's description (none: an empty one)."""
        tools = openai_tools(spec)
        if tools is not None:
            tools = [
                dict(
                    t,
                    function=dict(t["function"], description=t["function"].get("description", "")),
                )
                for t in tools
            ]
        return [x for m in messages for x in _messages(m)], tools

    def grammar(self, spec: ToolSpec, tokenizer) -> str:
        """An optional analysis message, then the final answer (tool_choice "auto", "none") or
        one call (forced, "auto"); its end is a stop token (<|return|>, <|call|>).  A call is
        written `` to=functions.f<|channel|>commentary json<|message|>{...}``, as the template
        renders calls (harmony also allows the recipient after the channel, which the parser
        reads too)."""
        ch, msg = marker(tokenizer, "<|channel|>"), marker(tokenizer, "<|message|>")
        special_end = special(tokenizer, "<|end|>") is not None
        rules = [
            ANY_TEXT if special_end else text_without("<|"),
            f'analysis: {ch} "analysis" {msg} TEXT {marker(tokenizer, "<|end|>")} '
            f'{marker(tokenizer, "<|start|>")} "assistant"',
            f'final: {ch} "final" {msg} TEXT',
        ]
        tools = spec.callable
        alts = []
        for i, t in enumerate(tools):
            rules.append(json_rule(f"args{i}", tool_parameters(t)))
            # the recipient in the header, before the channel: the form gpt-oss's template
            # writes calls in the history, so the next turn's prompt repeats the reply verbatim
            alts.append(f'" to=functions.{t.name}" {ch} "commentary json" {msg} args{i}')
        if spec.choice == "none" or not alts:
            start = "analysis? final"
        else:
            rules.append("call: " + " | ".join(alts))
            start = "analysis? call" if spec.forced else "analysis? (final | call)"
        return f"start: {start}\n" + "\n".join(rules) + "\n"

    def answer_grammar(self, response_format, tokenizer):
        """A JSON response_format -> its compiled grammar (constrained.Grammar): an optional
        analysis message, then the final one holding the JSON (None: a schema that is not an
        object, kept as the request gave it).  GrammarError naming response_format."""
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
        schema = dict(enforced_schema(rf[1]))
        schema["x-guidance"] = {"whitespace_pattern": JSON_WHITESPACE}
        g = self.grammar(ToolSpec((), "none"), tokenizer)
        head, _, rest = g.partition("\n")
        rules = [r for r in rest.splitlines() if not r.startswith("final:")]
        ch, msg = marker(tokenizer, "<|channel|>"), marker(tokenizer, "<|message|>")
        rules.append(f'final: {ch} "final" {msg} %json ' + json.dumps(schema))
        lark = head + "\n" + "\n".join(rules) + "\n"
        _, _, source = request_source(grammar=lark)
        return token_view(tokenizer).compile(source, "lark", "response_format")


def _messages(m) -> list:
    """An OpenAI message as gpt-oss's template takes it: reasoning in "thinking", no null
    content, one call per assistant message (the template renders the first call only)."""
    m = native_message(m)
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
        m["thinking"] = f"{m['thinking']}\n{message_text(m.pop('content'))}"
    first = dict(m, tool_calls=[calls[0]])
    return [first] + [{"role": "assistant", "tool_calls": [c]} for c in calls[1:]]


FORMAT = Harmony()
