"""What OpenAI's Chat Completions and Completions routes share: the common request fields,
usage and timings objects, the response head, errors (``{"error": {...}}``) and the stream's
``data: [DONE]`` end."""

from __future__ import annotations

from goinfer.generation import GenerationResult, Timings
from goinfer.server import fields as F
from goinfer.server.errors import APIError, bad
from goinfer.server.request import Request
from goinfer.server.route import ApiRoute, ReplyInfo, sse
from goinfer.speculative import DRAFTS, MAX_DRAFT_TOKENS

__all__ = [
    "OpenAIRoute",
    "Options",
    "COMMON",
    "common_request",
    "usage",
    "timings",
    "combined",
    "SSE_DONE",
]

SSE_DONE = b"data: [DONE]\n\n"
MAX_N = 128  # OpenAI's limit on n (the server's batch size may be lower: a 400 then)

COMMON = {
    "model",
    "stream",
    "stream_options",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "max_tokens",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "repeat_last_n",
    "logit_bias",
    "n",
    "user",
    "cache_salt",
    "return_tokens",
    "grammar",
    "draft",
    "draft_tokens",
}


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
    n = F.integer(body, "n", 1, MAX_N, 1)
    stream = F.boolean(body, "stream", False)
    so = body.get("stream_options")
    include_usage = False
    if so is not None:
        if not isinstance(so, dict) or set(so) - {"include_usage", "include_obfuscation"}:
            raise bad(
                "'stream_options' must be an object with 'include_usage'",
                "stream_options",
                "invalid_type",
            )
        include_usage = F.boolean(so, "include_usage", False)
    top_p = F.number(body, "top_p", 0.0, 1.0, 1.0)
    top_k = F.integer(body, "top_k", 0, None, 0)
    if top_p == 0.0:  # only the most likely token
        top_p, top_k = 1.0, 1
    sampling = dict(
        temperature=F.number(body, "temperature", 0.0, 2.0, 1.0),
        top_p=top_p,
        top_k=top_k,
        min_p=F.number(body, "min_p", 0.0, 1.0, 0.0),
        seed=F.integer(body, "seed", 0, 2**63 - 1, None),
        presence_penalty=F.number(body, "presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=F.number(body, "frequency_penalty", -2.0, 2.0, 0.0),
        repeat_penalty=F.number(body, "repeat_penalty", 0.0, 10.0, 1.0, lo_open=True),
        repeat_last_n=F.integer(body, "repeat_last_n", 0, 1 << 20, 64),
        logit_bias=F.logit_bias(body, vocab_size),
    )
    given = frozenset(k for k in sampling if body.get(k) is not None)
    if body.get("top_p") is not None:  # top_p 0 sets top_k
        given |= {"top_k"}
    max_tokens = F.integer(body, "max_tokens", 1, None, None)
    if kind == "chat":
        mct = F.integer(body, "max_completion_tokens", 1, None, None)
        if mct is not None:
            max_tokens = mct
    g = body.get("grammar")
    if g is not None and not isinstance(g, (str, dict)):
        raise bad(
            "'grammar' must be a Lark grammar string or {'regex': ...}", "grammar", "invalid_type"
        )
    draft = body.get("draft", ...)
    if draft is not ... and draft not in (None, "none", *DRAFTS):
        raise bad(
            f"'draft' must be null, 'none' or one of {list(DRAFTS)}", "draft", "invalid_value"
        )
    return Request(
        kind=kind,
        n=n,
        stream=stream,
        max_tokens=max_tokens,
        sampling=sampling,
        sampling_given=given,
        stops=F.stop_strings(body),
        cache_salt=F.string(body, "cache_salt", max_len=1024),
        options=Options(include_usage and stream, F.boolean(body, "return_tokens", False)),
        grammar=g,
        draft=None if draft is ... else draft in DRAFTS,
        draft_tokens=F.integer(body, "draft_tokens", 1, MAX_DRAFT_TOKENS, None),
    )


# ============================================================================ replies


def usage(result) -> dict:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": result.prompt_tokens + result.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
    }


def timings(result) -> dict:
    """llama.cpp's timings object."""
    t = result.timings
    n_pred = result.completion_tokens
    return {
        "prompt_n": t.prefill_tokens,
        "cache_n": result.cached_tokens,
        "prompt_ms": t.prefill_ms,
        "prompt_per_second": t.prefill_tok_s,
        "predicted_n": n_pred,
        "predicted_ms": t.decode_ms,
        "predicted_per_second": n_pred / t.decode_ms * 1e3 if t.decode_ms > 0 else 0.0,
        "draft_n": t.draft_tokens,
        "draft_n_accepted": t.draft_accepted,
    }


def combined(results: list[GenerationResult], n: int) -> GenerationResult:
    """What usage and timings report for a reply of several choices (n per prompt): each
    prompt counted once (its first choice's prompt counts), the completions of every choice;
    prompt and decode times are the longest (the choices ran together)."""
    if len(results) == 1:
        return results[0]
    firsts = results[::n]
    pre_ms = max(r.timings.prefill_ms for r in firsts)
    dec_ms = max(r.timings.decode_ms for r in results)
    t = Timings(
        prefill_ms=pre_ms,
        decode_ms=dec_ms,
        prefill_tokens=sum(r.timings.prefill_tokens for r in firsts),
        decode_tokens=sum(r.timings.decode_tokens for r in results),
        draft_tokens=sum(r.timings.draft_tokens for r in results),
        draft_accepted=sum(r.timings.draft_accepted for r in results),
    )
    t.prefill_tok_s = t.prefill_tokens / pre_ms * 1e3 if pre_ms > 0 else 0.0
    t.decode_tok_s = t.decode_tokens / dec_ms * 1e3 if dec_ms > 0 else 0.0
    return GenerationResult(
        text="",
        tokens=[],
        finish_reason="stop",
        prompt_tokens=sum(r.prompt_tokens for r in firsts),
        cached_tokens=sum(r.cached_tokens for r in firsts),
        completion_tokens=sum(r.completion_tokens for r in results),
        timings=t,
    )


class OpenAIRoute(ApiRoute):
    """The parts of an OpenAI route's reply both routes shape alike; a route gives one choice
    of it (``choice``)."""

    chunk_object = ""  # the "object" of a stream chunk
    reply_object = ""  # the "object" of the whole reply

    def head(self, info: ReplyInfo, obj: str) -> dict:
        return {
            "id": info.id,
            "object": obj,
            "created": info.created,
            "model": info.model_id,
            "system_fingerprint": info.fingerprint,
        }

    def choice(self, result: GenerationResult, req: Request, index: int) -> dict:
        """One choice of the whole reply (index, message or text, logprobs, finish_reason)."""
        raise NotImplementedError

    def reply(self, result, req: Request, info: ReplyInfo) -> dict:
        return self.reply_all([result], req, info)

    def reply_all(self, results, req: Request, info: ReplyInfo) -> dict:
        """The whole reply: its choices (each saying why a constrained one ended), usage,
        timings, and the tokens when asked for (return_tokens: top-level for one choice, in
        each choice for several)."""
        out = self.head(info, self.reply_object)
        out["choices"] = []
        for i, r in enumerate(results):
            ch = self.choice(r, req, i)
            if r.reason is not None:  # a constrained generation says why it ended
                ch["reason"] = r.reason
            out["choices"].append(ch)
        total = combined(results, req.n)
        out["usage"] = usage(total)
        out["timings"] = timings(total)
        if req.options.return_tokens:
            if len(results) == 1:
                out["tokens"] = list(results[0].tokens)
            else:
                for ch, r in zip(out["choices"], results):
                    ch["tokens"] = list(r.tokens)
        return out

    def end_chunk(self, end: dict, result) -> bytes:
        """A choice's last chunk (with its finish_reason): why a constrained one ended, its
        timings."""
        if result.reason is not None:
            end["choices"][0]["reason"] = result.reason
        end["timings"] = timings(result)
        return sse(end)

    def last_chunks(self, results: list, req: Request, info: ReplyInfo):
        """The stream's end, after every choice's last chunk: the usage chunk when asked for,
        [DONE]."""
        if req.options.include_usage:
            out = self.head(info, self.chunk_object)
            out["choices"] = []
            total = combined(results, req.n)
            out["usage"] = usage(total)
            out["timings"] = timings(total)
            yield sse(out)
        yield SSE_DONE

    def stream_error(self, e: APIError) -> bytes:
        return sse(self.error_body(e)) + SSE_DONE
