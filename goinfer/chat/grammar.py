"""Pieces of the Lark grammars (llguidance) that hold a reply to a call format.

A marker the model's vocabulary has as one control token is written ``<[id]>`` (it can only be
that token); any other marker is text.  JSON embedded with ``%json`` is laid out as json.dumps
writes it (and as chat templates show calls): ", " and ": " separators and no other
whitespace, so a small model cannot wander off into runs of blank space, and the call it
writes is the text the next turn's prompt repeats.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping

from goinfer.constrained import VALUE_KEYS, enforced_schema
from goinfer.errors import TokenizerError

__all__ = [
    "JSON_LAYOUT",
    "ANY_TEXT",
    "text_without",
    "regex",
    "special",
    "marker",
    "call_schema",
    "written_as_text",
    "json_rule",
    "tool_parameters",
]

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_TEXT = r"TEXT: /(?s:.*)/"  # any text (a special marker never appears in text)


def text_without(marker: str) -> str:
    """The TEXT rule: any text that does not hold `marker` (written as text)."""
    return f"TEXT: /(?s:.*)/ & ~/(?s:.*){regex(marker)}(?s:.*)/"


def regex(text: str) -> str:
    return re.escape(text).replace("/", "\\/")


def special(tokenizer, text: str) -> int | None:
    """The id of `text` when the model's vocabulary has it as one control token (special in
    constrained.TokenView too; asked of the tokenizer, so rendering a prompt, as the Ray
    ingress does to route it, builds no token view)."""
    if tokenizer is None:
        return None
    try:
        i = tokenizer.token_to_id(text)
    except (TokenizerError, KeyError):
        return None
    return i if tokenizer.is_control(i) else None


def marker(tokenizer, text: str) -> str:
    """The Lark of a marker: its control token, or its text."""
    i = special(tokenizer, text)
    return f"<[{i}]>" if i is not None else json.dumps(text)


def tool_parameters(tool) -> dict:
    """A tool's parameter schema as grammars hold it: objects closed, numbers bounded to what
    every JSON reader keeps exact (constrained.enforced_schema)."""
    return enforced_schema(tool.parameters)


def json_rule(name: str, schema: Mapping) -> str:
    """A rule holding a JSON value to `schema`, laid out as JSON_LAYOUT."""
    schema = dict(schema)
    schema["x-guidance"] = dict(JSON_LAYOUT)
    return f"{name}: %json " + json.dumps(schema)


def call_schema(
    tools, args_key: str, *, array: bool = False, many: bool = True, with_id: bool = False
) -> dict:
    """JSON schema of one call object (or, array=True, of a list of calls) to any of `tools`.
    Each tool's parameters go under $defs, their own "#..." references rebased there.
    with_id: the call may carry Mistral's 9-character "id" after its arguments."""
    defs, alts = {}, []
    for i, t in enumerate(tools):
        key = f"goinfer_tool_{i}"
        defs[key] = _rebase(tool_parameters(t), f"#/$defs/{key}")
        props = {"name": {"const": t.name}, args_key: {"$ref": f"#/$defs/{key}"}}
        if with_id:
            props["id"] = {"type": "string", "pattern": "^[A-Za-z0-9]{9}$"}
        alts.append(
            {
                "type": "object",
                "properties": props,
                "required": ["name", args_key],
                "additionalProperties": False,
            }
        )
    one = alts[0] if len(alts) == 1 else {"anyOf": alts}
    if array:
        schema = {"type": "array", "items": one, "minItems": 1}
        if not many:
            schema["maxItems"] = 1
    else:
        schema = dict(one)
    schema["$defs"] = defs
    schema["x-guidance"] = dict(JSON_LAYOUT)
    return schema


def _rebase(schema, base: str):
    """Copy of `schema` with every local "$ref" ("#...") moved under `base`."""
    if isinstance(schema, list):
        return [_rebase(x, base) for x in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {}
    for k, v in schema.items():
        if k == "$ref" and isinstance(v, str) and v.startswith("#"):
            out[k] = base + v[1:]
        elif k in VALUE_KEYS:
            out[k] = copy.deepcopy(v)
        else:
            out[k] = _rebase(v, base)
    return out


def written_as_text(schema) -> bool:
    """Is a parameter written as its text rather than as JSON (qwen_xml, gemma4): a string
    schema whose enum or const, if any, are all strings?  Its other string rules (pattern,
    lengths) are not held."""
    if not isinstance(schema, Mapping) or schema.get("type") != "string":
        return False
    words = schema.get("enum", [schema["const"]] if "const" in schema else [])
    return all(isinstance(w, str) for w in words)
