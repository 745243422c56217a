"""POST /v1/completions: OpenAI's (legacy) Completions API.

Body -> Request (a raw prompt: text, BOS added, or token ids; or a batch of them, answered in
order, n choices each); events -> ``text_completion`` chunks; logprobs in the legacy shape
(``tokens``, ``token_logprobs``, ``top_logprobs`` as dicts, ``text_offset``).
"""

from __future__ import annotations

from goinfer import logprobs as lp
from goinfer.server import fields as F
from goinfer.server.errors import bad
from goinfer.server.openai import COMMON, OpenAIRoute, common_request
from goinfer.server.request import Done, Failed, Ping, Request, TextDelta
from goinfer.server.route import SSE_PING, ReplyInfo, sse

__all__ = ["Completions", "COMPLETION_ONLY"]

COMPLETION_ONLY = {"prompt", "echo", "logprobs", "suffix", "best_of"}
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
MAX_PROMPTS = 64  # prompts in one batch


class Completions(OpenAIRoute):
    path = "/v1/completions"
    id_prefix = "cmpl-"
    chunk_object = "text_completion"
    reply_object = "text_completion"

    def parse(self, body: dict, vocab_size: int) -> Request:
        req = common_request(body, "completion", COMMON | COMPLETION_ONLY, vocab_size)
        req.prompt_param = "prompt"
        p = body.get("prompt")
        if isinstance(p, list) and p and all(isinstance(x, (str, list)) for x in p):
            batch = p  # a batch: strings or lists of token ids
        else:
            batch = [p]
        if len(batch) > MAX_PROMPTS:
            raise bad(
                f"at most {MAX_PROMPTS} prompts per request, got {len(batch)}",
                "prompt",
                "invalid_value",
            )
        for x in batch:
            _check_prompt(x, vocab_size)
        req.prompt = batch[0]
        if len(batch) > 1:
            req.prompts = batch
        if req.max_tokens is None:
            req.max_tokens = DEFAULT_MAX_TOKENS
        if F.boolean(body, "echo", False):
            raise bad("echo is not supported", "echo", "unsupported_value")
        n = F.integer(body, "logprobs", 0, lp.MAX_TOP_LOGPROBS, None)  # an int, or null
        req.logprobs, req.top_logprobs = n is not None, n or 0
        if body.get("suffix") is not None:
            raise bad("suffix is not supported", "suffix", "unsupported_value")
        if F.integer(body, "best_of", 1, None, 1) != 1:
            raise bad("only best_of=1 is supported", "best_of", "unsupported_value")
        return req

    def choice(self, result, req: Request, index: int) -> dict:
        entries = result.logprobs["content"] if result.logprobs is not None else None
        return {
            "index": index,
            "text": result.text,
            "logprobs": _logprobs(entries),
            "finish_reason": result.finish_reason,
        }

    def chunk(
        self,
        req: Request,
        info: ReplyInfo,
        text: str,
        logprobs=None,
        offset: int = 0,
        finish: str | None = None,
        choice: int = 0,
    ) -> dict:
        """logprobs: the entries of this chunk's tokens; offset: characters of completion text
        sent before it (the legacy text_offset)."""
        out = self.head(info, self.chunk_object)
        out["choices"] = [
            {
                "index": choice,
                "text": text,
                "logprobs": _logprobs(logprobs, offset),
                "finish_reason": finish,
            }
        ]
        if req.options.include_usage:
            out["usage"] = None
        return out

    async def stream(self, events, req: Request, info: ReplyInfo):
        for i in range(req.n_choices):
            yield sse(self.chunk(req, info, "", choice=i))
        sent: dict[int, int] = {}  # characters of completion text sent, per choice
        results = {}
        async for ev in events:
            if isinstance(ev, Ping):
                yield SSE_PING
            elif isinstance(ev, TextDelta):
                at = sent.get(ev.choice, 0)
                yield sse(self.chunk(req, info, ev.text, ev.logprobs, at, choice=ev.choice))
                sent[ev.choice] = at + len(ev.text)
            elif isinstance(ev, Done):
                end = self.chunk(
                    req, info, "", ev.logprobs, finish=ev.result.finish_reason, choice=ev.choice
                )
                yield self.end_chunk(end, ev.result)
                results[ev.choice] = ev.result
                if len(results) == req.n_choices:
                    for x in self.last_chunks([results[i] for i in sorted(results)], req, info):
                        yield x
            elif isinstance(ev, Failed):
                yield self.stream_error(ev.error)


def _check_prompt(p, vocab_size: int) -> None:
    """One prompt: a non-empty string or list of token ids of the vocabulary (400 naming
    prompt)."""
    if isinstance(p, str):
        if not p:
            raise bad("'prompt' is empty", "prompt", "invalid_value")
    elif isinstance(p, list) and p and all(F.is_int(t) for t in p):
        if not all(0 <= t < vocab_size for t in p):
            raise bad(
                f"'prompt' token ids must be in 0..{vocab_size - 1}", "prompt", "invalid_value"
            )
    else:
        raise bad(
            "'prompt' must be a non-empty string, a list of token ids, or a list of those",
            "prompt",
            "invalid_type",
        )


def _logprobs(entries: list[dict] | None, offset: int = 0):
    return None if entries is None else lp.legacy(entries, offset)


ROUTE = Completions()
