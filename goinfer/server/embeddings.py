"""POST /v1/embeddings: OpenAI's Embeddings API, for models that are embedding models
(goinfer/embeddings.py: pooling from the GGUF, L2-normalised).

    {"model", "input": str | [str] | [id] | [[id]], "encoding_format": "float" | "base64",
     "dimensions": d_model, "user"}
    -> {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
        "usage": {"prompt_tokens", "total_tokens"}}

A text is tokenized with the model's special tokens (BOS, and EOS where the GGUF asks for it);
token ids are taken as given.  A model that is not an embedding model is a 400 naming
``model``.  The vectors are computed in a worker thread, between two of the engine's steps.
"""

from __future__ import annotations

import base64

import numpy as np
from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from starlette.concurrency import run_in_threadpool

from goinfer.embeddings import embed
from goinfer.errors import ContextLengthError, RequestError
from goinfer.server import fields as F
from goinfer.server.errors import bad
from goinfer.server.route import Served, authorize, read_json

__all__ = ["mount", "FIELDS", "MAX_INPUTS"]

FIELDS = {"model", "input", "encoding_format", "dimensions", "user"}
MAX_INPUTS = 2048  # OpenAI's limit


def mount(app: FastAPI, srv: Served) -> None:
    model = srv.runner.model

    @app.post("/v1/embeddings")
    async def embeddings(request: HTTPRequest):
        authorize(request.headers, srv.api_key)
        body = await read_json(request, srv.max_body)
        inputs, fmt = _parse(body, model)
        if model.pooling is None:
            raise bad(
                f"the model {srv.model_id!r} is not an embedding model (its GGUF has no "
                "mean, CLS or last-token pooling)",
                "model",
                "invalid_value",
            )

        def run():
            ids = [model.tokenize(x, add_special=True) if isinstance(x, str) else x for x in inputs]
            return ids, embed(model, ids)

        try:
            ids, vecs = await run_in_threadpool(run)
        except ContextLengthError as e:
            raise bad(str(e), "input", "context_length_exceeded", e) from None
        except RequestError as e:
            raise bad(str(e), e.param, "invalid_value", e) from None
        n = sum(len(x) for x in ids)
        srv.counts.add("/v1/embeddings", 200)
        return {
            "object": "list",
            "model": srv.model_id,
            "data": [
                {"object": "embedding", "index": i, "embedding": _encoded(v, fmt)}
                for i, v in enumerate(vecs)
            ],
            "usage": {"prompt_tokens": n, "total_tokens": n},
        }


def _parse(body, model) -> tuple[list, str]:
    """(the inputs: strings or token-id lists, the encoding format); 400 naming the field."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    for k in body:
        if k not in FIELDS:
            raise bad(f"unrecognized request argument supplied: {k}", k, "unknown_parameter")
    F.string(body, "model")
    F.string(body, "user")
    x = body.get("input")
    if isinstance(x, str) or (isinstance(x, list) and x and all(F.is_int(t) for t in x)):
        inputs = [x]
    elif isinstance(x, list) and x and all(isinstance(t, (str, list)) for t in x):
        inputs = x
    else:
        raise bad(
            "'input' must be a string, a list of strings, a list of token ids or a list of those",
            "input",
            "invalid_type",
        )
    if len(inputs) > MAX_INPUTS:
        raise bad(f"at most {MAX_INPUTS} inputs, got {len(inputs)}", "input", "invalid_value")
    for t in inputs:
        if isinstance(t, list) and not (
            t and all(F.is_int(i) and 0 <= i < model.vocab_size for i in t)
        ):
            raise bad(
                f"token ids must be a non-empty list in 0..{model.vocab_size - 1}",
                "input",
                "invalid_value",
            )
        if isinstance(t, str) and not t:
            raise bad("an input is empty", "input", "invalid_value")
    fmt = body.get("encoding_format") or "float"
    if fmt not in ("float", "base64"):
        raise bad(
            "'encoding_format' must be 'float' or 'base64'", "encoding_format", "invalid_value"
        )
    d = F.integer(body, "dimensions", 1, None, None)
    if d is not None and d != model.config.d_model:
        raise bad(
            f"this model's embeddings have {model.config.d_model} dimensions (no other "
            "size is offered)",
            "dimensions",
            "unsupported_value",
        )
    return inputs, fmt


def _encoded(v: np.ndarray, fmt: str):
    """A vector as OpenAI sends it: floats, or base64 of little-endian float32."""
    if fmt == "base64":
        return base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
    return v.astype(np.float64).tolist()
