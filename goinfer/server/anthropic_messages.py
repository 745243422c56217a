"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API.

Body -> Request (anthropic_request.py); the whole result -> a ``message`` with content blocks
(``thinking``, ``text``, ``tool_use``), ``stop_reason`` and ``usage``; events -> Anthropic's
server-sent events: ``message_start``, then per block ``content_block_start``,
``content_block_delta`` (``thinking_delta``, ``text_delta``, ``input_json_delta``) and
``content_block_stop``, then ``message_delta`` (stop reason, usage) and ``message_stop``;
``ping`` while a long prompt is prefilled; an error after the stream began is an ``error``
event.  Errors are ``{"type": "error", "error": {"type", "message"}}``.

Usage: ``input_tokens`` are the prompt tokens computed for this request, and
``cache_read_input_tokens`` those taken from goinfer's prefix cache (their sum is the prompt);
``cache_creation_input_tokens`` is 0: goinfer keeps every prompt token it computes in the
cache at no extra cost.
"""

from __future__ import annotations

import json

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from goinfer.chat.spec import ToolCallDelta
from goinfer.errors import ContextLengthError
from goinfer.server.anthropic_request import parse_body, sign
from goinfer.server.errors import APIError
from goinfer.server.request import Done, Failed, Ping, ReasoningDelta, Request, TextDelta
from goinfer.server.route import ApiRoute, ReplyInfo, Served, authorize, read_json, sse
from goinfer.server.runner import prompt_ids

__all__ = ["Messages", "CountTokens", "ROUTE", "COUNT_ROUTE", "stop_reason", "usage"]

STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens"}
# the kinds of goinfer's errors (errors.py: OpenAI's names) as Anthropic names them
ERROR_TYPES = {
    "invalid_request_error": "invalid_request_error",
    "authentication_error": "authentication_error",
    "permission_error": "permission_error",
    "not_found_error": "not_found_error",
    "rate_limit_error": "rate_limit_error",
    "server_error": "api_error",
}


def stop_reason(result) -> str:
    if result.finish_reason == "stop" and result.stop_sequence is not None:
        return "stop_sequence"
    return STOP_REASONS.get(result.finish_reason, "end_turn")


def usage(result) -> dict:
    return {
        "input_tokens": result.prompt_tokens - result.cached_tokens,
        "output_tokens": result.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": result.cached_tokens,
    }


def _input(arguments: str) -> dict:
    """A call's arguments text -> its input object ({} for a call cut short by max_tokens)."""
    try:
        v = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return v if isinstance(v, dict) else {}


class _AnthropicErrors:
    """Errors in Anthropic's shape."""

    def error_body(self, e: APIError) -> dict:
        kind = ERROR_TYPES.get(e.type, "api_error")
        if e.status == 503:
            kind = "overloaded_error"
        elif e.status == 413:
            kind = "request_too_large"
        message = e.message
        if (
            isinstance(e.cause, ContextLengthError)
            and e.code == "context_length_exceeded"
            and e.cause.tokens is not None
            and e.cause.limit is not None
        ):
            # Claude Code reads this wording, compacts its history and tries again; the prompt
            # may hold limit - 1 tokens (the reply needs one)
            message = (
                f"prompt is too long: {e.cause.tokens} tokens > {e.cause.limit - 1} "
                f"maximum ({e.message})"
            )
        return {"type": "error", "error": {"type": kind, "message": message}}

    def stream_error(self, e: APIError) -> bytes:
        return sse(self.error_body(e), event="error")


class Messages(_AnthropicErrors, ApiRoute):
    path = "/v1/messages"
    id_prefix = "msg_"

    def parse(self, body, vocab_size: int) -> Request:
        return parse_body(body, vocab_size)

    # ------------------------------------------------------------------ whole reply

    def reply(self, result, req: Request, info: ReplyInfo) -> dict:
        content: list[dict] = []
        if result.reasoning_content:
            content.append(self._thinking_block(result.reasoning_content, req))
        if result.content or not result.tool_calls:
            content.append({"type": "text", "text": result.content or ""})
        for c in result.tool_calls or []:
            content.append(
                {
                    "type": "tool_use",
                    "id": c["id"],
                    "name": c["function"]["name"],
                    "input": _input(c["function"]["arguments"]),
                }
            )
        return {
            "id": info.id,
            "type": "message",
            "role": "assistant",
            "model": info.model_id,
            "content": content,
            "stop_reason": stop_reason(result),
            "stop_sequence": result.stop_sequence,
            "usage": usage(result),
        }

    @staticmethod
    def _thinking_block(text: str, req: Request) -> dict:
        shown = "" if req.options.display != "summarized" else text
        return {"type": "thinking", "thinking": shown, "signature": sign(text)}

    # ------------------------------------------------------------------ stream

    async def stream(self, events, req: Request, info: ReplyInfo):
        start = {
            "id": info.id,
            "type": "message",
            "role": "assistant",
            "model": info.model_id,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            # the prompt's size; how much of it came from the cache is known once it is
            # seated: message_delta's usage has the split
            "usage": {
                "input_tokens": info.prompt_tokens,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        }
        yield sse({"type": "message_start", "message": start}, event="message_start")
        blocks = _Blocks(req.options.display)
        async for ev in events:
            if isinstance(ev, Ping):
                yield sse({"type": "ping"}, event="ping")
            elif isinstance(ev, ReasoningDelta):
                for x in blocks.thinking(ev.text):
                    yield x
            elif isinstance(ev, TextDelta):
                for x in blocks.text(ev.text):
                    yield x
            elif isinstance(ev, ToolCallDelta):
                for x in blocks.call(ev):
                    yield x
            elif isinstance(ev, Done):
                for x in blocks.end():
                    yield x
                r = ev.result
                yield sse(
                    {
                        "type": "message_delta",
                        "delta": {"stop_reason": stop_reason(r), "stop_sequence": r.stop_sequence},
                        "usage": usage(r),
                    },
                    event="message_delta",
                )
                yield sse({"type": "message_stop"}, event="message_stop")
            elif isinstance(ev, Failed):
                yield self.stream_error(ev.error)


class _Blocks:
    """The content blocks of a streamed reply: which one is open, their events."""

    def __init__(self, display: str):
        self.display = display
        self.n = 0  # blocks started
        self.kind: str | None = None  # the open block's type
        self.thought = ""  # the open thinking block's text (its signature)

    def _open(self, block: dict):
        yield from self._close()
        self.kind = block["type"]
        yield sse(
            {"type": "content_block_start", "index": self.n, "content_block": block},
            event="content_block_start",
        )

    def _close(self):
        if self.kind is None:
            return
        if self.kind == "thinking":
            yield self._delta({"type": "signature_delta", "signature": sign(self.thought)})
            self.thought = ""
        yield sse({"type": "content_block_stop", "index": self.n}, event="content_block_stop")
        self.kind = None
        self.n += 1

    def _delta(self, delta: dict) -> bytes:
        return sse(
            {"type": "content_block_delta", "index": self.n, "delta": delta},
            event="content_block_delta",
        )

    def thinking(self, text: str):
        if self.kind != "thinking":
            yield from self._open({"type": "thinking", "thinking": "", "signature": ""})
        self.thought += text
        if text and self.display == "summarized":
            yield self._delta({"type": "thinking_delta", "thinking": text})

    def text(self, text: str):
        if not text:
            return
        if self.kind != "text":
            yield from self._open({"type": "text", "text": ""})
        yield self._delta({"type": "text_delta", "text": text})

    def call(self, d: ToolCallDelta):
        if d.id is not None:
            yield from self._open({"type": "tool_use", "id": d.id, "name": d.name, "input": {}})
        if d.arguments:
            yield self._delta({"type": "input_json_delta", "partial_json": d.arguments})

    def end(self):
        """Close the open block; a reply without any gets an empty text block (clients such
        as Claude Code need one)."""
        if self.n == 0 and self.kind is None:
            yield from self._open({"type": "text", "text": ""})
        yield from self._close()


# ============================================================================ count_tokens


class CountTokens(_AnthropicErrors, ApiRoute):
    """POST /v1/messages/count_tokens: the prompt's tokens, as /v1/messages would render it."""

    path = "/v1/messages/count_tokens"

    def parse(self, body, vocab_size: int) -> Request:
        return parse_body(body, vocab_size, counting=True)

    async def handle(self, request: HTTPRequest, srv: Served) -> Response:
        authorize(request.headers, srv.api_key)
        body = await read_json(request, srv.max_body)
        req = self.parse(body, srv.runner.model.vocab_size)
        ids, _ = await run_in_threadpool(prompt_ids, srv.runner.model, req)
        srv.counts.add(self.path, 200)
        return JSONResponse({"input_tokens": len(ids)})


ROUTE = Messages()
COUNT_ROUTE = CountTokens()
