"""The HTTP side: FastAPI routes of the OpenAI API over the batching engine.

    app = create_app(model)                # engine thread starts with the app's lifespan
    uvicorn.run(app, host="127.0.0.1", port=8000)

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health,
GET /metrics.  Handlers validate the body (protocol.py), tokenize in a worker thread, submit a
Job to the engine and relay its events, as one JSON response or as server-sent events.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from goinfer.errors import (
    CacheFullError,
    ChatTemplateError,
    ContextLengthError,
    GoinferError,
    GrammarError,
    ToolError,
)
from goinfer.kv_cache import KVCache
from goinfer.sampling import SamplingParams
from goinfer.server import metrics
from goinfer.server.protocol import (
    SSE_DONE,
    SSE_PING,
    APIError,
    GenRequest,
    Shaper,
    bad,
    parse_chat,
    parse_completion,
    sse,
    timings,
)
from goinfer.server.scheduler import (
    DEFAULT_PREFILL_CHUNK,
    Engine,
    Event,
    Job,
    QueueFullError,
)
from goinfer.chat.channels import Reasoning
from goinfer.chat.request import ToolChat, prepare_chat
from goinfer.speculative import DEFAULT_DRAFT_TOKENS, PROMPT_LOOKUP, check_draft

log = logging.getLogger("goinfer.server")

MAX_BODY_BYTES = 8 << 20
PING_INTERVAL_S = 5.0


# ============================================================================ app


def create_app(model, cache: KVCache | None = None, *, model_id: str | None = None,
               api_key: str | None = None, max_batch: int = 8, max_queue: int = 64,
               prefill_chunk: int = DEFAULT_PREFILL_CHUNK, max_body_bytes: int = MAX_BODY_BYTES,
               ping_interval: float = PING_INTERVAL_S, draft: str | None = None,
               draft_tokens: int = DEFAULT_DRAFT_TOKENS) -> FastAPI:
    """draft / draft_tokens: the default speculative drafting of requests (a request's own
    "draft" / "draft_tokens" fields override it); the output is the same either way."""
    draft_tokens = check_draft(draft or PROMPT_LOOKUP, draft_tokens)
    cache = cache if cache is not None else KVCache(model)
    engine = Engine(model, cache, max_batch=max_batch, max_queue=max_queue,
                    prefill_chunk=prefill_chunk)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    app = FastAPI(title="goinfer", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    st = app.state
    st.model, st.cache, st.engine = model, cache, engine
    st.model_id = model_id or model.name
    st.api_key = api_key
    st.max_body = max_body_bytes
    st.ping = ping_interval
    st.counts = metrics.RequestCounts()
    st.draft, st.draft_tokens = draft is not None, draft_tokens
    st.started = int(time.time())

    # ------------------------------------------------------------------ errors

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        st.counts.add(request.url.path, e.status)
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        st.counts.add(request.url.path, e.status_code)
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(APIError(e.status_code, str(e.detail), type=kind).body(),
                            status_code=e.status_code)

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        log.exception("unhandled error")
        st.counts.add(request.url.path, 500)
        return JSONResponse(APIError(500, f"internal error: {type(e).__name__}",
                                     type="server_error").body(), status_code=500)

    # ------------------------------------------------------------------ routes

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": st.model_id, "active": engine.n_active,
                "queued": engine.queue_depth}

    @app.get("/v1/models")
    async def models(request: Request):
        _auth(request)
        st.counts.add("/v1/models", 200)
        return {"object": "list", "data": [{"id": st.model_id, "object": "model",
                                            "created": st.started, "owned_by": "goinfer"}]}

    @app.get("/metrics")
    async def get_metrics(request: Request):
        _auth(request)
        return PlainTextResponse(metrics.render(engine, cache, st.counts),
                                 media_type="text/plain; version=0.0.4")

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        _auth(request)
        body = await _read_json(request)
        req = parse_chat(body, model.vocab_size)
        ids, tc = await run_in_threadpool(_chat_ids, model, req)
        grammar = await run_in_threadpool(_grammar, model, req, tc)
        return await _run(request, req, ids, "/v1/chat/completions", grammar, tc)

    @app.post("/v1/completions")
    async def completions(request: Request):
        _auth(request)
        body = await _read_json(request)
        req = parse_completion(body, model.vocab_size)
        if isinstance(req.prompt, str):
            ids = await run_in_threadpool(model.tokenize, req.prompt, True)
        else:
            ids = list(req.prompt)
        grammar = await run_in_threadpool(_grammar, model, req)
        return await _run(request, req, ids, "/v1/completions", grammar)

    # ------------------------------------------------------------------ helpers

    def _auth(request: Request) -> None:
        authorize(request.headers, st.api_key)

    async def _read_json(request: Request):
        buf = await read_body(request, st.max_body)
        try:
            return json.loads(buf)
        except RecursionError:
            raise bad("the request body nests too deeply", code="invalid_json") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise bad(f"the request body is not valid JSON ({e})", code="invalid_json") from None

    async def _run(request: Request, req: GenRequest, ids: list[int], path: str, grammar=None,
                   tc: ToolChat | None = None):
        job = _make_job(req, ids)
        job.grammar, job.logprobs = grammar, (req.logprobs, req.top_logprobs)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()

        def on_event(ev: Event) -> None:  # engine thread
            loop.call_soon_threadsafe(events.put_nowait, ev)

        job.on_event = on_event
        try:
            engine.submit(job)
        except QueueFullError as e:
            raise APIError(429, str(e), type="rate_limit_error", code="queue_full",
                           headers={"Retry-After": "1"}) from None
        except ContextLengthError as e:
            raise bad(str(e), "max_tokens", "kv_cache_too_small") from None
        except GoinferError as e:
            raise APIError(503, str(e), type="server_error", code="unavailable") from None
        shaper = Shaper(req.kind, st.model_id, f"goinfer-{model.fingerprint[:12]}")
        if req.stream:
            st.counts.add(path, 200)
            return EventStream(_stream(job, events, req, shaper, tc))
        return await _collect(request, job, events, req, shaper, path, tc)

    def _make_job(req: GenRequest, ids: list[int]) -> Job:
        if not ids:
            raise bad("the prompt is empty", "prompt" if req.kind == "completion" else "messages")
        n_ctx = model.n_ctx
        cap = min(n_ctx, cache.max_tokens - cache.block_size)
        param = "messages" if req.kind == "chat" else "prompt"
        max_tokens = req.max_tokens
        if max_tokens is None:
            if len(ids) >= cap:
                raise bad(f"this model's maximum context length is {cap} tokens, but the "
                          f"messages take {len(ids)} tokens", param, "context_length_exceeded")
            max_tokens = cap - len(ids)
        elif len(ids) + max_tokens > n_ctx:
            raise bad(f"this model's maximum context length is {n_ctx} tokens, but "
                      f"{len(ids) + max_tokens} were requested ({len(ids)} in the prompt, "
                      f"{max_tokens} for the completion); shorten the prompt or lower max_tokens",
                      param, "context_length_exceeded")
        try:
            params = SamplingParams(**req.sampling)
        except ValueError as e:
            raise bad(str(e)) from None
        on = st.draft if req.draft is None else req.draft
        return Job(ids=ids, max_tokens=max_tokens, params=params, stops=req.stops,
                   on_event=lambda ev: None, cache_salt=req.cache_salt,
                   draft_tokens=(req.draft_tokens or st.draft_tokens) if on else 0)

    async def _collect(request, job, events, req, shaper, path, tc=None):
        """Wait for the whole result; cancel the job if the client goes away first."""
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            while True:
                get = asyncio.ensure_future(events.get())
                done, _ = await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
                if get not in done:
                    get.cancel()
                    engine.cancel(job)
                    st.counts.add(path, 499)
                    return Response(status_code=499)
                ev = get.result()
                if ev.kind == "done":
                    st.counts.add(path, 200)
                    result = tc.finish(ev.result) if tc is not None else ev.result
                    return JSONResponse(shaper.full(result, req.return_tokens))
                if ev.kind == "error":
                    raise _engine_error(ev.error)
        finally:
            gone.cancel()
            if not job.cancelled:
                engine.cancel(job)  # a no-op for a finished job; frees it on any early exit

    async def _stream(job, events, req, shaper, tc=None):
        """Server-sent events; comment pings while nothing else is sent (a long prefill).
        With tools, the text goes through the call parser: content and tool_calls deltas."""
        finished = False
        get = None
        sent = 0  # characters of completion text sent (the legacy logprobs' text_offset)
        parser = tc.parser() if tc is not None and tc.splits else None
        # with tools: logprobs entries of text the parser has taken but not sent yet (a marker
        # held back, whitespace between calls); they go with the next chunk, content or
        # tool_calls delta, so the chunks' entries add up to the non-streamed list
        carry: list[dict] = []

        def pieces(items):
            """Parsed items -> chunks: content and tool_calls deltas, each with the logprobs
            entries carried so far."""
            nonlocal carry
            for x in items:
                lps, carry = carry or None, []
                if isinstance(x, Reasoning):
                    yield sse(shaper.chunk(reasoning=str(x), include_usage=req.include_usage,
                                           logprobs=lps))
                elif isinstance(x, str):
                    yield sse(shaper.chunk(text=x, include_usage=req.include_usage,
                                           logprobs=lps))
                else:
                    yield sse(shaper.chunk(tool_call=x, include_usage=req.include_usage,
                                           logprobs=lps))

        try:
            yield sse(shaper.chunk(role=True, text="", include_usage=req.include_usage))
            get = asyncio.ensure_future(events.get())
            while True:
                done, _ = await asyncio.wait({get}, timeout=st.ping)
                if not done:
                    yield SSE_PING
                    continue
                ev = get.result()
                if ev.kind == "text":
                    if parser is None:
                        yield sse(shaper.chunk(text=ev.text, include_usage=req.include_usage,
                                               logprobs=ev.logprobs, offset=sent))
                        sent += len(ev.text)
                    else:
                        carry += ev.logprobs or []
                        for chunk in pieces(parser.push(ev.text)):
                            yield chunk
                elif ev.kind == "done":
                    finished = True
                    if parser is not None:
                        for chunk in pieces(parser.finish()):
                            yield chunk
                        tc.finish(ev.result, parser)
                    end = shaper.chunk(finish=ev.result.finish_reason,
                                       include_usage=req.include_usage, logprobs=carry or None)
                    if req.kind == "chat":
                        end["choices"][0]["delta"] = {}
                    if ev.result.reason is not None:
                        end["choices"][0]["reason"] = ev.result.reason
                    end["timings"] = timings(ev.result)
                    yield sse(end)
                    if req.include_usage:
                        yield sse(shaper.usage_chunk(ev.result))
                    yield SSE_DONE
                    return
                else:
                    finished = True
                    e = _engine_error(ev.error)
                    yield sse(e.body())
                    yield SSE_DONE
                    return
                get = asyncio.ensure_future(events.get())
        finally:
            if get is not None:
                get.cancel()
            if not finished:
                engine.cancel(job)

    return app


def authorize(headers, api_key: str | None) -> None:
    """Raise APIError 401 unless headers carry 'Authorization: Bearer API_KEY' (None: open)."""
    if api_key is None:
        return
    got = headers.get("authorization", "")
    scheme, _, token = got.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                             api_key.encode()):
        raise APIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                       type="authentication_error", code="invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})


async def read_body(request: Request, limit: int) -> bytes:
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


def _chat_ids(model, req: GenRequest) -> tuple[list[int], ToolChat]:
    """The prompt's token ids (BOS once, as Session.chat) and the request's tool side."""
    try:
        tc = prepare_chat(model, req.messages, req.tools, req.tool_choice,
                          req.parallel_tool_calls, req.template_kwargs)
    except ToolError as e:
        raise bad(str(e), e.param, "invalid_value") from None
    except ChatTemplateError as e:
        raise bad(f"the chat template failed: {e}", "messages", "chat_template_error") from None
    return model.tokenize_chat(tc.prompt), tc


def _grammar(model, req: GenRequest, tc: ToolChat | None = None):
    """The request's compiled constraint (None: unconstrained): its response_format or
    grammar, or its tools' grammar; a 400 naming the field when it cannot be enforced.  Runs
    in a worker thread: the first request of a model builds its tokenizer view (~0.1-2 s),
    later ones hit the compiled-grammar cache."""
    from goinfer.generation import constraint_of

    rf, grammar = req.response_format, req.grammar
    try:
        if tc is not None:
            rf, grammar = tc.constraint(rf, grammar)
        return constraint_of(model, rf, grammar)
    except ToolError as e:
        raise bad(str(e), e.param, "invalid_value") from None
    except GrammarError as e:
        code = "invalid_grammar" if e.param == "grammar" else "invalid_response_format"
        raise bad(str(e), e.param, code) from None


def _engine_error(e: BaseException | None) -> APIError:
    if isinstance(e, (CacheFullError, ContextLengthError)):
        return APIError(400 if isinstance(e, ContextLengthError) else 503, str(e),
                        type="invalid_request_error" if isinstance(e, ContextLengthError)
                        else "server_error", code="kv_cache_full")
    return APIError(500, f"generation failed: {e}", type="server_error")


async def _disconnected(request: Request) -> None:
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
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
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
            if not t.cancelled() and t.exception() is not None and not isinstance(
                    t.exception(), OSError):
                raise t.exception()
