"""An incremental scanner of call objects written as JSON: ``{"name": f, "arguments": {...}}``
read as far as the text goes (streaming), telling a call that may still complete from text
that is no call.

``scan_call`` returns a Call whose fields are filled as far as the text goes; the formats'
scanners (goinfer/chat/formats/) build a Region of calls from it.  Incomplete: the text ends
inside a value; NotACall: the text cannot be (the start of) a call.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

__all__ = [
    "Incomplete",
    "NotACall",
    "Call",
    "Region",
    "WS",
    "skip_ws",
    "scan_string",
    "scan_container",
    "scan_call",
    "close_after",
]


class Incomplete(Exception):
    """The text ends before the JSON does."""


class NotACall(Exception):
    """The text is not a call."""


WS = " \t\n\r"
_SCALAR = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?|true|false|null")


@dataclass
class Call:
    """One call object as far as the text goes."""

    name: str | None = None
    args: tuple[int, int | None] | None = None  # span of the arguments value (end None: open)
    id: str | None = None
    end: int | None = None  # index after the closing brace
    json: str | None = None  # the arguments as JSON text, when not a span of the text (xml)


@dataclass
class Region:
    """Calls found after an opening marker, as far as the text goes."""

    calls: list[Call] = field(default_factory=list)
    end: int | None = None  # index after the region (None: it may go on)


def skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in WS:
        i += 1
    return i


def scan_string(s: str, i: int) -> int:
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
            raise NotACall
        j += 1
    raise Incomplete


def scan_container(s: str, i: int) -> int:
    """s[i] in '{[' -> index after its matching bracket (strings skipped; the inside is checked
    by json.loads once complete)."""
    stack = []
    j, n = i, len(s)
    pairs = {"{": "}", "[": "]"}
    while j < n:
        c = s[j]
        if c == '"':
            j = scan_string(s, j)
            continue
        if c in pairs:
            stack.append(pairs[c])
        elif c in "}]":
            if not stack or stack.pop() != c:
                raise NotACall
            if not stack:
                return j + 1
        j += 1
    raise Incomplete


def scan_call(s: str, i: int, args_keys: tuple[str, ...]) -> Call:
    """Scan the call object at s[i] ('{') as far as s goes; raise NotACall if it is not one.
    args_keys: the keys an arguments object may have ("arguments", "parameters")."""
    call = Call()
    if i >= len(s):
        return call
    if s[i] != "{":
        raise NotACall
    try:
        j = skip_ws(s, i + 1)
        first = True
        while True:
            if j >= len(s):
                return call
            if s[j] == "}" and first:
                call.end = j + 1
                return call
            if s[j] != '"':
                raise NotACall
            k = scan_string(s, j)
            key = json.loads(s[j:k])
            j = skip_ws(s, k)
            if j >= len(s):
                return call
            if s[j] != ":":
                raise NotACall
            j = skip_ws(s, j + 1)
            if j >= len(s):
                return call
            v = j
            if key in args_keys:
                call.args = (v, None)
                if s[v] != "{":
                    raise NotACall  # arguments are an object
            if s[v] == '"':
                end = scan_string(s, v)
            elif s[v] in "{[":
                end = scan_container(s, v)
            else:
                m = _SCALAR.match(s, v)
                if not m:
                    raise NotACall
                end = m.end()
                if end >= len(s):
                    return call  # a number may go on
            if key == "name":
                call.name = json.loads(s[v:end])
                if not isinstance(call.name, str):
                    raise NotACall
            elif key == "id":
                x = json.loads(s[v:end])
                call.id = x if isinstance(x, str) else None
            elif key in args_keys:
                try:
                    ok = isinstance(json.loads(s[v:end]), dict)
                except ValueError:
                    ok = False
                if not ok:
                    raise NotACall
                call.args = (v, end)
            j = skip_ws(s, end)
            if j >= len(s):
                return call
            if s[j] == "}":
                call.end = j + 1
                return call
            if s[j] != ",":
                raise NotACall
            j = skip_ws(s, j + 1)
            first = False
    except Incomplete:
        return call


def close_after(region: Region, s: str, j: int, close: str, final: bool) -> Region:
    """End `region` at the close marker expected at s[j] (whitespace skipped): after the
    marker; at the end of the text when the reply ended without (all of) it; open while the
    text may still be the marker.  NotACall: other text."""
    j = skip_ws(s, j)
    rest = s[j : j + len(close)]
    if rest == close:
        region.end = j + len(close)
    elif not close.startswith(rest):
        raise NotACall
    elif final:
        region.end = len(s)
    return region
