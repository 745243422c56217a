"""goinfer replicas on Ray Serve behind one OpenAI endpoint, routed by cached prefix.

    goinfer serve smollm2-135m --replicas 2 --threads-per-replica 1   # a local Ray instance
    goinfer serve smollm2-135m --replicas 4 --ray-address auto        # join a running cluster

    from goinfer.server.ray import ReplicaSpec, build_app
    serve.run(build_app(ReplicaSpec("smollm2-135m"), replicas=2), route_prefix="/")

Needs the ``ray`` extra (``pip install 'goinfer[ray]'``).  Three parts:

- GoinferReplica, a Serve deployment: each replica loads the model and runs goinfer's own
  FastAPI app (create_app: the engine with its continuous batching and prefix cache, every route,
  every error) in its process.  A request reaches it as (method, path, headers, body); the app's
  ASGI messages go back as a Ray stream.  Nothing of the single-process server is re-implemented,
  so whatever its routes learn, the replicas serve.
- GoinferIngress, the HTTP entry that Serve's proxy calls: it reads the body, tokenizes the prompt
  with the model's tokenizer (the GGUF's metadata only, no weights), computes its block hash chain
  (routing.prompt_chain) and forwards the request through a handle whose router is PrefixRouter.
  It relays the replica's answer unchanged and adds an ``X-Goinfer-Replica`` header.  A replica
  that dies before it took the request is retried on another one; one that dies after ends the
  request with an error (a stream with an error event and ``data: [DONE]``), never a truncation.
- PrefixRouter, a ray.serve.request_router.RequestRouter applying routing.choose.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
import weakref
from dataclasses import asdict
from pathlib import Path

from ray import serve
from ray.exceptions import RayError
from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from goinfer.server.anthropic_request import DEFAULTS_ENV, NORMALIZE_ENV
from goinfer.server.errors import APIError
from goinfer.server.route import ApiRoute
from goinfer.server.routes import ROUTES, route_for
from goinfer.server.routing import (
    KeyIndex,
    Policy,
    PrefixIndex,
    choose,
    instance_tag,
    prompt_chain,
)
from goinfer.server.spec import ReplicaSpec, ServeOptions, open_app

log = logging.getLogger("goinfer.server")

APP_NAME = "goinfer"
REPLICA_HEADER = "x-goinfer-replica"
ROUTE_RETRIES = 3  # tries to place a request on a replica that takes it (a dead one does not)
ASSIGNED_TTL_S = 600.0  # a request counted in flight this long without completing is forgotten
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"}
_DEFAULT_ROUTE = ApiRoute()  # any other path: errors in OpenAI's shape
ROUTE_ENV = (NORMALIZE_ENV, DEFAULTS_ENV)  # settings routes read from the environment


# ============================================================================ replica


class GoinferReplica:
    """One model, one KV cache, one engine thread: goinfer's single-process server in an actor."""

    def __init__(self, spec: ReplicaSpec):
        self.spec = spec
        self.id = serve.get_replica_context().replica_id.to_full_id_str()
        self.app = open_app(spec, progress=False, instance=instance_tag(self.id))
        model, cache = self.app.state.model, self.app.state.cache
        self.engine = self.app.state.engine
        self.engine.start()  # the app's lifespan is not run: this process owns the engine
        log.info(
            "replica %s: %s, threads=%d, KV cache %d tokens",
            self.id,
            model.name,
            model.threads,
            cache.max_tokens,
        )

    async def forward(self, req: dict):
        """Serve one HTTP request -> ("accepted", replica id), ("start", status, headers),
        ("body", bytes)...  Cancelling the stream is the client going away."""
        yield ("accepted", self.id)
        async for msg in asgi_call(self.app, req):
            yield msg

    def check_health(self) -> None:
        """Serve restarts a replica whose engine thread is gone."""
        t = self.engine._thread
        if t is None or not t.is_alive():
            raise RuntimeError("the engine thread is not running")

    def __del__(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.stop()


async def asgi_call(app, req: dict):
    """Run an ASGI app on one request held in memory; yield its response as ("start", status,
    headers) and ("body", bytes) items.  Closing this generator early disconnects the client."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": req["method"],
        "scheme": "http",
        "path": req["path"],
        "raw_path": req["path"].encode(),
        "root_path": "",
        "query_string": req.get("query", "").encode(),
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in req["headers"]],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
    }
    out: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    body_sent = False

    async def receive():
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": req["body"], "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(msg):
        out.put_nowait(msg)

    task = asyncio.ensure_future(app(scope, receive, send))
    task.add_done_callback(lambda _: out.put_nowait(None))
    try:
        while True:
            msg = await out.get()
            if msg is None:  # the app returned without finishing its response
                task.result()  # its exception, if it raised one
                raise RuntimeError("the app ended without a complete response")
            if msg["type"] == "http.response.start":
                yield (
                    "start",
                    msg["status"],
                    [(k.decode("latin-1"), v.decode("latin-1")) for k, v in msg.get("headers", [])],
                )
            elif msg["type"] == "http.response.body":
                if msg.get("body"):
                    yield ("body", bytes(msg["body"]))
                if not msg.get("more_body", False):
                    return
    finally:
        gone.set()  # the app sees the client leave and cancels the engine job
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# ============================================================================ router


def _chain_of(pending_request: PendingRequest | None) -> list[bytes]:
    return _field(pending_request, "chain") or []


def _field(pending_request: PendingRequest | None, name: str):
    """A field of the request dict the ingress sends: chain, key (conversation key), pin
    (the instance tag of the replica that must serve it)."""
    if pending_request is None or not pending_request.args:
        return None
    req = pending_request.args[0]
    return req.get(name) if isinstance(req, dict) else None


class PrefixRouter(RequestRouter):
    """Ray Serve request router for goinfer replicas: routing.choose over the prefix index it
    keeps of what it sent where, and the requests in flight per replica.

    Load is the larger of Ray's queue length (cached, probed when unknown; it counts every
    router's requests) and this router's own count of the requests it assigned that have not
    completed (counted at the decision, so a burst routed before Ray's cache sees the first
    sends is still spread).

    Ray LLM's PrefixCacheAffinityRouter matches prompt text in a shared tree actor; goinfer's
    cache is keyed by token blocks (and cache salts), so this router matches the request's
    block hash chain, computed once by the ingress, in the router's own process."""

    def initialize_state(
        self,
        policy: str = "prefix",
        imbalance: int = 4,
        min_blocks: int = 1,
        capacity: int = 1 << 16,
    ):
        self.policy = Policy(policy, imbalance, min_blocks)
        self.index = PrefixIndex(capacity)
        self.keys = KeyIndex()  # conversation key -> the replica it last went to
        self.decisions: dict[str, int] = {}
        self.assigned: dict[str, tuple[str, float]] = {}  # request id -> (replica, when)
        # Serve ships a router class pickled *by value* with its module's globals copied, so
        # register in the module as imported here, where the ingress looks
        import goinfer.server.ray as this

        this._routers.add(self)

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        if not candidate_replicas:
            return []
        by_id = {r.replica_id.to_full_id_str(): r for r in candidate_replicas}
        rid = pending_request.metadata.internal_request_id if pending_request else None
        self.assigned.pop(rid, None)  # routed again (the first choice was full): count it once
        pin = _field(pending_request, "pin")
        if pin:  # it names what one replica stores (a response id): only that one can serve it
            held = [r for r in by_id if instance_tag(r) == pin]
            if held:
                self.decisions["pinned"] = self.decisions.get("pinned", 0) + 1
                if rid is not None:
                    self.assigned[rid] = (held[0], time.monotonic())
                return [[by_id[held[0]]]]
            # that replica is gone: any replica answers (404, the response is unknown there)
        if self.policy.name == "random":
            loads = dict.fromkeys(by_id, 0)
        else:
            ray_loads = await self._queue_lens(candidate_replicas)
            live = [r for r in by_id if r in ray_loads] or list(by_id)  # none answered: all
            own = self.in_flight()
            loads = {r: max(ray_loads.get(r, 0), own.get(r, 0)) for r in live}
        chain = _chain_of(pending_request)
        key = _field(pending_request, "key")
        c = choose(chain, loads, self.index, self.policy, preferred=self.keys.get(key))
        self.keys.set(key, c.ranking[0])
        self.decisions[c.reason] = self.decisions.get(c.reason, 0) + 1
        if rid is not None:
            self.assigned[rid] = (c.ranking[0], time.monotonic())
        if chain:  # now, not when Ray reports the request routed: the next turn may come first
            self.index.add(c.ranking[0], chain)
        return [[by_id[r]] for r in c.ranking]

    async def _queue_lens(self, replicas) -> dict[str, int]:
        """Ray's queue length per replica, probing the unknown ones (a replica that does not
        answer is left out)."""
        out, unknown = {}, []
        for r in replicas:
            q = self.replica_queue_len_cache.get(r.replica_id)
            if q is None:
                unknown.append(r)
            else:
                out[r.replica_id.to_full_id_str()] = q
        if unknown:
            for r, q in await self._probe_queue_lens(unknown, 0):
                if q is not None:
                    out[r.replica_id.to_full_id_str()] = q
        return out

    def in_flight(self) -> dict[str, int]:
        """This router's requests per replica that have not completed (an entry older than
        ASSIGNED_TTL_S is dropped: a request cancelled before it was sent never completes)."""
        now = time.monotonic()
        for k in [k for k, (_, t) in self.assigned.items() if now - t > ASSIGNED_TTL_S]:
            del self.assigned[k]
        out: dict[str, int] = {}
        for r, _ in self.assigned.values():
            out[r] = out.get(r, 0) + 1
        return out

    def on_request_routed(self, pending_request, replica_id: ReplicaID, result) -> None:
        chain = _chain_of(pending_request)
        if chain:  # the replica Ray actually sent it to (a fallback rank, when the first was full)
            self.index.add(replica_id.to_full_id_str(), chain)
        rid = pending_request.metadata.internal_request_id
        if rid in self.assigned:
            self.assigned[rid] = (replica_id.to_full_id_str(), self.assigned[rid][1])

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self.assigned.pop(internal_request_id, None)

    def update_replicas(self, replicas) -> None:
        super().update_replicas(replicas)
        if hasattr(self, "index"):
            self.index.keep_only(r.to_full_id_str() for r in self.curr_replicas)
            self.keys.keep_only(r.to_full_id_str() for r in self.curr_replicas)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.index.drop(replica_id.to_full_id_str())

    def stats(self) -> dict:
        return {
            "policy": self.policy.name,
            "imbalance": self.policy.imbalance,
            "decisions": dict(self.decisions),
            "in_flight": self.in_flight(),
            "index_blocks": {r: self.index.blocks(r) for r in self.index.replicas()},
        }


_routers: weakref.WeakSet = weakref.WeakSet()  # the PrefixRouters of this process (the ingress's)


# ============================================================================ ingress


class TextModel:
    """A model's text side, read from its GGUF metadata without the weights: what the ingress
    needs to turn a request into prompt tokens exactly as the replicas do (Model's own methods)."""

    def __init__(self, name_or_path: str):
        from goinfer import hub
        from goinfer.gguf import GGUFFile
        from goinfer.models import ARCHITECTURES, read_config
        from goinfer.tokenizer import Tokenizer, builtin_template

        src = hub.locate(name_or_path, progress=False)
        self.defaults = src.defaults()  # a chat's default system message, as Model.load reads it
        with GGUFFile(src.path) as g:
            self.path = Path(g.path)
            self.name = src.name
            self.config = read_config(g)[1] if g.arch in ARCHITECTURES else None
            self.tokenizer = Tokenizer.from_metadata(g.metadata)
            self.chat_template = g.get("tokenizer.chat_template") or builtin_template(g.arch)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size if self.config is not None else self.tokenizer.vocab_size

    from goinfer.model import Model as _Model

    tokenize = _Model.tokenize
    tokenize_chat = _Model.tokenize_chat
    apply_chat_template = _Model.apply_chat_template
    del _Model


def route_chain(
    text: TextModel, path: str, body: bytes, block_size: int
) -> tuple[list[bytes], str | None]:
    """(the block hash chain of a generation request's prompt, parsed by its route and
    tokenized as the replica's runner does, its conversation key); ([], None) for any other
    request or any request the replica will refuse (its app answers the error, so the ingress
    never needs to)."""
    from goinfer.server.runner import prompt_ids

    route = route_for(path)
    if route is None:
        return [], None
    try:
        req = route.parse(json.loads(body), text.vocab_size)
        ids, _ = prompt_ids(text, req)
    except Exception as e:  # noqa: BLE001 - refused there: routed without a key
        log.debug("no routing key for a request to %s: %s", path, e)
        return [], None
    return prompt_chain(ids, block_size, req.cache_salt), req.cache_key


def pinned_to(path: str, body: bytes) -> str | None:
    """The instance tag of the replica a request must reach (it names a stored response),
    asked of every route; None: any replica."""
    parsed = None
    if body:
        try:
            parsed = json.loads(body)
        except ValueError:
            pass
    for route in ROUTES:
        tag = route.pinned(path, parsed)
        if tag:
            return tag
    return None


def replica_failed(e: BaseException, replica: str | None) -> APIError:
    where = f" ({replica})" if replica else ""
    return APIError(
        503,
        f"the replica serving this request failed{where}: "
        f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
        type="server_error",
        code="replica_failed",
        headers={"Retry-After": "1"},
    )


class GoinferIngress:
    """HTTP in, one replica's answer out (see the module's docstring)."""

    def __init__(self, replicas, spec: ReplicaSpec):
        self.replicas = replicas
        self.spec = spec
        self.text = TextModel(spec.model)

    def routing_stats(self) -> list[dict]:
        """What the router decided so far (by reason), its requests in flight and the blocks its
        index holds per replica (a handle method: ``handle.routing_stats.remote()``)."""
        return [r.stats() for r in _routers]

    async def __call__(self, request: Request) -> Response:
        from goinfer.server.route import authorize, read_body

        path, root = request.scope["path"], request.scope.get("root_path", "")
        if root and path.startswith(root):  # served under a route prefix: the app's own path
            path = path[len(root) :] or "/"
        try:
            body = await read_body(request, self.spec.max_body)
        except APIError as e:
            return JSONResponse(e.body(), status_code=e.status, headers=e.headers)
        chain: list[bytes] = []
        key = None
        try:
            authorize(request.headers, self.spec.api_key)
            if route_for(path) is not None and request.method == "POST":
                chain, key = await asyncio.to_thread(
                    route_chain, self.text, path, body, self.spec.block_size
                )
        except APIError:
            pass  # forwarded all the same: the replica's app answers 401
        req = {
            "method": request.method,
            "path": path,
            "query": request.url.query,
            "headers": [(k, v) for k, v in request.headers.items() if k != "host"],
            "body": body,
            "chain": chain,
            "key": key,
            "pin": pinned_to(path, body),
        }
        return await self._forward(req, route_for(path) or _DEFAULT_ROUTE)

    async def _forward(self, req: dict, route: ApiRoute) -> Response:
        handle = self.replicas.options(stream=True)
        err: BaseException | None = None
        for attempt in range(ROUTE_RETRIES):
            gen = handle.forward.remote(req)
            try:
                kind, replica = await gen.__anext__()
            except RayError as e:  # died or unreachable before it took the request: retry
                log.warning("replica failed before taking a request (try %d): %s", attempt + 1, e)
                err = e
                continue
            assert kind == "accepted", kind
            return await self._relay(gen, replica, route)
        e = replica_failed(err, None)
        return JSONResponse(route.error_body(e), status_code=e.status, headers=e.headers)

    async def _relay(self, gen, replica: str, route: ApiRoute) -> Response:
        try:
            _, status, headers = await gen.__anext__()
        except (RayError, StopAsyncIteration) as e:
            gen.cancel()
            err = replica_failed(e, replica)
            return JSONResponse(
                route.error_body(err),
                status_code=err.status,
                headers=dict(err.headers, **{REPLICA_HEADER: replica}),
            )
        headers = {k: v for k, v in headers if k.lower() not in HOP_HEADERS}
        headers[REPLICA_HEADER] = replica
        media = headers.pop("content-type", None)
        if media is not None and media.startswith("text/event-stream"):
            return StreamingResponse(
                _relay_stream(gen, replica, route),
                status_code=status,
                headers=headers,
                media_type=media,
            )
        parts = []
        try:
            async for _kind, data in gen:
                parts.append(data)
        except RayError as e:
            err = replica_failed(e, replica)
            return JSONResponse(
                route.error_body(err),
                status_code=err.status,
                headers=dict(err.headers, **{REPLICA_HEADER: replica}),
            )
        return Response(b"".join(parts), status_code=status, headers=headers, media_type=media)


async def _relay_stream(gen, replica: str, route: ApiRoute):
    """The replica's event stream; if the replica dies mid-stream, the route's error end (an
    error event, and OpenAI's [DONE])."""
    done = False
    try:
        async for _, data in gen:
            yield data
        done = True
    except RayError as e:
        log.warning("replica %s failed mid-stream: %s", replica, e)
        done = True
        yield route.stream_error(replica_failed(e, replica))
    finally:
        if not done:  # the client went away: stop the replica's job
            gen.cancel()


# ============================================================================ application


def build_app(
    spec: ReplicaSpec,
    replicas: int = 2,
    *,
    threads_per_replica: int | None = None,
    policy: Policy | None = None,
):
    """The Serve application: an ingress and `replicas` replicas of spec's model."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    policy = policy or Policy()
    threads = threads_per_replica or spec.threads or 1
    spec = ReplicaSpec(**dict(asdict(spec), threads=threads))
    per_replica = spec.max_batch + spec.max_queue + 1  # past it, the app's own 429 answers
    capacity = _cache_blocks(spec)
    # the server's settings that routes read from the environment, for every node's actors
    env = {k: os.environ[k] for k in ROUTE_ENV if k in os.environ}
    runtime = {"runtime_env": {"env_vars": env}} if env else {}
    replica = serve.deployment(
        GoinferReplica,
        name="GoinferReplica",
        num_replicas=replicas,
        max_ongoing_requests=per_replica,
        ray_actor_options={"num_cpus": threads, **runtime},
        request_router_config=RequestRouterConfig(
            request_router_class=PrefixRouter,
            request_router_kwargs={
                "policy": policy.name,
                "imbalance": policy.imbalance,
                "min_blocks": policy.min_blocks,
                "capacity": capacity,
            },
        ),
        health_check_period_s=2,
        health_check_timeout_s=30,
    )
    ingress = serve.deployment(
        GoinferIngress,
        name="GoinferIngress",
        num_replicas=1,
        max_ongoing_requests=4 * replicas * per_replica,
        ray_actor_options={"num_cpus": 0, **runtime},
    )
    return ingress.bind(replica.bind(spec), spec)


def _cache_blocks(spec: ReplicaSpec) -> int:
    """Blocks of one replica's KV cache (what the router's index remembers per replica)."""
    tokens = spec.kv_tokens
    if tokens is None:
        ctx = spec.ctx or TextModel(spec.model).config.context_length
        tokens = 2 * ctx  # KVCache's default
    return max(1, -(-int(tokens) // spec.block_size))


def run(
    spec: ReplicaSpec,
    *,
    replicas: int,
    threads_per_replica: int | None = None,
    policy: Policy | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    ray_address: str | None = None,
    num_cpus: int | None = None,
    log_level: str = "info",
) -> None:
    """Start a local Ray instance (num_cpus: its CPUs, default the machine's cores, at least
    replicas x threads) or join ray_address's cluster, deploy the application with Serve's HTTP
    proxy on host:port, and return once it is ready.  log_level: the application's (uvicorn's
    names; "trace" is Python's DEBUG)."""
    import ray

    threads = threads_per_replica or spec.threads or 1
    if ray_address:
        ray.init(address=ray_address, log_to_driver=False)
    else:
        cores = os.cpu_count() or 1
        if replicas * threads > cores:
            print(
                f"goinfer serve: {replicas} replicas x {threads} threads oversubscribe "
                f"{cores} cores",
                file=sys.stderr,
            )
        ray.init(
            num_cpus=num_cpus or max(cores, replicas * threads),
            include_dashboard=False,
            log_to_driver=False,
        )
    serve.start(http_options={"host": host, "port": port})
    serve.run(
        build_app(spec, replicas, threads_per_replica=threads, policy=policy),
        name=APP_NAME,
        route_prefix="/",
        blocking=False,
        logging_config={"log_level": "DEBUG" if log_level == "trace" else log_level.upper()},
    )


def stop(joined: bool = False) -> None:
    """Remove the application.  On a cluster this process joined, only goinfer's application
    goes (other Serve applications and the cluster stay); a local instance ends with Serve."""
    import ray

    if joined:
        serve.delete(APP_NAME)
    else:
        serve.shutdown()
    ray.shutdown()


def serve_cli(opts: ServeOptions) -> int:
    """`goinfer serve MODEL --replicas N [--threads-per-replica T] [--ray-address ADDR]`
    (opts: server/cli.py's serve_options of its flags)."""
    replicas = opts.replicas or 1
    spec = opts.spec
    threads = opts.threads_per_replica or spec.threads or max(1, (os.cpu_count() or 1) // replicas)
    policy = opts.policy
    joined = bool(opts.ray_address)
    try:
        run(
            spec,
            replicas=replicas,
            threads_per_replica=threads,
            policy=policy,
            host=opts.host,
            port=opts.port,
            ray_address=opts.ray_address,
            log_level=opts.log_level,
        )
    except Exception as e:  # noqa: BLE001 - a failed deployment: say why, leave nothing behind
        print(
            f"goinfer serve: starting on Ray Serve failed: {type(e).__name__}: {e} (the "
            "replicas' own errors are in Ray's logs, /tmp/ray/session_latest/logs/serve/; every "
            "node needs goinfer[ray] installed)",
            file=sys.stderr,
        )
        stop(joined)
        return 1
    print(
        f"goinfer: serving {spec.resolved_model_id()} on Ray Serve, {replicas} replica(s) x "
        f"{threads} thread(s), routing {policy.name} (imbalance {policy.imbalance}), on "
        f"http://{opts.host}:{opts.port}/v1 (Ctrl-C stops)",
        file=sys.stderr,
    )
    try:
        wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop(joined)
    return 0


def wait() -> None:
    """Until Ctrl-C: Serve's proxy and the replicas run in Ray's processes."""
    while True:
        time.sleep(3600)
