"""Hermes: ``<tool_call>\\n{"name": f, "arguments": {...}}\\n</tool_call>``, one block per call
(templates with ``<tool_call>``: Qwen 2.5 / 3, Hermes).  Every rule is ToolFormat's default."""

from __future__ import annotations

from goinfer.chat.formats.base import ToolFormat


class Hermes(ToolFormat):
    name = "hermes"
    open, close = "<tool_call>", "</tool_call>"

    def detect(self, template: str) -> bool:
        return "<tool_call>" in template


FORMAT = Hermes()
