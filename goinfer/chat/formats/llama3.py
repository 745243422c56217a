"""Llama 3: ``{"name": f, "parameters": {...}}`` opening the reply, or after ``<|python_tag|>``;
several joined by ``; `` (Llama 3.x templates)."""

from __future__ import annotations

import json
from collections.abc import Mapping

from goinfer.chat.formats.base import ToolFormat
from goinfer.chat.grammar import ANY_TEXT, call_schema, special
from goinfer.chat.jsonscan import Region, scan_call, skip_ws
from goinfer.chat.spec import ToolSpec


class Llama3(ToolFormat):
    name = "llama3"
    open = "<|python_tag|>"
    args_key = "parameters"
    opens_with_json = True

    def detect(self, template: str) -> bool:
        return "<|python_tag|>" in template or (
            "<|start_header_id|>" in template and '"parameters"' in template
        )

    def grammar(self, spec: ToolSpec, tokenizer) -> str:
        if spec.choice == "none":
            return self.no_calls(tokenizer)
        many, forced = spec.many, spec.forced
        rules = ["body: %json " + json.dumps(call_schema(spec.callable, self.args_key))]
        calls = 'body (";" " "? body)*' if many else "body"
        if forced:
            start = calls
        else:
            # A reply that opens with "{" is a call; any other reply is free text.
            rules.append(r"TEXT: /(?s:([^{].*)?)/")
            start = f"TEXT | {calls}"
            tag = special(tokenizer, self.open)
            if tag is not None:
                start += f" | <[{tag}]> {calls}"
        rules.insert(0, f"start: {start}")
        return "\n".join(rules) + "\n"

    def no_calls(self, tokenizer) -> str:
        return "start: TEXT\n" + ANY_TEXT + "\n"

    def scan(self, s: str, j: int, final: bool, schemas: Mapping) -> Region:
        """Call objects joined by ";" (the region ends after the last one)."""
        r = Region()
        while True:
            c = scan_call(s, j, self.args_keys)
            r.calls.append(c)
            if c.end is None:
                return r
            k = skip_ws(s, c.end)
            if k >= len(s):
                if final:
                    r.end = c.end
                return r
            if s[k] != ";":
                r.end = c.end
                return r
            j = skip_ws(s, k + 1)


FORMAT = Llama3()
