"""An API route is one translation module over the generic runner: a route written here, in a
wire shape of its own (its own fields, events and error body), is served beside the OpenAI
routes by create_app(routes=...) and answers as ChatSession.chat does; its errors, those of
the runner's checks included, come in its own shape."""

from __future__ import annotations

import json

import pytest
from test_server import Server, lone, model, msgs  # noqa: F401 - model: a fixture

from goinfer.errors import ContextLengthError
from goinfer.server import fields as F
from goinfer.server.errors import APIError, bad
from goinfer.server.request import Done, Failed, Ping, ReasoningDelta, Request, TextDelta
from goinfer.server.route import SSE_PING, ApiRoute, sse
from goinfer.server.routes import ROUTES, route_for


class Toy(ApiRoute):
    """{"say": text, "most": n, "stream": bool} -> {"said": text, "why": finish_reason};
    streamed as "piece" events then a "end" event; errors {"oops": {"kind", "text", ...}}."""

    path = "/v1/toy"
    id_prefix = "toy-"

    def parse(self, body, vocab_size) -> Request:
        if not isinstance(body, dict) or not isinstance(body.get("say"), str):
            raise bad("'say' must be a string", "say")
        return Request(
            kind="chat",
            messages=msgs(body["say"]),
            prompt_param="say",
            max_tokens=F.integer(body, "most", 1, None, None),
            stream=F.boolean(body, "stream", False),
            sampling={"temperature": 0.0},
        )

    def reply(self, result, req, info) -> dict:
        return {"id": info.id, "said": result.content, "why": result.finish_reason}

    async def stream(self, events, req, info):
        async for ev in events:
            if isinstance(ev, Ping):
                yield SSE_PING
            elif isinstance(ev, (TextDelta, ReasoningDelta)):
                yield sse({"piece": ev.text}, event="piece")
            elif isinstance(ev, Done):
                yield sse({"why": ev.result.finish_reason}, event="end")
            elif isinstance(ev, Failed):
                yield self.stream_error(ev.error)

    def error_body(self, e: APIError) -> dict:
        out = {"kind": e.type, "text": e.message, "field": e.param}
        if isinstance(e.cause, ContextLengthError):
            out["tokens"], out["limit"] = e.cause.tokens, e.cause.limit
        return {"oops": out}


@pytest.fixture(scope="module")
def toy_srv(model):  # noqa: F811 - the fixture imported above
    with Server(model, routes=ROUTES + (Toy(),)) as s:
        yield s


def test_a_route_module_is_served_beside_the_others(toy_srv, model):  # noqa: F811
    m = msgs("Tell me about routes.")
    ref = lone(model, chat=m, max_tokens=12, temperature=0.0)
    r = toy_srv.post("/v1/toy", {"say": "Tell me about routes.", "most": 12})
    assert r.status_code == 200
    d = r.json()
    assert d["id"].startswith("toy-") and (d["said"], d["why"]) == (ref.content, ref.finish_reason)
    raw = toy_srv.post("/v1/toy", {"say": "Tell me about routes.", "most": 12, "stream": True})
    assert raw.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in raw.text.split("\n\n") if b]
    names = [b.split("\n", 1)[0] for b in blocks]
    assert set(names[:-1]) == {"event: piece"} and names[-1] == "event: end"
    pieces = [json.loads(b.split("data: ", 1)[1]) for b in blocks]
    assert "".join(p.get("piece", "") for p in pieces) == ref.content
    assert pieces[-1] == {"why": ref.finish_reason}
    # the OpenAI routes are unchanged beside it
    c = toy_srv.client().chat.completions.create(
        model="tiny", messages=m, max_tokens=12, temperature=0
    )
    assert c.choices[0].message.content == ref.content


def test_a_route_answers_errors_in_its_own_shape(toy_srv, model):  # noqa: F811
    r = toy_srv.post("/v1/toy", {"say": 5})
    assert r.status_code == 400
    assert r.json() == {
        "oops": {"kind": "invalid_request_error", "text": "'say' must be a string", "field": "say"}
    }
    # the runner's context check, in the route's shape, with both numbers
    r = toy_srv.post("/v1/toy", {"say": "hi", "most": model.n_ctx})
    assert r.status_code == 400
    e = r.json()["oops"]
    assert e["field"] == "say" and e["limit"] == model.n_ctx and e["tokens"] > model.n_ctx
    # a body that is no JSON, read by the shared part: the route's shape too
    r = toy_srv.post("/v1/toy", content=b"{nope")
    assert r.status_code == 400 and r.json()["oops"]["kind"] == "invalid_request_error"
    # any other path keeps OpenAI's shape
    r = toy_srv.post("/v1/nowhere", {})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    # an OpenAI route's errors stay OpenAI's
    r = toy_srv.post("/v1/chat/completions", {"messages": msgs("hi"), "max_tokens": 10**6})
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_the_registry_lists_the_routes():
    assert [r.path for r in ROUTES] == [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
    ]
    assert route_for("/v1/completions") is ROUTES[1] and route_for("/v1/models") is None
