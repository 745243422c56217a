"""What OpenAI's Chat Completions and Completions routes share: the common request fields,
usage and timings objects, the response head, errors (``{"error": {...}}``) and the stream's
``data: [DONE]`` end."""
from __future__ import annotations

from goinfer.server import fields as F
from goinfer.server.errors import APIError, bad
from goinfer.server.request import Request
from goinfer.server.route import ApiRoute, ReplyInfo, sse
from goinfer.speculative import DRAFTS, MAX_DRAFT_TOKENS

__all__ = ["OpenAIRoute", "Options", "COMMON", "common_request", "usage", "timings", "SSE_DONE"]

SSE_DONE = b"data: [DONE]\n\n"

COMMON = {"model", "stream", "stream_options", "temperature", "top_p", "top_k", "min_p", "seed",
          "stop", "max_tokens", "presence_penalty", "frequency_penalty", "repeat_penalty",
          "repeat_last_n", "logit_bias", "n", "user", "cache_salt", "return_tokens", "grammar",
          "draft", "draft_tokens"}


class Options:
    """How an OpenAI reply is shaped (Request.options)."""

    def __init__(self, include_usage: bool = False, return_tokens: bool = False):
        self.include_usage = include_usage  # stream_options.include_usage: a usage chunk
        self.return_tokens = return_tokens  # goinfer's extension: the reply's token ids
        self.functions = False  # chat: the deprecated functions API (message.function_call)


def common_request(body: dict, kind: str, allowed: set[str], vocab_size: int) -> Request:
    """The fields both routes take -> a Request of `kind` (its prompt still to be set)."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    for k in body:
        if k not in allowed:
            raise bad(f"unrecognized request argument supplied: {k}", k, "unknown_parameter")
    F.string(body, "model")
    F.string(body, "user")
    if F.integer(body, "n", 1, None, 1) != 1:
        raise bad("only n=1 is supported", "n", "unsupported_value")
    stream = F.boolean(body, "stream", False)
    so = body.get("stream_options")
    include_usage = False
    if so is not None:
        if not isinstance(so, dict) or set(so) - {"include_usage", "include_obfuscation"}:
            raise bad("'stream_options' must be an object with 'include_usage'",
                      "stream_options", "invalid_type")
        include_usage = F.boolean(so, "include_usage", False)
    top_p = F.number(body, "top_p", 0.0, 1.0, 1.0)
    top_k = F.integer(body, "top_k", 0, None, 0)
    if top_p == 0.0:  # only the most likely token
        top_p, top_k = 1.0, 1
    sampling = dict(
        temperature=F.number(body, "temperature", 0.0, 2.0, 1.0),
        top_p=top_p, top_k=top_k,
        min_p=F.number(body, "min_p", 0.0, 1.0, 0.0),
        seed=F.integer(body, "seed", 0, 2**63 - 1, None),
        presence_penalty=F.number(body, "presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=F.number(body, "frequency_penalty", -2.0, 2.0, 0.0),
        repeat_penalty=F.number(body, "repeat_penalty", 0.0, 10.0, 1.0, lo_open=True),
        repeat_last_n=F.integer(body, "repeat_last_n", 0, 1 << 20, 64),
        logit_bias=F.logit_bias(body, vocab_size),
    )
    max_tokens = F.integer(body, "max_tokens", 1, None, None)
    if kind == "chat":
        mct = F.integer(body, "max_completion_tokens", 1, None, None)
        if mct is not None:
            max_tokens = mct
    g = body.get("grammar")
    if g is not None and not isinstance(g, (str, dict)):
        raise bad("'grammar' must be a Lark grammar string or {'regex': ...}", "grammar",
                  "invalid_type")
    draft = body.get("draft", ...)
    if draft is not ... and draft not in (None, "none", *DRAFTS):
        raise bad(f"'draft' must be null, 'none' or one of {list(DRAFTS)}", "draft",
                  "invalid_value")
    return Request(kind=kind, stream=stream, max_tokens=max_tokens, sampling=sampling,
                   stops=F.stop_strings(body),
                   cache_salt=F.string(body, "cache_salt", max_len=1024),
                   options=Options(include_usage and stream,
                                   F.boolean(body, "return_tokens", False)),
                   grammar=g, draft=None if draft is ... else draft in DRAFTS,
                   draft_tokens=F.integer(body, "draft_tokens", 1, MAX_DRAFT_TOKENS, None))


# ============================================================================ replies


def usage(result) -> dict:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": result.cached_tokens}}


def timings(result) -> dict:
    """llama.cpp's timings object."""
    t = result.timings
    n_pred = result.completion_tokens
    return {"prompt_n": t.prefill_tokens, "cache_n": result.cached_tokens,
            "prompt_ms": t.prefill_ms, "prompt_per_second": t.prefill_tok_s,
            "predicted_n": n_pred, "predicted_ms": t.decode_ms,
            "predicted_per_second": n_pred / t.decode_ms * 1e3 if t.decode_ms > 0 else 0.0,
            "draft_n": t.draft_tokens, "draft_n_accepted": t.draft_accepted}


class OpenAIRoute(ApiRoute):
    """The parts of an OpenAI route's reply both routes shape alike."""

    chunk_object = ""  # the "object" of a stream chunk

    def head(self, info: ReplyInfo, obj: str) -> dict:
        return {"id": info.id, "object": obj, "created": info.created, "model": info.model_id,
                "system_fingerprint": info.fingerprint}

    def finish_reply(self, out: dict, result, req: Request) -> dict:
        """The end of a whole reply: why a constrained one ended, usage, timings, tokens."""
        if result.reason is not None:  # a constrained generation says why it ended
            out["choices"][0]["reason"] = result.reason
        out["usage"] = usage(result)
        out["timings"] = timings(result)
        if req.options.return_tokens:
            out["tokens"] = list(result.tokens)
        return out

    def last_chunks(self, end: dict, result, req: Request, info: ReplyInfo):
        """The stream's end: the chunk with finish_reason (and timings), the usage chunk when
        asked for, [DONE]."""
        if result.reason is not None:
            end["choices"][0]["reason"] = result.reason
        end["timings"] = timings(result)
        yield sse(end)
        if req.options.include_usage:
            out = self.head(info, self.chunk_object)
            out["choices"] = []
            out["usage"] = usage(result)
            out["timings"] = timings(result)
            yield sse(out)
        yield SSE_DONE

    def stream_error(self, e: APIError) -> bytes:
        return sse(self.error_body(e)) + SSE_DONE
