"""Reply channels: a model's reasoning apart from its answer and its tool calls.

OpenAI-compatible servers (llama.cpp's, vLLM) send a reasoning model's thinking in the
message's ``reasoning_content`` (DeepSeek's convention) and only the answer in ``content``.
Two ways models write it, chosen from the chat template (``channels_of``):

- think: ``<think>reasoning</think>answer`` (Qwen3, Qwen3.5, SmolLM3, DeepSeek-R1 distills).
  Some templates open the block in the prompt (Qwen3.5's generation prompt ends with
  ``<think>\\n``): the reply then starts inside it (``Channels.open``); others let the model
  write ``<think>`` itself, at the start of its reply.  The answer goes on to the tool-call
  parser of the template's format (goinfer/chat/parser.py).  Gemma 4 writes the same kind of block
  with its own markers, ``<|channel>thought\nreasoning<channel|>answer`` (``GEMMA_THINK``).
- harmony (gpt-oss): a reply is a run of messages ``<|channel|>C<|message|>BODY`` joined by
  ``<|end|><|start|>assistant`` and ended by ``<|return|>`` or ``<|call|>`` (stop tokens: the
  end of the text ends the last one).  Channel ``analysis`` is reasoning, ``final`` (and
  ``commentary`` without a recipient) is content, and a message to ``functions.NAME``
  (``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{args}``, or the
  recipient before the channel as the template writes calls) is a tool call whose arguments
  are its body.  Text before any header (a reply that is not harmony at all) is content.

``ReplyParser`` does either, incrementally (streaming: ``Reasoning`` pieces, content strings
and ToolCallDelta pieces, in order) or at once; nothing the model wrote is dropped
except the format's own markers and the whitespace around them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass

from goinfer.chat.spec import ToolCallDelta, new_call_id

__all__ = [
    "Channels",
    "THINK",
    "GEMMA_THINK",
    "HARMONY_CHANNELS",
    "Reasoning",
    "ReplyParser",
    "channels_of",
    "think_grammar_prefix",
    "think_text_rule",
]

_WS = " \t\n\r"


THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Channels:
    kind: str  # "think" | "harmony"
    open: bool = False  # think: the prompt opened the block, the reply starts inside it
    # think: the block's markers; the opening one in pieces (a special token, then text)
    open_parts: tuple[str, ...] = (THINK_OPEN,)
    close_mark: str = THINK_CLOSE

    @property
    def open_mark(self) -> str:
        return "".join(self.open_parts)

    def opened(self, prompt: str) -> Channels:
        """This format for a reply to `prompt` (think: does the prompt end inside a block?)."""
        if self.kind != "think":
            return self
        tail = prompt.rstrip(_WS)
        return dataclasses.replace(self, open=tail.endswith(self.open_mark))


THINK = Channels("think")
# Gemma 4: <|channel>thought\n...<channel|> (its generation prompt writes an empty one when
# thinking is off)
GEMMA_THINK = Channels("think", open_parts=("<|channel>", "thought\n"), close_mark="<channel|>")
HARMONY_CHANNELS = Channels("harmony")


def channels_of(template: str) -> Channels | None:
    """The reasoning format of a chat template (None: the reply is all answer)."""
    if not template:
        return None
    if "<|channel|>" in template and "<|message|>" in template:
        return HARMONY_CHANNELS
    if "<|channel>thought" in template and "<channel|>" in template:
        return GEMMA_THINK
    if THINK_CLOSE in template:
        return THINK
    return None


class Reasoning(str):
    """A streamed piece of reasoning (``delta.reasoning_content``)."""


def think_grammar_prefix(channels: Channels, marker, close_is_special: bool = True) -> str:
    """Lark for the reasoning a think reply may start with, before what the grammar asks of
    the answer: the rest of an open block and its close (the prompt opened it), or an
    optional whole block.  marker(text) -> the Lark of a marker (a special token or text).
    A close marker that is text ends the (lazy) think_text rule itself (think_text_rule)."""
    close = " " + marker(channels.close_mark) if close_is_special else ""
    body = "think_text" + close + " /[ \\t\\r\\n]*/"
    if channels.open:
        return body
    opening = " ".join(
        marker(p) if p.startswith("<") else json.dumps(p) for p in channels.open_parts
    )
    return f"({opening} {body})?"


def think_text_rule(marker_is_special: bool, close: str = THINK_CLOSE) -> str:
    """The think_text rule: any text (a special close marker follows it), or the shortest
    text that ends with the close marker written as text (lazy: a greedy any-text terminal
    could not end before a marker that is text)."""
    if marker_is_special:
        return "think_text: /(?s:.*)/"  # text never holds a special token
    return f"think_text[lazy]: /(?s:.*){re.escape(close).replace('/', chr(92) + '/')}/"


# ============================================================================ parsing


def _partial_tail(s: str, markers: tuple[str, ...]) -> int:
    """Length of the longest tail of s that is a proper prefix of one of markers."""
    best = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(s)), best, -1):
            if m.startswith(s[len(s) - n :]):
                best = n
                break
    return best


class ReplyParser:
    """Reply text -> reasoning, content and tool calls, incrementally (the interface of
    parser.CallParser: push / finish, then content, tool_calls and reasoning).

    calls: the CallParser the answer goes to (think) or None (no calls read: the answer is
    content).  Harmony reads its calls itself: `names` are the functions that may be called
    (empty: no calls are read), `new_id()` makes a call's id, `eager` as CallParser's (a
    call's id and name as soon as its header is read, then its arguments as they come;
    eager=False: a call only once its body is a whole JSON object, else content)."""

    def __init__(
        self,
        channels: Channels,
        calls=None,
        *,
        names: set[str] | None = None,
        eager: bool = True,
        new_id=None,
    ):
        self.channels = channels
        self.calls_parser = calls
        self.names = names or set()
        self.eager = eager
        if new_id is None:
            new_id = new_call_id
        self.new_id = new_id
        self.text = ""
        self.i = 0  # text[:i] is decided
        self.done = False
        self.reasoning_parts: list[str] = []
        self.content_parts: list[str] = []
        self.calls: list[dict] = []
        # think
        self.state = "inside" if channels.open else "start"
        self.r_held = ""  # reasoning whitespace held back (dropped before the close)
        # harmony
        self.header: dict | None = None  # the message being read: channel, recipient
        self.call: dict | None = None  # the call its body is (eager: already announced)
        self.c_held = ""
        self.after_block = False  # strip whitespace at the start of the answer

    # ------------------------------------------------------------------ public

    def push(self, text: str) -> list:
        if self.done:
            raise RuntimeError("push() after finish()")
        self.text += text
        out: list = []
        if self.channels.kind == "harmony":
            self._harmony(out, final=False)
        else:
            self._think(out, final=False)
        return out

    def finish(self) -> list:
        out: list = []
        if self.done:
            return out
        if self.channels.kind == "harmony":
            self._harmony(out, final=True)
        else:
            self._think(out, final=True)
            if self.calls_parser is not None:
                out += self.calls_parser.finish()
        self.done = True
        return out

    @property
    def reasoning(self) -> str | None:
        text = "".join(self.reasoning_parts)
        return text or None

    @property
    def content(self) -> str | None:
        if self.calls_parser is not None:
            return self.calls_parser.content
        text = "".join(self.content_parts)
        return None if self.calls and not text else text

    @property
    def tool_calls(self) -> list[dict] | None:
        if self.calls_parser is not None:
            return self.calls_parser.tool_calls
        if not self.calls:
            return None
        return [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in self.calls
        ]

    # ------------------------------------------------------------------ pieces

    def _reason(self, out: list, s: str, closing: bool = False) -> None:
        """Reasoning text: leading whitespace of the block and whitespace before its close
        are not part of it (templates write "<think>\\n...\\n</think>")."""
        s = self.r_held + s
        if not self.reasoning_parts:
            s = s.lstrip(_WS)
        body = s.rstrip(_WS)
        self.r_held = "" if closing else s[len(body) :]
        if body:
            self.reasoning_parts.append(body)
            out.append(Reasoning(body))

    def _answer(self, out: list, s: str) -> None:
        if self.after_block:
            s = s.lstrip(_WS)
            if not s:
                return
            self.after_block = False
        if not s:
            return
        if self.calls_parser is not None:
            out += self.calls_parser.push(s)
        else:
            self.content_parts.append(s)
            out.append(s)

    # ------------------------------------------------------------------ think

    def _think(self, out: list, final: bool) -> None:
        s = self.text
        while True:
            if self.state == "start":
                j = len(s) - len(s[self.i :].lstrip(_WS))
                if j >= len(s) and not final:
                    return  # only whitespace yet: a block may still open
                mark = self.channels.open_mark
                if s.startswith(mark, j):
                    self.i = j + len(mark)
                    self.state = "inside"
                    continue
                if not final and mark.startswith(s[j:]):
                    return
                self.state = "after"
                continue
            if self.state == "inside":
                close = self.channels.close_mark
                k = s.find(close, self.i)
                if k >= 0:
                    self._reason(out, s[self.i : k], closing=True)
                    self.i = k + len(close)
                    self.state = "after"
                    self.after_block = True
                    continue
                end = len(s) if final else len(s) - _partial_tail(s[self.i :], (close,))
                self._reason(out, s[self.i : end], closing=final)
                self.i = end
                return
            # after: the answer
            self._answer(out, s[self.i :])
            self.i = len(s)
            return

    # ------------------------------------------------------------------ harmony

    _HEAD_END = "<|message|>"
    _BODY_ENDS = ("<|end|>", "<|call|>", "<|return|>")

    def _harmony(self, out: list, final: bool) -> None:
        s = self.text
        while True:
            if self.header is None:
                k = s.find(self._HEAD_END, self.i)
                if k < 0:
                    if final:  # no header: not harmony, the text is content
                        self._h_content(out, s[self.i :])
                        self.i = len(s)
                    return
                head = s[self.i : k]
                self.header = _header(head)
                if self.header is None:  # not a header: content as written
                    self._h_content(out, s[self.i : k + len(self._HEAD_END)])
                    self.i = k + len(self._HEAD_END)
                    self.header = None
                    continue
                self.i = k + len(self._HEAD_END)
                self._h_begin(out)
            ends = [(s.find(m, self.i), m) for m in self._BODY_ENDS]
            ends = [(k, m) for k, m in ends if k >= 0]
            if ends:
                k, m = min(ends)
                self._h_body(out, s[self.i : k], closing=True)
                self.i = k + len(m)
                self.header = None
                continue
            end = len(s) if final else len(s) - _partial_tail(s[self.i :], self._BODY_ENDS)
            self._h_body(out, s[self.i : end], closing=final)
            self.i = end
            if final:
                self.header = None
            return

    def _h_content(self, out: list, s: str) -> None:
        if s:
            self.content_parts.append(s)
            out.append(s)

    def _h_begin(self, out: list) -> None:
        """A message header was read: a call to a known function opens a call."""
        h = self.header
        name = (
            h["recipient"][len("functions.") :] if h["recipient"].startswith("functions.") else None
        )
        h["kind"] = (
            "call"
            if name in self.names
            else "content"
            if h["channel"] != "analysis"
            else "reasoning"
        )
        if h["recipient"] and h["kind"] != "call":
            h["kind"] = "content"  # a recipient we do not serve: its text stays visible
        h["body"] = ""
        self.r_held = ""
        if h["kind"] == "call":
            self.call = {
                "id": self.new_id(),
                "name": name,
                "arguments": "",
                "index": len(self.calls),
            }
            if self.eager:
                self.calls.append(self.call)
                out.append(ToolCallDelta(self.call["index"], self.call["id"], name, ""))

    def _h_body(self, out: list, s: str, closing: bool) -> None:
        h = self.header
        if h["kind"] == "reasoning":
            self._reason(out, s, closing=closing)
            return
        if h["kind"] == "content":
            self._h_content(out, s)
            return
        h["body"] += s
        if self.eager:
            if s:
                self.call["arguments"] += s
                out.append(ToolCallDelta(self.call["index"], arguments=s))
            return
        if closing:  # a whole call: kept if its body is a JSON object, else content
            try:
                ok = isinstance(json.loads(h["body"]), dict)
            except ValueError:
                ok = False
            if ok:
                self.call["arguments"] = h["body"].strip()
                self.call["index"] = len(self.calls)
                self.calls.append(self.call)
            else:
                self._h_content(out, h["body"])


_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")


def _header(head: str) -> dict | None:
    """A harmony message header (the text before <|message|>) -> {channel, recipient}, or
    None when it is no header (no channel)."""
    m = _CHANNEL.search(head)
    if m is None:
        return None
    r = _RECIPIENT.search(head)
    return {"channel": m.group(1), "recipient": r.group(1) if r else ""}
