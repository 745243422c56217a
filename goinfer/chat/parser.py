"""Reading calls out of a reply: text -> content and tool calls, incrementally for streaming
(the id and name of a call first, then pieces of its arguments) or at once (``parse_reply``).
Call text that does not parse stays in the content; nothing is dropped.  How a region of
calls is read is the format's (ToolFormat.scan); this is the part every format shares."""

from __future__ import annotations

from goinfer.chat.formats.base import ToolFormat
from goinfer.chat.jsonscan import WS, Call, NotACall, skip_ws
from goinfer.chat.spec import ToolCallDelta, ToolSpec

__all__ = ["CallParser", "parse_reply"]


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
        return [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in self.calls
        ]

    # ------------------------------------------------------------------ content

    def _send(self, out: list, s: str) -> None:
        if s:
            out.append(s)
            self.parts.append(s)

    def _content(self, out: list, s: str) -> None:
        """Send text as content, holding back trailing whitespace (dropped if a call comes
        next); whitespace after a call is kept only between two pieces of text."""
        s = self.held + s
        body = s.rstrip(WS)
        self.held = s[len(body) :]
        if not body:
            return
        if self.after_call and not self.parts:
            body = body.lstrip(WS)
        self.after_call = False
        self._send(out, body)

    # ------------------------------------------------------------------ scanning

    def _bare_json_at(self, k: int) -> bool:
        """Does a region of calls open at text[k] without the marker (a reply that opens with
        a JSON object, where the format allows it)?"""
        return (
            self.fmt.opens_with_json
            and self.text.startswith("{", k)
            and not self.text.startswith(self.fmt.open, k)
        )

    def _open_at(self, final: bool) -> tuple[int | None, int]:
        """(where the next call region opens or None, how far text is surely content)."""
        s, i = self.text, self.i
        k = s.find(self.fmt.open, i)
        if self.fmt.opens_with_json and not self.calls and not self.parts:  # nothing said yet
            j = skip_ws(s, i)
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
            if self.fmt.open.startswith(s[len(s) - n :]):
                safe = len(s) - n
                break
        return None, safe

    def _advance(self, out: list, final: bool) -> None:
        if not self.active:
            self._send(out, self.text[self.i :])
            self.i = len(self.text)
            return
        while True:
            if self.region is None:
                k, safe = self._open_at(final)
                self._content(out, self.text[self.i : safe])
                self.i = safe
                if k is None:
                    return
                self.region_at = k
                self.region = k if self._bare_json_at(k) else k + len(self.fmt.open)
                self.i = self.region
                self.sent = []
            if not self._region(out, final):
                return

    def _region(self, out: list, final: bool) -> bool:
        """Read the current region; True when it is over (scanning goes on after it)."""
        s = self.text
        try:
            r = self.fmt.scan(s, skip_ws(s, self.region), final, self.schemas)
            for c in r.calls:
                if c.name is not None and c.name not in self.names:
                    raise NotACall
            complete = r.end is not None and all(c.end is not None for c in r.calls)
            if complete and any(
                c.name is None or c.args is None or c.args[1] is None for c in r.calls
            ):
                raise NotACall
        except NotACall:
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

    def _send_calls(self, out: list, calls: list[Call]) -> None:
        s = self.text
        for n, c in enumerate(calls):
            if c.name is None or c.args is None:
                return  # the name goes out with the first character of the arguments
            if n == len(self.sent):
                cid = self.fmt.call_id(c.id)
                entry = {"id": cid, "name": c.name, "arguments": "", "index": len(self.calls)}
                self.sent.append(entry)
                self.calls.append(entry)
                out.append(ToolCallDelta(entry["index"], cid, c.name, ""))
                self.held = ""
            entry = self.sent[n]
            a0, a1 = c.args
            if c.json is not None:  # converted arguments (qwen_xml, gemma4): whole once read
                piece = c.json[len(entry["arguments"]) :]
            else:
                piece = s[a0 + len(entry["arguments"]) : len(s) if a1 is None else a1]
            entry["end"] = len(s) if a1 is None else a1
            if piece:
                entry["arguments"] += piece
                if (
                    isinstance(out[-1] if out else None, ToolCallDelta)
                    and out[-1].index == entry["index"]
                ):
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


def parse_reply(
    text: str, fmt: ToolFormat, spec: ToolSpec | None
) -> tuple[str | None, list[dict] | None]:
    """A whole reply -> (content, tool_calls in OpenAI's shape or None)."""
    p = CallParser(fmt, spec, eager=False)
    p.text = text
    p.finish()
    return p.content, p.tool_calls
