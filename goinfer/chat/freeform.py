"""Free-form tools (the Responses API's ``custom`` tools): a call's input is text, not JSON
arguments, optionally held to a grammar (Lark, as llguidance reads it, or a regex).

Every call format goinfer knows writes JSON arguments, so a free-form tool is shown to the
model as a function of one string argument, ``input``; the call's input is that string.  A
regex grammar becomes the string's ``pattern``; a Lark grammar holds the string through
``lark_in_json`` (the grammar's text as it appears inside a JSON string).
"""
from __future__ import annotations

__all__ = ["INPUT_KEY", "custom_tool_function"]

INPUT_KEY = "input"


def custom_tool_function(description: str | None, fmt: dict) -> dict:
    """The function a free-form tool is shown as (a Chat tool's ``function`` object without
    its name): its description, and the grammar the input follows, if any."""
    text = description or ""
    prop: dict = {"type": "string"}
    if fmt.get("type") == "grammar":
        kind = "Lark grammar" if fmt["syntax"] == "lark" else "regular expression"
        note = f"The input is free-form text that follows this {kind}:\n{fmt['definition']}"
        text = f"{text}\n\n{note}" if text else note
        if fmt["syntax"] == "regex":  # the whole input (a JSON schema pattern is a search)
            prop["pattern"] = f"^(?:{fmt['definition']})$"
    else:
        note = "The input is free-form text."
        text = f"{text}\n\n{note}" if text else note
    return {"description": text,
            "parameters": {"type": "object", "properties": {INPUT_KEY: prop},
                           "required": [INPUT_KEY], "additionalProperties": False}}
