"""The chat layer: messages in, messages out, above the token-level Session.

A chat request goes through four steps:

1. **check** -- ``tools``, ``tool_choice`` and ``parallel_tool_calls`` are validated
   (spec.py: ``check_tools``); bad input raises ToolError naming the offending ``param``,
   and every tool's parameter schema must compile to a grammar before any token is
   generated.
2. **render** -- the model's own chat template renders the conversation, and the tools and
   tool history in the model's call format (formats/: one module per format, chosen from the
   template); a model whose template has no format goinfer reads gets the generic format,
   taught by a built-in tool prompt.
3. **constrain** -- the format writes the Lark grammar (llguidance) of the reply: "required"
   and a named function are constrained from the first token, so even a 135M model returns a
   call whose arguments validate against the tool's schema; "auto" leaves the text free until
   the format's opening marker, then constrains the call; "none" forbids the marker.
   ``parallel_tool_calls`` chooses one call or one-or-more.  A reasoning model may think
   first (channels.py).
4. **parse** -- the reply is read back into content, reasoning and OpenAI ``tool_calls``,
   incrementally for streaming (parser.py, channels.py) or at once.  Call text that does not
   parse stays in the content; nothing is dropped.

request.py ties the steps of one request together (``prepare_chat`` -> ``ToolChat``), and
session.py gives ``ChatSession.chat``.  Modules: spec (tools, checks), jsonscan (the JSON
call scanner), grammar (Lark pieces), formats/ (the call formats and their registry), parser
(calls out of a reply), channels (reasoning apart from the answer), request, session.
"""

from __future__ import annotations

from goinfer.chat.channels import Channels, Reasoning, ReplyParser, channels_of
from goinfer.chat.formats import (
    FORMATS,
    GEMMA4,
    GENERIC,
    HARMONY,
    HERMES,
    LLAMA3,
    MISTRAL,
    QWEN_XML,
    ToolFormat,
    format_of,
    tool_format,
)
from goinfer.chat.formats.generic import tool_prompt
from goinfer.chat.parser import CallParser, parse_reply
from goinfer.chat.request import ToolChat, chat_inputs, prepare_chat, tool_grammar
from goinfer.chat.session import ChatSession
from goinfer.chat.spec import Tool, ToolCallDelta, ToolSpec, check_tools

__all__ = [
    "ChatSession",
    "Tool",
    "ToolSpec",
    "ToolCallDelta",
    "check_tools",
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
    "tool_prompt",
    "chat_inputs",
    "tool_grammar",
    "CallParser",
    "parse_reply",
    "ToolChat",
    "prepare_chat",
    "Channels",
    "Reasoning",
    "ReplyParser",
    "channels_of",
]
