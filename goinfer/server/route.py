"""An API route: the thin translation between one wire format and the generic runner.

A route is an ``ApiRoute`` subclass in its own module (openai_chat.py, openai_completions.py),
listed in routes.py.  It says how its wire body becomes a Request, how the runner's result
and events become its wire reply, and how an error looks in its API:

    class MyRoute(ApiRoute):
        path = "/v1/my/route"                         # served with POST
        id_prefix = "my-"                             # of each reply's id
        def parse(self, body, vocab_size) -> Request  # the wire body (400s as APIError)
        def reply(self, result, req, info) -> dict    # the whole reply
        def reply_all(self, results, req, info)       # several choices (OpenAI's n), if any
        async def stream(self, events, req, info)     # yields the streamed reply's bytes
        def error_body(self, e) -> dict               # an error in this API's shape
        def stream_error(self, e) -> bytes            # how an open stream ends in an error

Everything else is shared (``ApiRoute.handle``): the API key, reading the body, tokenizing,
the context checks, submitting, cancelling when the client goes away, the status counters.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from goinfer.generation import GenerationResult
from goinfer.server.errors import APIError, bad
from goinfer.server.request import Event, Request
from goinfer.server.runner import ClientGone, Runner

__all__ = [
    "ApiRoute",
    "ReplyInfo",
    "Served",
    "EventStream",
    "sse",
    "SSE_PING",
    "authorize",
    "read_body",
    "read_json",
]


def sse(obj, event: str | None = None) -> bytes:
    """One server-sent event holding obj as compact JSON (with an event name, if given)."""
    head = f"event: {event}\n".encode() if event is not None else b""
    return head + b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


SSE_PING = b": ping\n\n"  # a comment line: keeps the connection open, clients ignore it


@dataclass
class ReplyInfo:
    """What a reply says about itself: one id and one creation time per request."""

    model_id: str
    fingerprint: str
    id: str
    created: int = field(default_factory=lambda: int(time.time()))
    prompt_tokens: int = 0  # of the prompt (known before the reply starts)


@dataclass
class Served:
    """What the app gives every route: the runner and the server's settings."""

    runner: Runner
    model_id: str
    fingerprint: str  # the system_fingerprint of replies
    max_body: int
    api_key: str | None
    counts: object  # metrics.RequestCounts
    # this server among replicas (its tag in ids a later request must come back with; "": the
    # only one), and the state routes keep per server (stored responses), by route path
    instance: str = ""
    state: dict = field(default_factory=dict)


class ApiRoute:
    path: str = ""  # the route's URL path (POST)
    id_prefix: str = ""  # of the reply's id

    # ------------------------------------------------------------------ the translation

    def parse(self, body: dict, vocab_size: int) -> Request:
        """The wire body -> the internal Request (APIError 400 naming the field)."""
        raise NotImplementedError

    def reply(self, result: GenerationResult, req: Request, info: ReplyInfo) -> dict:
        """The finished generation -> the whole reply's JSON."""
        raise NotImplementedError

    def reply_all(self, results: list[GenerationResult], req: Request, info: ReplyInfo) -> dict:
        """Every choice's finished generation (Request.n_choices of them, in order) -> the
        whole reply's JSON.  Default: the one choice's reply (an API without n)."""
        return self.reply(results[0], req, info)

    def stream(
        self, events: AsyncIterator[Event], req: Request, info: ReplyInfo
    ) -> AsyncIterator[bytes]:
        """The runner's events -> the streamed reply's bytes (server-sent events)."""
        raise NotImplementedError

    def error_body(self, e: APIError) -> dict:
        """An error in this API's shape (default: OpenAI's)."""
        return e.body()

    def stream_error(self, e: APIError) -> bytes:
        """The bytes that end an open stream with an error (a replica that died mid-stream)."""
        return sse(self.error_body(e))

    # ------------------------------------------------------------------ optional

    def bind(self, req: Request, srv: Served) -> None:
        """Complete a parsed request from the server's own state before it runs (Responses:
        the stored conversation a previous_response_id continues; APIError).  Default: none."""

    def new_id(self, srv: Served) -> str:
        """The id of a new reply."""
        return self.id_prefix + uuid.uuid4().hex[:24]

    def extra_routes(self) -> list[tuple[str, str, object]]:
        """More endpoints of this API: (method, path, async handler(request, srv) ->
        Response), e.g. GET /v1/responses/{response_id}.  Default: none."""
        return []

    def pinned(self, path: str, body: dict | None) -> str | None:
        """The instance tag (Served.instance) of the replica a request must reach, because
        only it holds what the request names (a stored response); None: any replica."""
        return None

    # ------------------------------------------------------------------ shared

    async def handle(self, request: HTTPRequest, srv: Served) -> Response:
        """Serve one request of this route (errors are raised as APIError)."""
        authorize(request.headers, srv.api_key)
        body = await read_json(request, srv.max_body)
        req = self.parse(body, srv.runner.model.vocab_size)
        self.bind(req, srv)
        run = await srv.runner.start(req)
        info = ReplyInfo(
            srv.model_id, srv.fingerprint, self.new_id(srv), prompt_tokens=len(run.job.ids)
        )
        if req.stream:
            srv.counts.add(self.path, 200)
            return EventStream(self._stream(srv.runner, run, info))
        try:
            results = await srv.runner.collect_all(run, _disconnected(request))
        except ClientGone:
            srv.counts.add(self.path, 499)
            return Response(status_code=499)
        srv.counts.add(self.path, 200)
        return JSONResponse(self.reply_all(results, req, info))

    async def _stream(self, runner: Runner, run, info: ReplyInfo) -> AsyncIterator[bytes]:
        events = runner.events(run)
        chunks = self.stream(events, run.request, info)
        try:
            async for chunk in chunks:
                yield chunk
        finally:  # the client went away, or the reply is complete
            await chunks.aclose()
            await events.aclose()  # before its end: the job is cancelled


# ============================================================================ HTTP helpers


def authorize(headers, api_key: str | None) -> None:
    """Raise APIError 401 unless headers carry 'Authorization: Bearer API_KEY' or
    'x-api-key: API_KEY' (Anthropic's header) (None: open)."""
    if api_key is None:
        return
    got = headers.get("authorization", "")
    scheme, _, token = got.partition(" ")
    if scheme.lower() != "bearer":
        token = headers.get("x-api-key", "")
    if not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise APIError(
            401,
            "invalid or missing API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')",
            type="authentication_error",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def read_body(request: HTTPRequest, limit: int) -> bytes:
    """The whole request body; APIError 413 past limit bytes, 499 if the client goes away."""
    n = request.headers.get("content-length")
    if n is not None and n.isdigit() and int(n) > limit:
        raise APIError(413, f"request body over {limit} bytes", code="body_too_large")
    buf = bytearray()
    try:
        async for part in request.stream():
            buf += part
            if len(buf) > limit:
                raise APIError(413, f"request body over {limit} bytes", code="body_too_large")
    except ClientDisconnect:
        raise APIError(499, "the client closed the connection", code="client_closed") from None
    return bytes(buf)


async def read_json(request: HTTPRequest, limit: int):
    """The request body as JSON (APIError 400 invalid_json, 413)."""
    buf = await read_body(request, limit)
    try:
        return json.loads(buf)
    except RecursionError:
        raise bad("the request body nests too deeply", code="invalid_json") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise bad(f"the request body is not valid JSON ({e})", code="invalid_json") from None


async def _disconnected(request: HTTPRequest) -> None:
    """Returns when the client closes the connection (the body is already read)."""
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


# ============================================================================ SSE response


class EventStream(Response):
    """A text/event-stream response that stops its generator as soon as the client goes away
    (whatever ASGI version the server speaks), so the job is cancelled at once."""

    media_type = "text/event-stream"

    def __init__(self, events):
        self.status_code = 200
        self.background = None
        self.events = events
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})  # no length

    async def __call__(self, scope, receive, send) -> None:
        async def pump():
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            async for chunk in self.events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        async def watch():
            while (await receive())["type"] != "http.disconnect":
                pass

        tasks = {asyncio.ensure_future(pump()), asyncio.ensure_future(watch())}
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.events.aclose()
        for t in done:
            if (
                not t.cancelled()
                and t.exception() is not None
                and not isinstance(t.exception(), OSError)
            ):
                raise t.exception()
