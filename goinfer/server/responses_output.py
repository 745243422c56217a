"""The Responses API's output (goinfer/server/openai_responses.py): the response's items
(message, reasoning, function and custom tool calls), its usage, and the typed SSE events of
a streamed response in their order, with sequence numbers."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from goinfer.chat.freeform import INPUT_KEY
from goinfer.chat.spec import ToolCallDelta
from goinfer.server.errors import APIError
from goinfer.server.request import Request
from goinfer.server.responses_input import ToolMap, seal_reasoning
from goinfer.server.responses_store import ResponseStore
from goinfer.server.route import ReplyInfo, sse

ITEM_PREFIX = {
    "message": "msg_",
    "reasoning": "rs_",
    "function_call": "fc_",
    "custom_tool_call": "ctc_",
    "tool_search_call": "tsc_",
    "function_call_output": "fco_",
    "custom_tool_call_output": "ctco_",
    "tool_search_output": "tso_",
}


def _new_item_id(kind: str) -> str:
    return ITEM_PREFIX.get(kind, "item_") + uuid.uuid4().hex


@dataclass
class Options:
    """What shapes a Responses reply (Request.options), and what a stored response keeps."""

    body: dict  # the request's fields echoed in the response object
    tools: ToolMap
    input_items: list  # as sent
    input_messages: list[dict]  # the input as chat messages (instructions apart)
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    encrypted: bool = False  # include reasoning.encrypted_content
    summary: str | None = None  # reasoning.summary asked for
    logprobs: bool = False
    history: list[dict] = field(default_factory=list)  # the previous response's conversation
    store_ref: ResponseStore | None = None  # set by bind
    model: object = None  # set by bind: counts reasoning tokens


# ============================================================================ reply


def _status(result) -> str:
    return "incomplete" if result.finish_reason == "length" else "completed"


def usage(result, o: Options) -> dict:
    reasoning = 0
    if result.reasoning_content and o.model is not None:
        reasoning = len(o.model.tokenize(result.reasoning_content, False))
    return {
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": result.cached_tokens,
            "cache_write_tokens": result.prompt_tokens - result.cached_tokens,
        },
        "output_tokens": result.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": min(reasoning, result.completion_tokens)},
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


def reasoning_item(text: str, o: Options, rid: str | None = None, done: bool = True) -> dict:
    item = {
        "id": rid or _new_item_id("reasoning"),
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": text}] if o.summary and done else [],
        "content": [{"type": "reasoning_text", "text": text}] if done else [],
        "status": "completed" if done else "in_progress",
    }
    if o.encrypted and done:
        item["encrypted_content"] = seal_reasoning(text)
    return item


def message_item(text: str, status: str, logprobs=None, mid: str | None = None) -> dict:
    return {
        "id": mid or _new_item_id("message"),
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [_text_part(text, logprobs)] if status != "in_progress" else [],
    }


def _text_part(text: str, logprobs=None) -> dict:
    return {
        "type": "output_text",
        "text": text,
        "annotations": [],
        "logprobs": list(logprobs or []),
    }


def call_item(
    call_id: str, flat: str, arguments: str, o: Options, status: str, iid: str | None = None
) -> dict:
    """A call the model made, as the Responses item of its tool's kind."""
    kind, name, ns = o.tools.calls.get(flat, ("function", flat, None))
    if kind == "custom":
        try:
            text = json.loads(arguments)[INPUT_KEY] if arguments else ""
        except (ValueError, KeyError, TypeError):
            text = arguments  # cut short (max_output_tokens): the text as written
        item = {
            "id": iid or _new_item_id("custom_tool_call"),
            "type": "custom_tool_call",
            "call_id": call_id,
            "name": name,
            "input": text,
            "status": status,
        }
    elif kind == "tool_search":
        try:
            args = json.loads(arguments) if arguments else {}
        except ValueError:
            args = {}
        item = {
            "id": iid or _new_item_id("tool_search_call"),
            "type": "tool_search_call",
            "call_id": call_id,
            "execution": "client",
            "arguments": args,
            "status": status,
        }
    else:
        item = {
            "id": iid or _new_item_id("function_call"),
            "type": "function_call",
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            "status": status,
        }
    if ns:
        item["namespace"] = ns
    return item


def output_items(result, o: Options) -> list[dict]:
    """The finished generation as output items: reasoning, the message, the calls."""
    status = "incomplete" if result.finish_reason == "length" else "completed"
    out = []
    if result.reasoning_content:
        out.append(reasoning_item(result.reasoning_content, o))
    entries = result.logprobs["content"] if result.logprobs is not None else None
    if result.content or not result.tool_calls:
        out.append(message_item(result.content or "", "completed", entries))
    for c in result.tool_calls or []:
        out.append(
            call_item(c["id"], c["function"]["name"], c["function"]["arguments"], o, "completed")
        )
    if status == "incomplete":
        out[-1]["status"] = status  # the item max_output_tokens cut short
    return out


# ============================================================================ streaming


class EventWriter:
    """The runner's events -> the Responses API's typed events, one output item at a time."""

    def __init__(self, route: Any, req: Request, info: ReplyInfo):
        # route: the Responses route (openai_responses.py), whose response() and finished()
        # write the response object and store it
        self.route, self.req, self.info, self.o = route, req, info, req.options
        self.seq = 0
        self.items: list[dict] = []  # finished output items
        self.cur: dict | None = None  # the item being written: kind, id, text, ...

    def ev(self, kind: str, **fields) -> bytes:
        d = {"type": kind, **fields, "sequence_number": self.seq}
        self.seq += 1
        return sse(d, event=kind)

    def lifecycle(self, kind: str, status: str, result=None, error=None) -> bytes:
        resp = self.route.response(self.info, self.o, status, list(self.items), result, error)
        return self.ev(kind, response=resp)

    # ------------------------------------------------------------------ items

    def _open(self, kind: str, **extra) -> bytes:
        out = self._close()
        iid = _new_item_id(kind if kind != "call" else self.o.tools.item_type(extra["name"]))
        self.cur = {
            "kind": kind,
            "id": iid,
            "text": "",
            "index": len(self.items),
            "logprobs": [],
            **extra,
        }
        c, o = self.cur, self.o
        if kind == "message":
            out += self.ev(
                "response.output_item.added",
                output_index=c["index"],
                item=message_item("", "in_progress", mid=iid),
            )
            out += self.ev(
                "response.content_part.added",
                item_id=iid,
                output_index=c["index"],
                content_index=0,
                part=_text_part(""),
            )
        elif kind == "reasoning":
            out += self.ev(
                "response.output_item.added",
                output_index=c["index"],
                item=reasoning_item("", o, iid, done=False),
            )
            out += self.ev(
                "response.content_part.added",
                item_id=iid,
                output_index=c["index"],
                content_index=0,
                part={"type": "reasoning_text", "text": ""},
            )
            if o.summary:
                out += self.ev(
                    "response.reasoning_summary_part.added",
                    item_id=iid,
                    output_index=c["index"],
                    summary_index=0,
                    part={"type": "summary_text", "text": ""},
                )
        else:  # a call
            out += self.ev(
                "response.output_item.added",
                output_index=c["index"],
                item=call_item(c["call_id"], c["name"], "", o, "in_progress", iid),
            )
        return out

    def _close(self, status: str = "completed") -> bytes:
        c, o = self.cur, self.o
        if c is None:
            return b""
        self.cur = None
        iid, i, text = c["id"], c["index"], c["text"]
        out = b""
        if c["kind"] == "message":
            item = message_item(text, status, c["logprobs"] if o.logprobs else None, iid)
            part = item["content"][0]
            out += self.ev(
                "response.output_text.done",
                item_id=iid,
                output_index=i,
                content_index=0,
                text=text,
                logprobs=part["logprobs"],
            )
            out += self.ev(
                "response.content_part.done",
                item_id=iid,
                output_index=i,
                content_index=0,
                part=part,
            )
        elif c["kind"] == "reasoning":
            item = reasoning_item(text, o, iid)
            out += self.ev(
                "response.reasoning_text.done",
                item_id=iid,
                output_index=i,
                content_index=0,
                text=text,
            )
            out += self.ev(
                "response.content_part.done",
                item_id=iid,
                output_index=i,
                content_index=0,
                part={"type": "reasoning_text", "text": text},
            )
            if o.summary:
                out += self.ev(
                    "response.reasoning_summary_text.done",
                    item_id=iid,
                    output_index=i,
                    summary_index=0,
                    text=text,
                )
                out += self.ev(
                    "response.reasoning_summary_part.done",
                    item_id=iid,
                    output_index=i,
                    summary_index=0,
                    part={"type": "summary_text", "text": text},
                )
        else:
            item = call_item(c["call_id"], c["name"], text, o, status, iid)
            if item["type"] == "function_call":
                out += self.ev(
                    "response.function_call_arguments.done",
                    item_id=iid,
                    output_index=i,
                    name=item["name"],
                    arguments=text,
                )
            elif item["type"] == "custom_tool_call":
                if item["input"]:
                    out += self.ev(
                        "response.custom_tool_call_input.delta",
                        item_id=iid,
                        output_index=i,
                        delta=item["input"],
                    )
                out += self.ev(
                    "response.custom_tool_call_input.done",
                    item_id=iid,
                    output_index=i,
                    input=item["input"],
                )
        out += self.ev("response.output_item.done", output_index=i, item=item)
        self.items.append(item)
        return out

    # ------------------------------------------------------------------ events

    def text(self, piece: str, logprobs=None) -> bytes:
        out = b""
        if self.cur is None or self.cur["kind"] != "message":
            out += self._open("message")
        c = self.cur
        c["text"] += piece
        if logprobs:
            c["logprobs"] += logprobs
        return out + self.ev(
            "response.output_text.delta",
            item_id=c["id"],
            output_index=c["index"],
            content_index=0,
            delta=piece,
            logprobs=list(logprobs or []) if self.o.logprobs else [],
        )

    def reasoning(self, piece: str) -> bytes:
        out = b""
        if self.cur is None or self.cur["kind"] != "reasoning":
            out += self._open("reasoning")
        c = self.cur
        c["text"] += piece
        out += self.ev(
            "response.reasoning_text.delta",
            item_id=c["id"],
            output_index=c["index"],
            content_index=0,
            delta=piece,
        )
        if self.o.summary:
            out += self.ev(
                "response.reasoning_summary_text.delta",
                item_id=c["id"],
                output_index=c["index"],
                summary_index=0,
                delta=piece,
            )
        return out

    def call(self, d: ToolCallDelta) -> bytes:
        out = b""
        if d.id is not None:
            out += self._open("call", call_id=d.id, name=d.name)
        c = self.cur
        if c is None or c["kind"] != "call" or not d.arguments:
            return out
        c["text"] += d.arguments
        kind = self.o.tools.calls.get(c["name"], ("function",))[0]
        if kind == "function":  # custom and tool search calls are sent whole, once read
            out += self.ev(
                "response.function_call_arguments.delta",
                item_id=c["id"],
                output_index=c["index"],
                delta=d.arguments,
            )
        return out

    def done(self, result) -> bytes:
        status = _status(result)
        out = self._close(status)
        if not self.items:  # an empty reply is still a message
            out += self._open("message") + self._close(status)
        resp = self.route.response(self.info, self.o, status, list(self.items), result)
        self.route.finished(resp, self.req, result)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return out + self.ev(kind, response=resp)

    def failed(self, e: APIError) -> bytes:
        out = self._close("incomplete")
        err = {"code": e.code or "server_error", "message": e.message}
        return out + self.lifecycle("response.failed", "failed", error=err)
