"""One chat request: the conversation rendered with the model's chat template (tools and tool
history in the model's call format), the grammar its reply is held to, and the parser that
reads the reply back (content, reasoning, tool calls).

    tc = prepare_chat(model, messages, tools, tool_choice, parallel_tool_calls)
    ids = model.tokenize_chat(tc.prompt)
    response_format, grammar = tc.constraint(response_format, grammar)
    ... generate ...
    tc.finish(result)            # or tc.stream(items) while streaming
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from goinfer.chat.channels import (
    Channels,
    Reasoning,
    ReplyParser,
    channels_of,
    think_grammar_prefix,
    think_text_rule,
)
from goinfer.chat.formats import tool_format
from goinfer.chat.formats.base import ToolFormat
from goinfer.chat.grammar import marker, special
from goinfer.chat.parser import CallParser
from goinfer.chat.spec import ToolSpec, check_tools
from goinfer.chat.system import in_place
from goinfer.chat_template import _to_dicts, render_chat_template
from goinfer.errors import ChatTemplateError, ToolError
from goinfer.generation import Piece

__all__ = [
    "ToolChat",
    "prepare_chat",
    "chat_inputs",
    "tool_grammar",
    "alternates_roles",
    "join_same_roles",
]


def chat_inputs(messages, fmt: ToolFormat, spec: ToolSpec | None) -> tuple[list[dict], list | None]:
    """(messages, tools) to give the chat template, rendered by the format (ToolFormat.render):
    the model's own rendering of tools and tool history for a native format; for the generic
    format, the tool prompt in the system message, calls written as <tool_call> blocks and
    results as <tool_response> blocks in a user message."""
    messages = _to_dicts(getattr(messages, "messages", messages))
    if not isinstance(messages, (list, tuple)):
        raise ChatTemplateError(f"messages must be a list of dicts, got {type(messages).__name__}")
    return fmt.render(list(messages), spec)


def tool_grammar(
    spec: ToolSpec | None, fmt: ToolFormat, tokenizer=None, channels: Channels | None = None
) -> str | None:
    """The Lark grammar (llguidance) of a reply under `spec` in format `fmt`, or None when
    nothing is constrained.  `tokenizer` tells which markers are special tokens of the model
    (written as ``<[id]>``); without it every marker is text.  channels: the reply's reasoning
    format (goinfer/chat/channels.py); a think block may come first (must, when the prompt
    opened one)."""
    if spec is None:
        return None
    g = fmt.grammar(spec, tokenizer)
    if channels is None or channels.kind != "think":
        return g
    head, _, rest = g.partition("\n")
    assert head.startswith("start: ")
    is_special = special(tokenizer, channels.close_mark) is not None
    prefix = think_grammar_prefix(channels, lambda t: marker(tokenizer, t), is_special)
    rule = think_text_rule(is_special, channels.close_mark)
    return f"start: {prefix} ({head[len('start: ') :]})\n{rule}\n{rest}"


# ============================================================================ one chat request


@dataclass
class ToolChat:
    """The tool side of one chat request: its prompt, its grammar (None: unconstrained) and
    the parser of its reply.  ``ChatSession.chat`` and the server both use one."""

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
        reasoning (its answer going on to a CallParser; harmony reads its calls itself)."""
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
            response_format is None or response_format == {"type": "text"}
        )
        if theirs and grammar is None and (self.spec is None or self.spec.choice == "none"):
            g = self.fmt.answer_grammar(response_format, self.tokenizer)
            if g is not None:  # the schema holds the answer, after what comes before it
                return None, g
        if theirs and grammar is None and self.spec is not None and self.spec.forced:
            return None, self.compiled()  # the reply is calls: no answer for a format to hold
        if (
            theirs
            and grammar is None
            and self.spec is not None
            and self.spec.choice == "auto"
            and self.channels is None
        ):
            g = self.answer_or_calls(response_format)
            if g is not None:  # the reply is the answer the schema holds, or calls
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
        raise ToolError(
            "tools with a response_format or grammar need tool_choice 'none' "
            "(goinfer cannot hold one reply to both)",
            "grammar" if grammar is not None else "response_format",
        )

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
        return dataclasses.replace(
            g,
            end_takes_forbidden=True,
            calls_begun=_calls_begun(self.spec, self.fmt, self.tokenizer),
        )

    def answer_or_calls(self, response_format):
        """tool_choice "auto" with a JSON response_format (an agent with tools and a
        structured final answer, Codex's --output-schema): the reply is either the answer,
        held to the schema from its first token, or calls, as with "required" (compiled
        constrained.Grammar; None: no JSON format).  GrammarError naming response_format."""
        from goinfer.constrained import (
            JSON_WHITESPACE,
            _response_format_schema,
            bound_numbers,
            json_schema_source,
            token_view,
        )

        rf = _response_format_schema(response_format)
        if rf is None:
            return None
        json_schema_source(rf[1])  # checked here, so an error names response_format
        schema = dict(bound_numbers(rf[1])) if isinstance(rf[1], dict) else rf[1]
        if isinstance(schema, dict):
            schema["x-guidance"] = {"whitespace_pattern": JSON_WHITESPACE}
        calls = self.fmt.grammar(dataclasses.replace(self.spec, choice="required"), self.tokenizer)
        head, _, rest = calls.partition("\n")
        assert head.startswith("start: ")
        lark = (
            f"start: goinfer_answer | {head[len('start: ') :]}\n"
            f"goinfer_answer: %json {json.dumps(schema)}\n{rest}"
        )
        g = token_view(self.tokenizer).compile(lark, "lark", "response_format")
        return dataclasses.replace(g, end_takes_forbidden=True, calls_begun=None)

    def finish(self, result, parser=None):
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

    def stream(self, items: Iterable) -> Iterator:
        """Stream items of a generation (text pieces, then the result) -> content pieces,
        Reasoning pieces and ToolCallDelta pieces, then the finished result.  With logprobs
        (the pieces are generation.Piece): each item carries the entries of the tokens taken
        since the last item (text the parser holds back waits for the next one; what is left
        at the end comes in an empty Piece), so the items' entries add up to the result's
        list."""
        if not self.splits:
            yield from items
            return
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
    sid = special(tokenizer, fmt.open)
    brace = fmt.opens_with_json  # a Llama 3 reply that opens with "{" is a call

    def begun(tokens, text: str) -> bool:
        return (brace and text.startswith("{")) or (
            sid in tokens if sid is not None else fmt.open in text
        )

    return begun


def prepare_chat(
    model,
    messages,
    tools=None,
    tool_choice=None,
    parallel_tool_calls=None,
    template_kwargs: Mapping | None = None,
    unlisted: Collection[str] = (),
    system_in_place: bool = False,
) -> ToolChat:
    """Check the tool fields (ToolError), render the conversation with the model's chat
    template (ChatTemplateError; template_kwargs: more variables for it, e.g.
    ``enable_thinking=False``) and write the reply's grammar.  unlisted: names of tools the
    reply may call that the prompt's tool list leaves out (the conversation shows them where
    it loads them: Anthropic's deferred tools).  system_in_place: system messages after the
    first turn are rendered where they stand, whatever the template does with them
    (goinfer/chat/system.py)."""
    spec = check_tools(tools, tool_choice, parallel_tool_calls)
    fmt = tool_format(model)
    messages = _to_dicts(getattr(messages, "messages", messages))
    system = model.defaults.system  # the model's own (an Ollama system layer), if the chat has none
    if system and not any(m.get("role") in ("system", "developer") for m in messages):
        messages = [{"role": "system", "content": system}, *messages]
    if system_in_place:
        messages = in_place(messages, getattr(model, "chat_template", None) or "")
    msgs, template_tools = chat_inputs(messages, fmt, _listed(spec, unlisted))
    if alternates_roles(getattr(model, "chat_template", None) or ""):
        msgs = join_same_roles(msgs)
    kwargs = dict(template_kwargs or {})
    for k in ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token"):
        if k in kwargs:
            raise ChatTemplateError(f"chat_template_kwargs cannot set {k!r}")
    prompt = model.apply_chat_template(
        msgs, add_generation_prompt=True, tools=template_tools, **kwargs
    )
    channels = channels_of(getattr(model, "chat_template", None) or "")
    if channels is not None:
        channels = channels.opened(prompt)
    return ToolChat(
        spec,
        fmt,
        prompt,
        tool_grammar(spec, fmt, model.tokenizer, channels),
        model.tokenizer,
        channels,
    )


def _listed(spec: ToolSpec | None, unlisted: Collection[str]) -> ToolSpec | None:
    """The spec the prompt renders: its tools but the unlisted ones (None: none left)."""
    if spec is None or not unlisted:
        return spec
    shown = tuple(t for t in spec.tools if t.name not in unlisted)
    return dataclasses.replace(spec, tools=shown) if shown else None


# ============================================================================ alternating roles


@functools.lru_cache(maxsize=32)
def alternates_roles(template: str) -> bool:
    """Does the chat template refuse two user messages in a row (Gemma's wants user and
    assistant turns to alternate)?  Agents send such runs: Codex's environment context and
    prompt are two user messages, its system prompt two developer messages."""
    if not template:
        return False
    two = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    try:
        render_chat_template(template, two, add_generation_prompt=True)
    except ChatTemplateError:
        return True
    return False


def join_same_roles(messages: list) -> list:
    """Consecutive system or user messages of plain text joined into one, their texts
    separated by a blank line (for templates that want alternating roles).  A pure append to
    the conversation stays a pure append of the prompt, except when it adds a message of the
    role the conversation ended with."""
    out: list = []
    for m in messages:
        prev = out[-1] if out else None
        if (
            isinstance(m, Mapping)
            and isinstance(prev, Mapping)
            and m.get("role") in ("system", "user")
            and prev.get("role") == m.get("role")
            and set(m) <= {"role", "content"}
            and set(prev) <= {"role", "content"}
            and isinstance(m.get("content"), str)
            and isinstance(prev.get("content"), str)
        ):
            out[-1] = {"role": m["role"], "content": f"{prev['content']}\n\n{m['content']}"}
        else:
            out.append(m)
    return out
