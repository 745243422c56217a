"""POST /v1/chat/completions: OpenAI's Chat Completions API.

Body -> Request (the messages in the chat layer's form, tools, response_format, reasoning
settings); events -> ``chat.completion.chunk`` objects (``delta.content``,
``delta.reasoning_content``, ``delta.tool_calls``); the whole result -> a ``chat.completion``.
"""

from __future__ import annotations

import json

from goinfer import logprobs as lp
from goinfer.chat.spec import ToolCallDelta, check_tools
from goinfer.errors import ToolError
from goinfer.server import fields as F
from goinfer.server import openai_functions as legacy
from goinfer.server.errors import bad
from goinfer.server.openai import COMMON, OpenAIRoute, common_request
from goinfer.server.request import Done, Failed, Ping, ReasoningDelta, Request, TextDelta
from goinfer.server.route import SSE_PING, ReplyInfo, sse

__all__ = ["ChatCompletions", "CHAT_ONLY", "ROLES"]

CHAT_ONLY = {
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_completion_tokens",
    "response_format",
    "logprobs",
    "top_logprobs",
    "store",
    "metadata",
    "service_tier",
    "chat_template_kwargs",
    "functions",
    "function_call",
    # accepted and ignored: hints that do not change what a local model computes
    "reasoning_effort",
    "verbosity",
    "modalities",
    "prompt_cache_key",
    "safety_identifier",
    "prompt_cache_retention",
    "prompt_cache_options",
    "prediction",
    # accepted when null (no audio, web search or moderation here)
    "audio",
    "web_search_options",
    "moderation",
}
ROLES = {"system", "developer", "user", "assistant", "tool"}
NOT_HERE = {"audio": "audio output", "web_search_options": "web search", "moderation": "moderation"}
CACHE_RETENTIONS = ("in_memory", "24h")
RESERVED_TEMPLATE_VARS = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
EFFORTS = ("low", "medium", "high")


class ChatCompletions(OpenAIRoute):
    path = "/v1/chat/completions"
    id_prefix = "chatcmpl-"
    chunk_object = "chat.completion.chunk"
    reply_object = "chat.completion"

    # ------------------------------------------------------------------ request

    def parse(self, body: dict, vocab_size: int) -> Request:
        req = common_request(body, "chat", COMMON | CHAT_ONLY, vocab_size)
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise bad(
                "'messages' must be a non-empty list",
                "messages",
                "invalid_type" if not isinstance(msgs, list) else "invalid_value",
            )
        req.messages = [_message(m, f"messages[{i}]") for i, m in enumerate(legacy.history(msgs))]
        tools, choice, parallel, functions = legacy.tool_fields(body)
        try:
            check_tools(tools, choice, parallel)
        except ToolError as e:
            raise bad(
                str(e), legacy.param(e.param) if functions else e.param, "invalid_value"
            ) from None
        req.tools, req.tool_choice, req.parallel_tool_calls = tools or None, choice, parallel
        req.options.functions = functions
        F.boolean(body, "store", False)
        _unhonoured(body)
        rf = body.get("response_format")
        if rf is not None and not isinstance(rf, dict):
            raise bad("'response_format' must be an object", "response_format", "invalid_type")
        req.response_format = rf  # its contents are checked when it is compiled
        req.template_kwargs = _template_kwargs(body)
        req.logprobs = F.boolean(body, "logprobs", False)
        req.top_logprobs = F.integer(body, "top_logprobs", 0, lp.MAX_TOP_LOGPROBS, 0)
        if req.top_logprobs and not req.logprobs:
            raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs", "invalid_value")
        return req

    # ------------------------------------------------------------------ reply

    def choice(self, result, req: Request, index: int) -> dict:
        message = {"role": "assistant", "content": result.content}
        if result.reasoning_content is not None:
            message["reasoning_content"] = result.reasoning_content
        if result.tool_calls:
            message["tool_calls"] = result.tool_calls
        finish = result.finish_reason
        if req.options.functions:
            message, finish = legacy.reply_message(message), legacy.finish_reason(finish)
        entries = result.logprobs["content"] if result.logprobs is not None else None
        return {
            "index": index,
            "message": message,
            "logprobs": _logprobs(entries),
            "finish_reason": finish,
        }

    def chunk(
        self,
        req: Request,
        info: ReplyInfo,
        delta: dict,
        logprobs=None,
        finish: str | None = None,
        choice: int = 0,
    ) -> dict:
        out = self.head(info, self.chunk_object)
        out["choices"] = [
            {
                "index": choice,
                "delta": delta,
                "logprobs": _logprobs(logprobs),
                "finish_reason": finish,
            }
        ]
        if req.options.include_usage:
            out["usage"] = None
        return out

    async def stream(self, events, req: Request, info: ReplyInfo):
        for i in range(req.n_choices):
            yield sse(self.chunk(req, info, {"role": "assistant", "content": ""}, choice=i))
        results = {}
        async for ev in events:
            if isinstance(ev, Ping):
                yield SSE_PING
            elif isinstance(ev, TextDelta):
                yield sse(
                    self.chunk(req, info, {"content": ev.text}, ev.logprobs, choice=ev.choice)
                )
            elif isinstance(ev, ReasoningDelta):
                yield sse(
                    self.chunk(
                        req, info, {"reasoning_content": ev.text}, ev.logprobs, choice=ev.choice
                    )
                )
            elif isinstance(ev, ToolCallDelta):
                delta = (
                    legacy.stream_delta(ev)
                    if req.options.functions
                    else {"tool_calls": [ev.as_openai()]}
                )
                yield sse(self.chunk(req, info, delta, ev.logprobs, choice=ev.choice))
            elif isinstance(ev, Done):
                finish = ev.result.finish_reason
                if req.options.functions:
                    finish = legacy.finish_reason(finish)
                yield self.end_chunk(
                    self.chunk(req, info, {}, ev.logprobs, finish, ev.choice), ev.result
                )
                results[ev.choice] = ev.result
                if len(results) == req.n_choices:
                    for x in self.last_chunks([results[i] for i in sorted(results)], req, info):
                        yield x
            elif isinstance(ev, Failed):
                yield self.stream_error(ev.error)


def _logprobs(entries: list[dict] | None):
    return None if entries is None else {"content": entries, "refusal": None}


# ============================================================================ request fields


def _message(m, where: str) -> dict:
    """A message as the chat layer takes it: "developer" is "system", content is text."""
    if not isinstance(m, dict):
        raise bad(f"{where} must be an object", "messages", "invalid_type")
    role = m.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise bad(
            f"{where}: 'role' must be one of {sorted(ROLES)}, got {role!r}",
            "messages",
            "invalid_value",
        )
    msg = dict(m)
    msg["role"] = "system" if role == "developer" else role
    msg["content"] = _text_content(m.get("content"), where)
    if m.get("tool_calls") is not None:
        if role != "assistant":
            raise bad(
                f"{where}: only assistant messages have 'tool_calls'", "messages", "invalid_value"
            )
        _check_tool_calls(m["tool_calls"], where)
    if msg["content"] is None and not (role == "assistant" and m.get("tool_calls")):
        raise bad(f"{where}: 'content' is required", "messages", "invalid_value")
    return msg


def _text_content(content, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if (
                not isinstance(p, dict)
                or p.get("type") != "text"
                or not isinstance(p.get("text"), str)
            ):
                kind = p.get("type") if isinstance(p, dict) else type(p).__name__
                raise bad(
                    f"{where}: only text content parts are supported (got {kind!r})",
                    "messages",
                    "unsupported_content",
                )
            parts.append(p["text"])
        return "".join(parts)
    raise bad(
        f"{where}: 'content' must be a string, a list of text parts or null",
        "messages",
        "invalid_type",
    )


def _check_tool_calls(calls, where: str) -> None:
    """An assistant message's tool_calls, in OpenAI's shape."""
    if not isinstance(calls, list):
        raise bad(f"{where}: 'tool_calls' must be a list", "messages", "invalid_type")
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if (
            not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
            or not isinstance(fn.get("arguments", ""), str)
            or not isinstance(c.get("id", ""), str)
        ):
            raise bad(
                f"{where}.tool_calls[{j}] must be {{'id': str, 'type': 'function', "
                "'function': {'name': str, 'arguments': str}}",
                "messages",
                "invalid_value",
            )


def _unhonoured(body: dict) -> None:
    """OpenAI's fields goinfer does not act on: null (clients that fill in every field send
    them) or a value that cannot change the reply is accepted (cache hints, a predicted
    output); a value that would change it is a 400 naming the field."""
    for name, what in NOT_HERE.items():
        if body.get(name) is not None:
            raise bad(
                f"'{name}' is not supported: goinfer has no {what}", name, "unsupported_value"
            )
    mods = body.get("modalities")
    if mods is not None:
        if not isinstance(mods, list) or not all(isinstance(m, str) for m in mods):
            raise bad("'modalities' must be a list of strings", "modalities", "invalid_type")
        if set(mods) - {"text"}:
            raise bad(
                "only text output is supported ('modalities': ['text'])",
                "modalities",
                "unsupported_value",
            )
    pred = body.get("prediction")  # a predicted output makes OpenAI's reply faster, not other
    if pred is not None and not (
        isinstance(pred, dict)
        and set(pred) == {"type", "content"}
        and pred["type"] == "content"
        and _is_text(pred["content"])
    ):
        raise bad(
            "'prediction' must be {'type': 'content', 'content': a string or text parts}",
            "prediction",
            "invalid_value",
        )
    ret = body.get("prompt_cache_retention")
    if ret is not None and ret not in CACHE_RETENTIONS:
        raise bad(
            f"'prompt_cache_retention' must be one of {list(CACHE_RETENTIONS)}, got "
            f"{json.dumps(ret)[:40]}",
            "prompt_cache_retention",
            "invalid_value",
        )
    opts = body.get("prompt_cache_options")
    if opts is not None and (
        not isinstance(opts, dict)
        or set(opts) - {"mode", "ttl"}
        or opts.get("mode") not in (None, "implicit", "explicit")
        or not isinstance(opts.get("ttl", ""), str)
    ):
        raise bad(
            "'prompt_cache_options' must be {'mode': 'implicit' | 'explicit', 'ttl': str}",
            "prompt_cache_options",
            "invalid_value",
        )


def _is_text(content) -> bool:
    """Is content a string or a list of text parts?"""
    return (
        isinstance(content, str)
        or isinstance(content, list)
        and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        )
    )


def _template_kwargs(body: dict) -> dict:
    """chat_template_kwargs (vLLM's and llama.cpp's field: variables for the chat template,
    e.g. {"enable_thinking": false}) and reasoning_effort (gpt-oss's template reads it)."""
    kw = body.get("chat_template_kwargs")
    if kw is None:
        kw = {}
    if not isinstance(kw, dict):
        raise bad(
            "'chat_template_kwargs' must be an object", "chat_template_kwargs", "invalid_type"
        )
    bad_keys = sorted(k for k in kw if k in RESERVED_TEMPLATE_VARS or not k.isidentifier())
    if bad_keys:
        raise bad(
            f"'chat_template_kwargs' cannot set {bad_keys}", "chat_template_kwargs", "invalid_value"
        )
    kw = dict(kw)
    effort = body.get("reasoning_effort")
    if effort is not None and not isinstance(effort, str):
        raise bad(
            f"'reasoning_effort' must be a string, got {json.dumps(effort)[:40]}",
            "reasoning_effort",
            "invalid_type",
        )
    if effort in EFFORTS:  # other levels (OpenAI's "minimal", ...): no template knows them
        kw.setdefault("reasoning_effort", effort)
    return kw


ROUTE = ChatCompletions()
