"""Mistral: ``[TOOL_CALLS][{"name": f, "arguments": {...}}, ...]``, every call of the reply in
one JSON list (templates with ``[TOOL_CALLS]``).  A call may carry the 9-character id the
templates want (``"id": "a1B2c3D4e"``)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from goinfer.chat.formats.base import ToolFormat
from goinfer.chat.grammar import call_schema
from goinfer.chat.jsonscan import NotACall, Region, scan_call, skip_ws
from goinfer.chat.spec import new_call_id

_ID = re.compile(r"[A-Za-z0-9]{9}")


class Mistral(ToolFormat):
    name = "mistral"
    open = "[TOOL_CALLS]"

    def detect(self, template: str) -> bool:
        return "[TOOL_CALLS]" in template

    def call_rules(self, tools, many: bool, tokenizer) -> tuple[list[str], str, str]:
        schema = call_schema(tools, "arguments", array=True, many=many, with_id=True)
        return ["body: %json " + json.dumps(schema)], "body", ""

    def scan(self, s: str, j: int, final: bool, schemas: Mapping) -> Region:
        """The list of calls (a single object without the list is read too)."""
        r = Region()
        if j >= len(s):
            return r
        if s[j] == "{":
            c = scan_call(s, j, self.args_keys)
            r.calls.append(c)
            r.end = c.end
            return r
        if s[j] != "[":
            raise NotACall
        j = skip_ws(s, j + 1)
        while True:
            c = scan_call(s, j, self.args_keys)
            r.calls.append(c)
            if c.end is None:
                return r
            j = skip_ws(s, c.end)
            if j >= len(s):
                return r
            if s[j] == "]":
                r.end = j + 1
                return r
            if s[j] != ",":
                raise NotACall
            j = skip_ws(s, j + 1)

    def new_id(self) -> str:
        """Mistral's templates want exactly 9 letters and digits."""
        return new_call_id(9, prefix="")

    def call_id(self, written: str | None) -> str:
        return written if written and _ID.fullmatch(written) else self.new_id()


FORMAT = Mistral()
