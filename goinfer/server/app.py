"""The HTTP side: a FastAPI app serving every API route (routes.py) over the batching engine.

    app = create_app(model)                # engine thread starts with the app's lifespan
    uvicorn.run(app, host="127.0.0.1", port=8000)

Routes: POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, POST /v1/messages
and /v1/messages/count_tokens (each a translation module over the generic runner, runner.py; the
Responses API's stored responses under /v1/responses/{id}), GET /v1/models, GET /v1/models/{id},
POST /v1/embeddings (embeddings.py), POST /tokenize and /detokenize (tokens.py), GET /health,
GET /metrics.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from goinfer.kv_cache import KVCache
from goinfer.server import embeddings, metrics, tokens
from goinfer.server.errors import APIError
from goinfer.server.route import ApiRoute, Served, authorize, read_body
from goinfer.server.routes import ROUTES
from goinfer.server.runner import Runner
from goinfer.server.scheduler import DEFAULT_PREFILL_CHUNK, Engine
from goinfer.speculative import DEFAULT_DRAFT_TOKENS, PROMPT_LOOKUP, check_draft

__all__ = ["create_app", "authorize", "read_body"]

log = logging.getLogger("goinfer.server")

MAX_BODY_BYTES = 8 << 20
PING_INTERVAL_S = 5.0


def create_app(
    model,
    cache: KVCache | None = None,
    *,
    model_id: str | None = None,
    api_key: str | None = None,
    max_batch: int = 8,
    max_queue: int = 64,
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    max_body_bytes: int = MAX_BODY_BYTES,
    ping_interval: float = PING_INTERVAL_S,
    draft: str | None = None,
    draft_tokens: int = DEFAULT_DRAFT_TOKENS,
    routes: Sequence[ApiRoute] = ROUTES,
    instance: str = "",
) -> FastAPI:
    """draft / draft_tokens: the default speculative drafting of requests (a request's own
    "draft" / "draft_tokens" fields override it); the output is the same either way.
    routes: the API routes served (default: every route of routes.py).  instance: this
    server's tag among replicas (in the ids of what it stores; "": the only server)."""
    draft_tokens = check_draft(draft or PROMPT_LOOKUP, draft_tokens)
    cache = cache if cache is not None else KVCache(model)
    engine = Engine(
        model, cache, max_batch=max_batch, max_queue=max_queue, prefill_chunk=prefill_chunk
    )

    @contextlib.asynccontextmanager
    async def lifespan(app):
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    app = FastAPI(
        title="goinfer", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    st = app.state
    st.model, st.cache, st.engine = model, cache, engine
    st.model_id = model_id or model.name
    st.api_key = api_key
    st.counts = metrics.RequestCounts()
    st.started = int(time.time())
    runner = Runner(
        model,
        cache,
        engine,
        draft=draft is not None,
        draft_tokens=draft_tokens,
        ping_interval=ping_interval,
    )
    served = Served(
        runner,
        st.model_id,
        f"goinfer-{model.fingerprint[:12]}",
        max_body_bytes,
        api_key,
        st.counts,
        instance,
    )
    st.served = served  # (its runner: the drafting default; max_body, instance)

    # ------------------------------------------------------------------ errors

    by_path = {r.path: r for r in routes}

    def error_body(request: Request, e: APIError) -> dict:
        """The error in the shape of the route asked (OpenAI's for any other path)."""
        route = by_path.get(request.url.path)
        return route.error_body(e) if route is not None else e.body()

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        st.counts.add(request.url.path, e.status)
        return JSONResponse(error_body(request, e), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        st.counts.add(request.url.path, e.status_code)
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(
            error_body(request, APIError(e.status_code, str(e.detail), type=kind)),
            status_code=e.status_code,
        )

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        log.exception("unhandled error")
        st.counts.add(request.url.path, 500)
        return JSONResponse(
            error_body(
                request, APIError(500, f"internal error: {type(e).__name__}", type="server_error")
            ),
            status_code=500,
        )

    # ------------------------------------------------------------------ routes

    @app.get("/health")
    async def health():
        return {
            "status": "ok",
            "model": st.model_id,
            "active": engine.n_active,
            "queued": engine.queue_depth,
        }

    def model_object() -> dict:
        return {"id": st.model_id, "object": "model", "created": st.started, "owned_by": "goinfer"}

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request.headers, st.api_key)
        st.counts.add("/v1/models", 200)
        return {"object": "list", "data": [model_object()]}

    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str, request: Request):
        """The served model (client.models.retrieve); another id: OpenAI's 404."""
        authorize(request.headers, st.api_key)
        if model != st.model_id:  # (counted under the route: ids are the client's to choose)
            st.counts.add("/v1/models/{model}", 404)
            e = APIError(
                404,
                f"The model '{model}' does not exist (this server serves '{st.model_id}')",
                param="model",
                code="model_not_found",
            )
            return JSONResponse(e.body(), status_code=404)
        st.counts.add("/v1/models/{model}", 200)
        return model_object()

    @app.get("/metrics")
    async def get_metrics(request: Request):
        authorize(request.headers, st.api_key)
        return PlainTextResponse(
            metrics.render(engine, cache, st.counts, runner.keys),
            media_type="text/plain; version=0.0.4",
        )

    for route in routes:
        _mount(app, route, served)
    embeddings.mount(app, served)  # POST /v1/embeddings
    tokens.mount(app, served)  # POST /tokenize, /detokenize (llama.cpp's shapes)
    return app


def _mount(app: FastAPI, route: ApiRoute, served: Served) -> None:
    async def handler(request: Request):
        return await route.handle(request, served)

    app.add_api_route(route.path, handler, methods=["POST"])
    for method, path, serve in route.extra_routes():
        _mount_extra(app, method, path, serve, served)


def _mount_extra(app: FastAPI, method: str, path: str, serve, served: Served) -> None:
    async def handler(request: Request):
        return await serve(request, served)

    app.add_api_route(path, handler, methods=[method])
