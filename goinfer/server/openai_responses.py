"""POST /v1/responses: OpenAI's Responses API (Codex, the OpenAI Agents SDK).

Body -> Request: ``instructions`` and the ``input`` items as chat messages, ``tools`` as
function tools (goinfer/server/responses_input.py), ``text.format`` as the response_format,
``reasoning.effort`` as the chat template's reasoning variables.  The whole result -> a
``response`` object with output items (``reasoning``, ``message``, ``function_call``,
``custom_tool_call``, ``tool_search_call``); events -> the typed server-sent events of the
Responses API, each with its ``sequence_number``: ``response.created``,
``response.in_progress``, per item ``response.output_item.added``, its content events
(``response.content_part.added``, ``response.output_text.delta`` / ``.done``,
``response.reasoning_text.delta`` / ``.done``, ``response.function_call_arguments.delta`` /
``.done``, ...) and ``response.output_item.done``, then ``response.completed`` (or
``response.incomplete`` with the reason, or ``response.failed``).

``store`` (default true, as OpenAI) keeps the response in the server's bounded store
(responses_store.py): ``previous_response_id`` continues its conversation, and
GET / DELETE /v1/responses/{id} and GET /v1/responses/{id}/input_items serve it.
"""

from __future__ import annotations

import re
import uuid

from fastapi.responses import JSONResponse

from goinfer import logprobs as lp
from goinfer.chat.spec import ToolCallDelta, check_tools
from goinfer.errors import ToolError
from goinfer.server import fields as F
from goinfer.server.errors import APIError, bad
from goinfer.server.openai import common_request, timings
from goinfer.server.openai_chat import _template_kwargs
from goinfer.server.request import Done, Failed, Ping, ReasoningDelta, Request, TextDelta
from goinfer.server.responses_input import (
    ToolMap,
    conversation,
    translate_choice,
    translate_tools,
)
from goinfer.server.responses_output import (
    EventWriter,
    Options,
    _new_item_id,
    _status,
    output_items,
    usage,
)
from goinfer.server.responses_store import ResponseStore, Stored
from goinfer.server.route import SSE_PING, ApiRoute, ReplyInfo, Served, authorize, sse

__all__ = ["Responses", "ROUTE", "RESPONSES_FIELDS"]

RESPONSES_FIELDS = {
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "max_tool_calls",
    "temperature",
    "top_p",
    "top_logprobs",
    "text",
    "reasoning",
    "store",
    "previous_response_id",
    "include",
    "metadata",
    "stream",
    "stream_options",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "service_tier",
    "truncation",
    "user",
    "background",
    "conversation",
    "prompt",
    "client_metadata",
    # goinfer's extensions, as in Chat Completions
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "repeat_last_n",
    "logit_bias",
    "cache_salt",
    "draft",
    "draft_tokens",
    "chat_template_kwargs",
}
INCLUDES = {
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
    "web_search_call.action.sources",
    "web_search_call.results",
    "file_search_call.results",
    "code_interpreter_call.outputs",
    "computer_call_output.output.image_url",
    "message.input_image.image_url",
}
# reasoning.effort -> chat template variables (gpt-oss reads reasoning_effort, Qwen3 and
# others enable_thinking)
EFFORTS = {
    "none": {"enable_thinking": False},
    "minimal": {"reasoning_effort": "low"},
    "low": {"reasoning_effort": "low"},
    "medium": {"reasoning_effort": "medium"},
    "high": {"reasoning_effort": "high"},
    "xhigh": {"reasoning_effort": "high"},
}
SUMMARIES = ("auto", "concise", "detailed")
_FORMAT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_ID = re.compile(r"resp_(?:([0-9a-f]{8})_)?[0-9a-f]{32}")


def _tag_of(rid) -> str | None:
    m = _ID.fullmatch(rid) if isinstance(rid, str) else None
    return m.group(1) if m else None


class Responses(ApiRoute):
    path = "/v1/responses"
    id_prefix = "resp_"

    # ------------------------------------------------------------------ request

    def parse(self, body: dict, vocab_size: int) -> Request:
        req = common_request(body, "chat", RESPONSES_FIELDS, vocab_size)
        req.prompt_param = "input"
        for k, what in (
            ("background", "background responses"),
            ("conversation", "conversations (use previous_response_id)"),
            ("prompt", "prompt templates"),
        ):
            if body.get(k) not in (None, False):
                raise bad(f"{what} are not supported", k, "unsupported_value")
        req.max_tokens = F.integer(body, "max_output_tokens", 1, None, None)
        tools = translate_tools(body.get("tools"))
        instructions = F.string(body, "instructions", max_len=1 << 24)
        inp = body.get("input")
        prev = F.string(body, "previous_response_id")
        if inp is None and prev is None:
            raise bad("'input' is required", "input", "invalid_value")
        messages = conversation(inp if inp is not None else [], tools)
        req.messages = (
            [{"role": "system", "content": instructions}] if instructions else []
        ) + messages
        self._tools(req, body, tools)
        req.response_format = _text_format(body.get("text"))
        include = body.get("include") or []
        if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
            raise bad("'include' must be a list of strings", "include", "invalid_type")
        unknown = sorted(set(include) - INCLUDES)
        if unknown:
            raise bad(f"'include' has unknown values {unknown}", "include", "invalid_value")
        req.top_logprobs = F.integer(body, "top_logprobs", 0, lp.MAX_TOP_LOGPROBS, 0)
        req.logprobs = "message.output_text.logprobs" in include
        effort, summary = _reasoning(body.get("reasoning"))
        req.template_kwargs = _template_kwargs(
            {"chat_template_kwargs": body.get("chat_template_kwargs")}
        )
        for k, v in EFFORTS.get(effort, {}).items():
            req.template_kwargs.setdefault(k, v)
        req.cache_key = F.string(body, "prompt_cache_key", max_len=1024)
        for k in ("user", "safety_identifier", "service_tier", "prompt_cache_retention"):
            F.string(body, k)
        if body.get("truncation") not in (None, "auto", "disabled"):
            raise bad("'truncation' must be 'auto' or 'disabled'", "truncation", "invalid_value")
        md = body.get("metadata")
        if md is not None and not isinstance(md, dict):
            raise bad("'metadata' must be an object", "metadata", "invalid_type")
        req.options = Options(
            body=body,
            tools=tools,
            input_items=_items(inp),
            input_messages=messages,
            instructions=instructions,
            previous_response_id=prev,
            store=F.boolean(body, "store", True),
            encrypted="reasoning.encrypted_content" in include,
            summary=summary,
            logprobs=req.logprobs,
        )
        return req

    def _tools(self, req: Request, body: dict, tools: ToolMap) -> None:
        choice = translate_choice(body.get("tool_choice"), tools)
        parallel = body.get("parallel_tool_calls")
        if F.integer(body, "max_tool_calls", 1, None, None) == 1:
            parallel = False
        try:
            check_tools(tools.chat or None, choice, parallel)
        except ToolError as e:
            raise bad(str(e), tools.chat_param(e.param), "invalid_value") from None
        req.tools = tools.chat or None
        req.tool_choice = choice
        req.parallel_tool_calls = parallel

    def bind(self, req: Request, srv: Served) -> None:
        o: Options = req.options
        o.store_ref = srv.state.setdefault(self.path, ResponseStore())
        o.model = srv.runner.model
        if o.previous_response_id is None:
            return
        prev = o.store_ref.get(o.previous_response_id)
        if prev is None:
            raise _not_found(o.previous_response_id, "previous_response_id")
        o.history = prev.conversation
        head = [{"role": "system", "content": o.instructions}] if o.instructions else []
        req.messages = head + o.history + o.input_messages

    def new_id(self, srv: Served) -> str:
        tag = f"{srv.instance}_" if srv.instance else ""
        return f"resp_{tag}{uuid.uuid4().hex}"

    def pinned(self, path: str, body: dict | None) -> str | None:
        if path.startswith(self.path + "/"):
            return _tag_of(path.split("/")[3])
        if path == self.path and isinstance(body, dict):
            return _tag_of(body.get("previous_response_id"))
        return None

    # ------------------------------------------------------------------ reply

    def reply(self, result, req: Request, info: ReplyInfo) -> dict:
        o: Options = req.options
        items = output_items(result, o)
        resp = self.response(info, o, _status(result), items, result)
        self.finished(resp, req, result)
        return resp

    def response(
        self,
        info: ReplyInfo,
        o: Options,
        status: str,
        output: list[dict],
        result=None,
        error: dict | None = None,
    ) -> dict:
        """The response object (status "in_progress" without a result)."""
        b = o.body
        text = dict(b.get("text") or {})
        text.setdefault("format", {"type": "text"})
        reasoning = b.get("reasoning") or {}
        out = {
            "id": info.id,
            "object": "response",
            "created_at": info.created,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "instructions": o.instructions,
            "max_output_tokens": b.get("max_output_tokens"),
            "max_tool_calls": b.get("max_tool_calls"),
            "model": info.model_id,
            "output": output,
            "parallel_tool_calls": b.get("parallel_tool_calls", True),
            "previous_response_id": o.previous_response_id,
            "prompt_cache_key": b.get("prompt_cache_key"),
            "reasoning": {"effort": reasoning.get("effort"), "summary": o.summary},
            "safety_identifier": b.get("safety_identifier"),
            "service_tier": b.get("service_tier") or "default",
            "store": o.store,
            "temperature": b.get("temperature", 1.0),
            "text": text,
            "tool_choice": b.get("tool_choice") or "auto",
            "tools": b.get("tools") or [],
            "top_logprobs": b.get("top_logprobs", 0),
            "top_p": b.get("top_p", 1.0),
            "truncation": b.get("truncation") or "disabled",
            "usage": None,
            "user": b.get("user"),
            "metadata": b.get("metadata") or {},
        }
        if o.tools.left_out:
            out["tools_left_out"] = list(o.tools.left_out)  # goinfer's: hosted tools not run
        if result is not None:
            out["usage"] = usage(result, o)
            out["timings"] = timings(result)  # goinfer's extension, llama.cpp's object
        return out

    def finished(self, resp: dict, req: Request, result) -> None:
        """A response is complete (streamed or not): stored when the request asked for it."""
        o: Options = req.options
        if not o.store or o.store_ref is None:
            return
        conv = o.history + o.input_messages + [result.message()]
        o.store_ref.put(resp["id"], Stored(resp, o.input_items, conv))

    async def stream(self, events, req: Request, info: ReplyInfo):
        s = EventWriter(self, req, info)
        yield s.lifecycle("response.created", "in_progress")
        yield s.lifecycle("response.in_progress", "in_progress")
        async for ev in events:
            if isinstance(ev, Ping):
                yield SSE_PING
            elif isinstance(ev, TextDelta):
                yield s.text(ev.text, ev.logprobs)
            elif isinstance(ev, ReasoningDelta):
                yield s.reasoning(ev.text)
            elif isinstance(ev, ToolCallDelta):
                yield s.call(ev)
            elif isinstance(ev, Done):
                yield s.done(ev.result)
            elif isinstance(ev, Failed):
                yield s.failed(ev.error)

    def stream_error(self, e: APIError) -> bytes:
        """An open stream ends with an ``error`` event (a replica that died mid-stream)."""
        return sse(
            {
                "type": "error",
                "code": e.code,
                "message": e.message,
                "param": e.param,
                "sequence_number": 0,
            },
            event="error",
        )

    # ------------------------------------------------------------------ stored responses

    def extra_routes(self):
        base = self.path + "/{response_id}"
        return [
            ("GET", base, self.get),
            ("DELETE", base, self.delete),
            ("GET", base + "/input_items", self.input_items),
        ]

    def _stored(self, request, srv: Served, route: str):
        authorize(request.headers, srv.api_key)
        rid = request.path_params["response_id"]
        s = srv.state.get(self.path)
        found = s.get(rid) if s is not None else None
        if found is None:
            raise _not_found(rid, None)
        srv.counts.add(route, 200)
        return rid, found

    async def get(self, request, srv: Served):
        route = self.path + "/{response_id}"
        try:
            if request.query_params.get("stream") in ("true", "1"):
                raise bad(
                    "streaming a stored response again is not supported",
                    "stream",
                    "unsupported_value",
                )
            _, found = self._stored(request, srv, route)
        except APIError as e:
            return _error(e, srv, route)
        return JSONResponse(found.response)

    async def delete(self, request, srv: Served):
        route = self.path + "/{response_id}"
        try:
            rid, _ = self._stored(request, srv, route)
        except APIError as e:
            return _error(e, srv, route)
        srv.state[self.path].delete(rid)
        return JSONResponse({"id": rid, "object": "response.deleted", "deleted": True})

    async def input_items(self, request, srv: Served):
        route = self.path + "/{response_id}/input_items"
        q = request.query_params
        try:
            limit = q.get("limit", "20")
            if not limit.isdigit() or not 1 <= int(limit) <= 100:
                raise bad("'limit' must be an integer in [1, 100]", "limit", "invalid_value")
            order = q.get("order", "desc")
            if order not in ("asc", "desc"):
                raise bad("'order' must be 'asc' or 'desc'", "order", "invalid_value")
            _, found = self._stored(request, srv, route)
        except APIError as e:
            return _error(e, srv, route)
        items = found.input_items if order == "asc" else found.input_items[::-1]
        after = q.get("after")
        if after is not None:
            ids = [x.get("id") for x in items]
            items = items[ids.index(after) + 1 :] if after in ids else []
        page = items[: int(limit)]
        return JSONResponse(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(items) > len(page),
            }
        )


def _not_found(rid: str, param: str | None) -> APIError:
    return APIError(
        404,
        f"Response with id {rid!r} not found (stored responses are kept in "
        "memory by the server that answered them, the oldest evicted first)",
        type="invalid_request_error",
        param=param,
        code="response_not_found",
    )


def _error(e: APIError, srv: Served, route: str) -> JSONResponse:
    srv.counts.add(route, e.status)
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


# ============================================================================ request fields


def _text_format(text):
    """``text`` ({"format": ..., "verbosity": ...}) -> a Chat response_format (None: text)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise bad("'text' must be an object", "text", "invalid_type")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise bad(
            "'text.format' must be {'type': 'text' | 'json_object' | 'json_schema', ...}",
            "text.format",
            "invalid_value",
        )
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    name, schema = fmt.get("name"), fmt.get("schema")
    if not isinstance(name, str) or not _FORMAT_NAME.fullmatch(name):
        raise bad(
            "'text.format.name' must be 1-64 letters, digits, '_' or '-'",
            "text.format.name",
            "invalid_value",
        )
    if not isinstance(schema, dict):
        raise bad(
            "'text.format.schema' must be a JSON schema object",
            "text.format.schema",
            "invalid_type",
        )
    js = {"name": name, "schema": schema}
    if fmt.get("strict") is not None:
        js["strict"] = fmt["strict"]
    return {"type": "json_schema", "json_schema": js}


def _reasoning(r) -> tuple[str | None, str | None]:
    """``reasoning`` -> (effort, summary)."""
    if r is None:
        return None, None
    if not isinstance(r, dict):
        raise bad("'reasoning' must be an object", "reasoning", "invalid_type")
    effort = r.get("effort")
    if effort is not None and effort not in EFFORTS:
        raise bad(
            f"'reasoning.effort' must be one of {list(EFFORTS)}",
            "reasoning.effort",
            "invalid_value",
        )
    summary = r.get("summary", r.get("generate_summary"))
    if summary is not None and summary not in SUMMARIES:
        raise bad(
            f"'reasoning.summary' must be one of {list(SUMMARIES)}",
            "reasoning.summary",
            "invalid_value",
        )
    return effort, summary


def _items(inp) -> list[dict]:
    """The input as items with ids (GET .../input_items)."""
    if inp is None:
        return []
    if isinstance(inp, str):
        inp = [{"type": "message", "role": "user", "content": inp}]
    out = []
    for x in inp:
        x = dict(x)
        kind = x.setdefault("type", "message")
        if kind == "message":
            if isinstance(x.get("content"), str):
                part = "output_text" if x.get("role") == "assistant" else "input_text"
                x["content"] = [{"type": part, "text": x["content"]}]
            x.setdefault("status", "completed")
        x.setdefault("id", _new_item_id(kind))
        out.append(x)
    return out


ROUTE = Responses()
