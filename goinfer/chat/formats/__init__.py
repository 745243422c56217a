"""Tool-call formats: one module per way a model family writes calls, one registry.

A model's format is chosen from its chat template (``format_of``): the first format of
FORMATS whose ``detect`` accepts the template (a format that ``needs_tool_rendering`` only if
the template renders the tools it is given); any other template gets the generic format,
taught by goinfer's own tool prompt.  Adding a format: a module with a ToolFormat subclass
(goinfer/chat/formats/base.py) and its line in FORMATS below.
"""

from __future__ import annotations

import functools

from goinfer.chat.formats import gemma4, generic, harmony, hermes, llama3, mistral, qwen_xml
from goinfer.chat.formats.base import ToolFormat
from goinfer.chat.spec import NO_PARAMS
from goinfer.chat_template import render_chat_template
from goinfer.errors import ChatTemplateError

__all__ = [
    "ToolFormat",
    "FORMATS",
    "HERMES",
    "LLAMA3",
    "MISTRAL",
    "QWEN_XML",
    "GEMMA4",
    "HARMONY",
    "GENERIC",
    "format_of",
    "tool_format",
]

# detection order: the first format that recognizes a template is the model's
FORMATS: tuple[ToolFormat, ...] = (
    harmony.FORMAT,  # gpt-oss: its calls are messages of the reply (goinfer/chat/channels.py)
    gemma4.FORMAT,  # <|tool_call>call:f{...}<tool_call|>
    qwen_xml.FORMAT,  # <tool_call><function=f>...  (Qwen3.5, Qwen3-Coder)
    hermes.FORMAT,  # <tool_call>{json}</tool_call>  (Qwen 2.5 / 3, Hermes)
    mistral.FORMAT,  # [TOOL_CALLS][{json}, ...]
    llama3.FORMAT,  # {"name": f, "parameters": {...}}  (Llama 3.x)
)
GENERIC: ToolFormat = generic.FORMAT  # any other template

HERMES, LLAMA3, MISTRAL = hermes.FORMAT, llama3.FORMAT, mistral.FORMAT
QWEN_XML, GEMMA4, HARMONY = qwen_xml.FORMAT, gemma4.FORMAT, harmony.FORMAT

_PROBE = "goinfer_probe_tool"


def tool_format(model) -> ToolFormat:
    """The call format of `model`, from its chat template (none: the generic format)."""
    return format_of(getattr(model, "chat_template", None) or "")


@functools.lru_cache(maxsize=32)
def format_of(template: str) -> ToolFormat:
    """The call format of a chat template."""
    renders: bool | None = None  # does the template render tools?  (asked once, if needed)
    for fmt in FORMATS:
        if fmt.needs_tool_rendering:
            if renders is None:
                renders = bool(template) and _renders_tools(template)
            if not renders:
                continue
        if fmt.detect(template):
            return fmt
    return GENERIC  # renders tools in a format we cannot parse, or none: ours


def _renders_tools(template: str) -> bool:
    """Does the template show the tools it is given?  (Rendered with a probe tool.)"""
    probe = [
        {
            "type": "function",
            "function": {"name": _PROBE, "description": "probe", "parameters": dict(NO_PARAMS)},
        }
    ]
    try:
        out = render_chat_template(template, [{"role": "user", "content": "hi"}], tools=probe)
    except ChatTemplateError:
        return False
    return _PROBE in out
