"""What every API route hands the runner, and what it gets back.

A route translates its wire body into one ``Request`` (messages in the chat layer's form, or a
raw prompt), the runner (runner.py) turns it into a stream of ``Event``\\ s, and the route
translates those into its wire shape.  Nothing here knows any API's field names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from goinfer.chat.spec import ToolCallDelta
from goinfer.generation import GenerationResult
from goinfer.server.errors import APIError

__all__ = [
    "Request",
    "TextDelta",
    "ReasoningDelta",
    "ToolCallDelta",
    "Done",
    "Failed",
    "Ping",
    "Event",
]


@dataclass
class Request:
    """One generation request, whatever API it came through."""

    kind: str  # "chat": messages through the chat template | "completion": a raw prompt
    # chat: the conversation as the chat layer takes it (OpenAI-shaped dicts: role, content
    # text, tool_calls, tool_call_id, reasoning_content)
    messages: list[dict] = field(default_factory=list)
    prompt: str | list[int] | None = None  # completion: text (BOS added) or token ids
    # completion: a batch of prompts (each a str or token ids), answered in order; prompt is
    # then the first of them.  None: the one prompt
    prompts: list | None = None
    n: int = 1  # choices per prompt (each forks the prompt's session once it is computed)
    prompt_param: str = "messages"  # the wire field errors about the prompt name
    tools: list | None = None  # OpenAI's function tools (goinfer/chat/spec.py checks them)
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict | None = None  # OpenAI's shape, compiled by the runner
    grammar: str | dict | None = None  # goinfer's extension: Lark, {"regex": ...}
    sampling: dict = field(default_factory=dict)  # keyword arguments of SamplingParams
    # the sampling fields the request itself set; the others take the model's own defaults
    # where its source has them (an Ollama params layer).  None: every field was set
    sampling_given: frozenset[str] | None = None
    stops: list[str] = field(default_factory=list)
    max_tokens: int | None = None  # None: up to the context
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    template_kwargs: dict = field(default_factory=dict)  # chat template variables (thinking)
    cache_salt: str | None = None
    draft: bool | None = None  # speculative drafting on / off (None: the server's default)
    draft_tokens: int | None = None  # tokens per draft (None: the server's)
    # the conversation this request continues (OpenAI's prompt_cache_key, a client's session
    # id): the replica affinity of its KV cache under --replicas, and a label of /metrics
    cache_key: str | None = None
    # the route's own options for shaping its reply (the runner does not read them)
    options: Any = None
    # ---- Anthropic's Messages API (anthropic_messages.py)
    # names of tools the reply may call that the prompt's tool list leaves out (deferred tools,
    # shown where the conversation loads them)
    unlisted_tools: frozenset[str] = frozenset()
    # system messages after the first turn rendered where they stand (goinfer/chat/system.py)
    system_in_place: bool = False
    # max_tokens is a ceiling: cut to what the context leaves after the prompt (None: the
    # prompt and max_tokens must fit the context, as OpenAI's API)
    fit_max_tokens: bool = False

    @property
    def n_choices(self) -> int:
        """Choices in the reply: n per prompt (choice p * n + i: prompt p's i-th)."""
        return self.n * (len(self.prompts) if self.prompts else 1)


# ============================================================================ events


# Every event but Failed and Ping belongs to one choice (``choice``: 0 unless the request
# asked for several, Request.n_choices); a stream of several choices interleaves them and ends
# after the Done of each.


@dataclass
class TextDelta:
    """A piece of the answer (completions: of the text), with the logprobs entries of the
    tokens taken since the last event (None: not asked for, or none with a parsed reply)."""

    text: str
    logprobs: list[dict] | None = None
    choice: int = 0


@dataclass
class ReasoningDelta:
    """A piece of a reasoning model's thinking."""

    text: str
    logprobs: list[dict] | None = None
    choice: int = 0


# ToolCallDelta (goinfer/chat/spec.py): a piece of a tool call (the first with its id and
# name; .index is the call's place in the message), its logprobs entries in .logprobs, its
# choice in .choice


@dataclass
class Done:
    """A choice's generation ended: the whole result (text, content, reasoning_content,
    tool_calls, finish_reason, usage counts, timings) and the logprobs entries no event
    carried yet."""

    result: GenerationResult
    logprobs: list[dict] | None = None
    choice: int = 0


@dataclass
class Failed:
    """The generation failed after it was accepted (the stream is already open)."""

    error: APIError


@dataclass
class Ping:
    """Nothing else came for a while (a long prefill): keeps the connection alive."""


Event = TextDelta | ReasoningDelta | ToolCallDelta | Done | Failed | Ping
