"""System messages inside a conversation, rendered where they stand.

Agents insert system messages between turns (Claude Code sends its environment block as a
system message after the first user prompt, and "the date has changed" after a later one).
Chat templates treat such a message in one of three ways: in place, as a turn of its own
(ChatML, Llama 3, Qwen); moved (Gemma's template keeps the text for the next user turn, so a
request that ends with one renders nothing of it); or refused (templates that check roles).

``in_place(messages, template)`` keeps the text where it stands for every template: one that
renders a probe conversation's system message in place gets the messages as they are; any
other gets each system message after the first turn folded into the user turn before it (a
blank line between), or made a user turn of its own when no user turn comes right before it.
Either way, the rendering of a conversation up to a reply stays a prefix of the rendering of
the conversation that goes on from it, so the prefix cache keeps it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from goinfer.chat.formats.base import message_text
from goinfer.chat_template import render_chat_template
from goinfer.errors import ChatTemplateError

__all__ = ["in_place", "renders_system_in_place"]

_PROBE = (
    "goinfer-probe-0",
    "goinfer-probe-1",
    "goinfer-probe-2",
    "goinfer-probe-3",
    "goinfer-probe-4",
)


@functools.lru_cache(maxsize=32)
def renders_system_in_place(template: str) -> bool:
    """Does the template render a system message that follows a user turn right there, before
    the next assistant turn?  (Rendered with a probe conversation.)"""
    roles = ("system", "user", "system", "assistant", "user")
    probe = [{"role": r, "content": t} for r, t in zip(roles, _PROBE)]
    try:
        out = render_chat_template(template, probe, add_generation_prompt=True)
    except ChatTemplateError:
        return False
    at = [out.find(t) for t in _PROBE]
    return all(i >= 0 for i in at) and at == sorted(at)


def in_place(messages: list, template: str) -> list:
    """messages with every system message after the first non-system one rendered where it
    stands (see the module's docstring); leading system messages are the system prompt."""
    if not any(_is_system(m) for m in _after_prompt(messages)) or renders_system_in_place(template):
        return messages
    out: list = []
    begun = False  # a non-system message was seen: system messages from here are folded
    for m in messages:
        if not _is_system(m):
            begun = True
            out.append(m)
            continue
        if not begun:
            out.append(m)
            continue
        text = message_text(m.get("content"))
        prev = out[-1] if out else None
        if isinstance(prev, Mapping) and prev.get("role") == "user" and not prev.get("tool_calls"):
            out[-1] = dict(prev, content=f"{message_text(prev.get('content'))}\n\n{text}")
        else:
            out.append({"role": "user", "content": text})
    return out


def _is_system(m) -> bool:
    return isinstance(m, Mapping) and m.get("role") in ("system", "developer")


def _after_prompt(messages: list) -> list:
    """The messages after the leading system messages."""
    i = 0
    while i < len(messages) and _is_system(messages[i]):
        i += 1
    return messages[i:]
