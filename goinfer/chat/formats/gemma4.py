"""Gemma 4: ``<|tool_call>call:f{key:<|"|>text<|"|>,n:3}<tool_call|>``, one block per call:
keys bare, strings between ``<|"|>`` marks, other values as JSON (Gemma 4 templates).  After
its calls the model may ask for their results (``<|tool_response>``, as the template writes
after a call without results), which ends the reply."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from goinfer.chat.formats.base import ToolFormat
from goinfer.chat.grammar import json_rule, marker, regex, special, tool_parameters, written_as_text
from goinfer.chat.jsonscan import Call, Incomplete, NotACall, Region, skip_ws

QUOTE = '<|"|>'  # Gemma 4's string delimiter (a special token of its vocabulary)
RESULTS = "<|tool_response>"  # opens the results of the calls
_CALL = "call:"
_SCALAR = re.compile(r"-?\d+(\.\d+)?([eE][-+]?\d+)?|true|false|null|None")
_WORD = re.compile(r"[^,{}\[\]<\s]*")
_KEY = re.compile(r"[^:{}\[\],<>\s]+")


class Gemma4(ToolFormat):
    name = "gemma4"
    open, close = "<|tool_call>", "<tool_call|>"

    def detect(self, template: str) -> bool:
        return "<|tool_call>call:" in template

    def call_rules(self, tools, many: bool, tokenizer) -> tuple[list[str], str, str]:
        """One <|tool_call> block per call, no separator; a request for the results may
        follow the calls."""
        rules = self.body_rules(tools, tokenizer)
        rules.append(f"first: body {marker(tokenizer, self.close)}")
        after = (
            f" ({marker(tokenizer, self.open)} first)*" if many else ""
        ) + f" {marker(tokenizer, RESULTS)}?"
        return rules, "first", after

    def body_rules(self, tools, tokenizer) -> list[str]:
        """call:NAME{key:value,...}, the keys in sorted order (as the template writes them;
        the required ones always), a string value between <|"|> marks (an enum's words, or
        any text without the mark), an integer, number or boolean as JSON held to its schema,
        any other value a Gemma 4 value of any shape (gval)."""
        q = marker(tokenizer, QUOTE)
        if special(tokenizer, QUOTE) is not None:
            text = ["G_TEXT: /(?s:.*)/", f"gstr: {q} G_TEXT {q}"]  # text never holds the mark
        else:  # the shortest text that ends with the mark (lazy: a greedy one could not end)
            text = [f"g_text[lazy]: /(?s:.*){regex(QUOTE)}/", f"gstr: {q} g_text"]
        rules = text + [
            r"G_NUM: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?/",
            r"G_KEY: /[A-Za-z_][A-Za-z0-9_]*/",
            'gval: gstr | G_NUM | "true" | "false" | "null" | gobj | garr',
            'gobj: "{" (G_KEY ":" gval ("," G_KEY ":" gval)*)? "}"',
            'garr: "[" (gval ("," gval)*)? "]"',
        ]
        fns = []
        for i, t in enumerate(tools):
            params = tool_parameters(t)
            required = set(params.get("required", ()))
            props = sorted((params.get("properties") or {}).items())
            parts = []  # (rule, required)
            for j, (key, sub) in enumerate(props):
                sub = sub if isinstance(sub, Mapping) else {}
                kind = sub.get("type")
                if written_as_text(sub):
                    words = sub.get("enum", [sub["const"]] if "const" in sub else None)
                    value = (
                        "gstr"
                        if words is None
                        else f"{q} (" + " | ".join(json.dumps(w) for w in words) + f") {q}"
                    )
                elif kind in ("integer", "number", "boolean"):
                    rules.append(json_rule(f"v{i}_{j}", sub))
                    value = f"v{i}_{j}"
                else:
                    value = "gval"
                rules.append(f"p{i}_{j}: {json.dumps(key + ':')} {value}")
                parts.append((f"p{i}_{j}", key in required))
            alts = []
            for k, (rule, req) in enumerate(parts):
                rest = " ".join(f'("," {r})' + ("" if q_ else "?") for r, q_ in parts[k + 1 :])
                alts.append(f"{rule} {rest}".strip())
                if req:
                    break  # a required key opens every later alternative's list
            inner = " | ".join(f"({a})" for a in alts)
            if inner and not any(req for _, req in parts):
                inner = f"({inner})?"
            fns.append(f'{json.dumps("call:" + t.name + "{")} {inner} "}}"'.replace("  ", " "))
        rules.append("body: " + " | ".join(f"({f})" for f in fns))
        return rules

    def scan(self, s: str, j: int, final: bool, schemas: Mapping) -> Region:
        """One call: call:NAME{key:value,...} <tool_call|>.  The call gets its name at its "{"
        and its arguments (JSON text, keys in the order written) at its "}".  A
        <|tool_response> right after the close (the model asking for the results) is part of
        the region."""
        r = Region()
        c = Call()
        r.calls.append(c)
        head = s[j : j + len(_CALL)]
        if head != _CALL:
            if _CALL.startswith(head):
                return r
            raise NotACall
        k = j + len(_CALL)
        e = s.find("{", k)
        if e < 0:
            if not re.fullmatch(r"[A-Za-z0-9_.-]*", s[k:]):
                raise NotACall
            return r
        name = s[k:e]
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise NotACall
        c.name = name
        try:
            args, end = _value(s, e, final)
        except Incomplete:
            if final:
                raise NotACall from None
            return r
        if not isinstance(args, dict):
            raise NotACall
        c.json = json.dumps(args, ensure_ascii=False)
        c.args = (e, end)
        c.end = end
        j = skip_ws(s, end)
        rest = s[j : j + len(self.close)]
        if rest == self.close:
            j += len(self.close)
            more = s[j : j + len(RESULTS)]
            if more == RESULTS:
                r.end = j + len(RESULTS)
            elif RESULTS.startswith(more) and more and not final:
                return r
            elif not more and not final:
                return r  # a <|tool_response> may follow
            else:
                r.end = j
        elif not self.close.startswith(rest):
            raise NotACall
        elif final:
            r.end = len(s)
        return r


def _value(s: str, i: int, final: bool) -> tuple[object, int]:
    """The Gemma 4 value at s[i] -> (value, index after it): <|"|>text<|"|>, {key:value,...}
    (keys bare or quoted), [value,...], or a JSON scalar.  Incomplete: the text ends inside
    it; NotACall: it is no value."""
    if i >= len(s):
        raise Incomplete
    if s.startswith(QUOTE, i):
        k = s.find(QUOTE, i + len(QUOTE))
        if k < 0:
            raise Incomplete
        return s[i + len(QUOTE) : k], k + len(QUOTE)
    if QUOTE.startswith(s[i:]):
        raise Incomplete
    c = s[i]
    if c in "{[":
        obj = c == "{"
        out: dict | list = {} if obj else []
        j = i + 1
        if j >= len(s):
            raise Incomplete
        if s[j] == ("}" if obj else "]"):
            return out, j + 1
        while True:
            if obj:
                if s.startswith(QUOTE, j):
                    key, j = _value(s, j, final)
                else:
                    m = _KEY.match(s, j)
                    if m is None:
                        raise Incomplete if j >= len(s) or QUOTE.startswith(s[j:]) else NotACall
                    key, j = m.group(), m.end()
                if j >= len(s):
                    raise Incomplete
                if s[j] != ":":
                    raise NotACall
                v, j = _value(s, j + 1, final)
                out[key] = v
            else:
                v, j = _value(s, j, final)
                out.append(v)
            if j >= len(s):
                raise Incomplete
            if s[j] == ("}" if obj else "]"):
                return out, j + 1
            if s[j] != ",":
                raise NotACall
            j += 1
    end = _WORD.match(s, i).end()
    if end >= len(s) and not final:
        raise Incomplete  # a number or word may go on
    word = s[i:end]
    if not _SCALAR.fullmatch(word):
        raise NotACall
    return (None if word == "None" else json.loads(word)), end


FORMAT = Gemma4()
