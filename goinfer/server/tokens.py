"""POST /tokenize and /detokenize, in llama.cpp's server shapes: the token ids goinfer would
use, for clients that count context.

    {"content": str, "add_special": false, "parse_special": true, "with_pieces": false}
        -> {"tokens": [id, ...]}  (with_pieces: [{"id": id, "piece": str}, ...])
    {"messages": [...], "tools": ..., ...}   (a Chat Completions body)
        -> {"tokens": [...]}: the chat prompt exactly as /v1/chat/completions renders it
    {"tokens": [id, ...]}  -> {"content": str}  (special tokens written out)
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from starlette.concurrency import run_in_threadpool

from goinfer.server import fields as F
from goinfer.server import openai_chat
from goinfer.server.errors import bad
from goinfer.server.route import Served, authorize, read_json
from goinfer.server.runner import prompt_ids

__all__ = ["mount", "TOKENIZE", "DETOKENIZE"]

TOKENIZE = {"content", "add_special", "parse_special", "with_pieces"}
DETOKENIZE = {"tokens"}


def mount(app: FastAPI, srv: Served) -> None:
    model = srv.runner.model

    async def body_of(request: HTTPRequest) -> dict:
        authorize(request.headers, srv.api_key)
        body = await read_json(request, srv.max_body)
        if not isinstance(body, dict):
            raise bad("the request body must be a JSON object")
        return body

    @app.post("/tokenize")
    async def tokenize(request: HTTPRequest):
        body = await body_of(request)
        if "messages" in body:  # a chat request: its prompt as the chat route renders it
            req = openai_chat.ROUTE.parse(body, model.vocab_size)
            ids, _ = await run_in_threadpool(prompt_ids, model, req)
            srv.counts.add("/tokenize", 200)
            return {"tokens": ids}
        _only(body, TOKENIZE)
        text = F.string(body, "content", max_len=srv.max_body)
        if text is None:
            raise bad("'content' (a string) or 'messages' is required", "content", "invalid_value")
        ids = await run_in_threadpool(
            model.tokenize,
            text,
            F.boolean(body, "add_special", False),
            F.boolean(body, "parse_special", True),
        )
        srv.counts.add("/tokenize", 200)
        if F.boolean(body, "with_pieces", False):
            tok = model.tokenizer
            return {"tokens": [{"id": i, "piece": _piece(tok.token_bytes(i))} for i in ids]}
        return {"tokens": ids}

    @app.post("/detokenize")
    async def detokenize(request: HTTPRequest):
        body = await body_of(request)
        _only(body, DETOKENIZE)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(F.is_int(t) for t in ids):
            raise bad("'tokens' must be a list of token ids", "tokens", "invalid_type")
        if not all(0 <= t < model.vocab_size for t in ids):
            raise bad(f"'tokens' must be in 0..{model.vocab_size - 1}", "tokens", "invalid_value")
        srv.counts.add("/detokenize", 200)
        return {"content": model.detokenize(ids)}


def _only(body: dict, allowed: set[str]) -> None:
    for k in body:
        if k not in allowed:
            raise bad(f"unrecognized request argument supplied: {k}", k, "unknown_parameter")


def _piece(b: bytes) -> str | list[int]:
    """A token's text, or its bytes where they are not UTF-8 on their own (as llama.cpp)."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)
