"""Qwen XML: ``<tool_call>\\n<function=f>\\n<parameter=k>\\nvalue\\n</parameter>\\n</function>\\n``
``</tool_call>``, one block per call; a string value as it is, any other as JSON (templates
with ``<function=``: Qwen3.5, Qwen3-Coder)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from goinfer.chat.formats.base import ToolFormat
from goinfer.chat.grammar import json_rule, tool_parameters, written_as_text
from goinfer.chat.jsonscan import Call, NotACall, Region, close_after, skip_ws
from goinfer.chat.spec import ToolSpec

_FN, _PARAM = "<function=", "<parameter="
_END_PARAM, _END_FN = "</parameter>", "</function>"


class QwenXML(ToolFormat):
    name = "qwen_xml"
    open, close = "<tool_call>", "</tool_call>"

    def detect(self, template: str) -> bool:
        return "<function=" in template and "<tool_call>" in template

    def render(self, messages: list, spec: ToolSpec | None) -> tuple[list, list | None]:
        msgs, tools = super().render(messages, spec)
        return [_xml_message(m) for m in msgs], tools

    def body_rules(self, tools, tokenizer) -> list[str]:
        """One function block, its parameters in the schema's order (the required ones
        always), each value a JSON value of its schema or, for a string, the text itself
        (anything without the closing tag)."""
        rules = [r"XML_TEXT: /(?s:.*)/ & ~/(?s:.*)\n<\/parameter>(?s:.*)/"]
        fns = []
        for i, t in enumerate(tools):
            params = tool_parameters(t)
            defs = {k: params[k] for k in ("$defs", "definitions") if k in params}
            required = set(params.get("required", ()))
            parts = []
            for j, (key, sub) in enumerate((params.get("properties") or {}).items()):
                if written_as_text(sub):  # the text itself: an enum's values, or any text
                    words = sub.get("enum", [sub["const"]] if "const" in sub else None)
                    value = (
                        "XML_TEXT"
                        if words is None
                        else "(" + " | ".join(json.dumps(w) for w in words) + ")"
                    )
                else:
                    rules.append(
                        json_rule(
                            f"v{i}_{j}", dict(sub if isinstance(sub, Mapping) else {}, **defs)
                        )
                    )
                    value = f"v{i}_{j}"
                rules.append(
                    f'p{i}_{j}: {json.dumps(f"<parameter={key}>")} "\\n" {value} '
                    f'"\\n" "</parameter>" "\\n"'
                )
                parts.append(f"p{i}_{j}" + ("" if key in required else "?"))
            fns.append(
                f'{json.dumps(f"<function={t.name}>")} "\\n" {" ".join(parts)} "</function>"'
            )
        rules.append("body: " + " | ".join(f"({f})" for f in fns))
        return rules

    def scan(self, s: str, j: int, final: bool, schemas: Mapping) -> Region:
        """One call: <function=NAME> <parameter=K>\\nV\\n</parameter> ... </function>
        </tool_call>.  The call gets its name at once and its arguments (JSON text, keys in
        the order written) when </function> is read."""
        r = Region()
        c = Call()
        r.calls.append(c)
        k = _tag(s, j, _FN)
        if k is None:
            return r
        e = s.find(">", k)
        if e < 0:
            if "\n" in s[k:] or "<" in s[k:]:
                raise NotACall
            return r
        name = s[k:e]
        if not name or "\n" in name or "<" in name:
            raise NotACall
        c.name = name
        params = (schemas.get(name) or {}).get("properties") or {}
        args: dict = {}
        j = skip_ws(s, e + 1)
        while True:
            if j >= len(s):
                return r
            if s.startswith(_END_FN, j):
                c.json = json.dumps(args, ensure_ascii=False)
                c.args = (j, j)
                c.end = j + len(_END_FN)
                break
            if _END_FN.startswith(s[j:]) and not final:
                return r
            k = _tag(s, j, _PARAM)
            if k is None:
                return r
            e = s.find(">", k)
            if e < 0:
                return r
            key = s[k:e]
            v0 = e + 1 + (s.startswith("\n", e + 1))
            end = s.find(_END_PARAM, v0)
            if end < 0:
                return r
            v1 = end - 1 if s.startswith("\n", end - 1) and end - 1 >= v0 else end
            args[key] = _value(s[v0:v1], params.get(key))
            j = skip_ws(s, end + len(_END_PARAM))
        return close_after(r, s, c.end, self.close, final)


def _xml_message(m):
    """Argument values that are not strings as JSON text (the template writes a scalar with
    |string: Python's True, not the model's true)."""
    if not isinstance(m, Mapping) or not m.get("tool_calls"):
        return m
    calls = []
    for c in m["tool_calls"]:
        args = c["function"]["arguments"]
        if isinstance(args, Mapping):
            args = {
                k: v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
                for k, v in args.items()
            }
        calls.append(dict(c, function=dict(c["function"], arguments=args)))
    return dict(m, tool_calls=calls)


def _value(text: str, schema) -> object:
    """A parameter's text -> its value: as it is for a string parameter, else JSON (text that
    is no JSON stays a string)."""
    if written_as_text(schema):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def _tag(s: str, j: int, tag: str) -> int | None:
    """s[j:] opens `tag`NAME> -> index of NAME; None: the text ends inside the tag's start;
    NotACall when it is not the tag."""
    rest = s[j : j + len(tag)]
    if rest == tag:
        return j + len(tag)
    if tag.startswith(rest):
        return None
    raise NotACall


FORMAT = QwenXML()
