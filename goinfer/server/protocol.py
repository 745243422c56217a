"""OpenAI request validation and response shapes.

A request body is checked field by field: a field of the wrong type or out of range, an
unknown field, or a feature goinfer does not have raises APIError (HTTP 400 with an
OpenAI-style error body naming the parameter).  Booleans are never accepted as numbers.
"""
from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field

from goinfer import logprobs as lp
from goinfer.errors import ToolError
from goinfer.chat.spec import check_tools
from goinfer.speculative import DRAFTS, MAX_DRAFT_TOKENS

MAX_STOPS = 16
MAX_STOP_LEN = 1000

# ============================================================================ errors


class APIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


# ============================================================================ field checks


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    if isinstance(v, bool):
        return False
    return _is_int(v) or (isinstance(v, float) and math.isfinite(v))


def _number(body: dict, name: str, lo: float, hi: float, default, *, lo_open: bool = False):
    v = body.get(name)
    if v is None:
        return default
    if not _is_num(v):
        raise bad(f"'{name}' must be a number, got {json.dumps(v)[:40]}", name, "invalid_type")
    if v < lo or v > hi or (lo_open and v == lo):
        left = "(" if lo_open else "["
        raise bad(f"'{name}' must be in {left}{lo}, {hi}], got {v}", name, "invalid_value")
    return float(v)


def _integer(body: dict, name: str, lo: int, hi: int | None, default):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, float) and v.is_integer() and not isinstance(v, bool):
        v = int(v)
    if not _is_int(v):
        raise bad(f"'{name}' must be an integer, got {json.dumps(v)[:40]}", name, "invalid_type")
    if v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise bad(f"'{name}' must be an integer {rng}, got {v}", name, "invalid_value")
    return v


def _boolean(body: dict, name: str, default: bool) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise bad(f"'{name}' must be a boolean, got {json.dumps(v)[:40]}", name, "invalid_type")
    return v


def _string(body: dict, name: str, default=None, max_len: int = 1 << 16):
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, str):
        raise bad(f"'{name}' must be a string, got {json.dumps(v)[:40]}", name, "invalid_type")
    if len(v) > max_len:
        raise bad(f"'{name}' is longer than {max_len} characters", name, "invalid_value")
    return v


def _stops(body: dict) -> list[str]:
    v = body.get("stop")
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise bad("'stop' must be a string or a list of strings", "stop", "invalid_type")
    if len(v) > MAX_STOPS:
        raise bad(f"'stop' has {len(v)} sequences; at most {MAX_STOPS}", "stop", "invalid_value")
    if any(len(s) > MAX_STOP_LEN for s in v):
        raise bad(f"a stop sequence is longer than {MAX_STOP_LEN} characters", "stop",
                  "invalid_value")
    return [s for s in v if s]


def _logit_bias(body: dict, vocab_size: int) -> dict[int, float] | None:
    v = body.get("logit_bias")
    if v is None:
        return None
    if not isinstance(v, dict):
        raise bad("'logit_bias' must be an object mapping token ids to numbers", "logit_bias",
                  "invalid_type")
    out = {}
    for k, x in v.items():
        try:
            tid = int(k)
        except (TypeError, ValueError):
            raise bad(f"'logit_bias' key {k!r} is not a token id", "logit_bias",
                      "invalid_value") from None
        if not 0 <= tid < vocab_size:
            raise bad(f"'logit_bias' token id {tid} is out of range 0..{vocab_size - 1}",
                      "logit_bias", "invalid_value")
        if not _is_num(x) or not -100 <= x <= 100:
            raise bad(f"'logit_bias' value for {tid} must be a number in [-100, 100]",
                      "logit_bias", "invalid_value")
        out[tid] = float(x)
    return out


# ============================================================================ requests


@dataclass
class GenRequest:
    kind: str  # "chat" | "completion"
    stream: bool
    include_usage: bool
    max_tokens: int | None  # None: up to the context
    sampling: dict  # keyword arguments of SamplingParams
    stops: list[str]
    cache_salt: str | None
    return_tokens: bool
    messages: list[dict] = field(default_factory=list)
    tools: list | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    prompt: str | list[int] | None = None
    draft: bool | None = None  # speculative drafting on / off (None: the server's default)
    draft_tokens: int | None = None  # tokens per draft (None: the server's)
    response_format: dict | None = None  # compiled by the handler (constrained.py)
    grammar: str | dict | None = None  # goinfer's extension: Lark, {"regex": ...}
    logprobs: bool = False
    top_logprobs: int = 0
    template_kwargs: dict = field(default_factory=dict)  # chat_template_kwargs (+ effort)


COMMON = {"model", "stream", "stream_options", "temperature", "top_p", "top_k", "min_p", "seed",
          "stop", "max_tokens", "presence_penalty", "frequency_penalty", "repeat_penalty",
          "repeat_last_n", "logit_bias", "n", "user", "cache_salt", "return_tokens", "grammar",
          "draft", "draft_tokens"}
CHAT_ONLY = {"messages", "tools", "tool_choice", "parallel_tool_calls", "max_completion_tokens",
             "response_format", "logprobs", "top_logprobs", "store", "metadata", "service_tier",
             "chat_template_kwargs",
             # accepted and ignored: hints that do not change what a local model computes
             "reasoning_effort", "verbosity", "modalities", "prompt_cache_key",
             "safety_identifier"}
COMPLETION_ONLY = {"prompt", "echo", "logprobs", "suffix", "best_of"}
ROLES = {"system", "developer", "user", "assistant", "tool"}


def _common(body: dict, kind: str, vocab_size: int) -> GenRequest:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    allowed = COMMON | (CHAT_ONLY if kind == "chat" else COMPLETION_ONLY)
    for k in body:
        if k not in allowed:
            raise bad(f"unrecognized request argument supplied: {k}", k, "unknown_parameter")
    _string(body, "model")
    _string(body, "user")
    if _integer(body, "n", 1, None, 1) != 1:
        raise bad("only n=1 is supported", "n", "unsupported_value")
    stream = _boolean(body, "stream", False)
    so = body.get("stream_options")
    include_usage = False
    if so is not None:
        if not isinstance(so, dict) or set(so) - {"include_usage", "include_obfuscation"}:
            raise bad("'stream_options' must be an object with 'include_usage'",
                      "stream_options", "invalid_type")
        include_usage = _boolean(so, "include_usage", False)
    top_p = _number(body, "top_p", 0.0, 1.0, 1.0)
    top_k = _integer(body, "top_k", 0, None, 0)
    if top_p == 0.0:  # only the most likely token
        top_p, top_k = 1.0, 1
    sampling = dict(
        temperature=_number(body, "temperature", 0.0, 2.0, 1.0),
        top_p=top_p, top_k=top_k,
        min_p=_number(body, "min_p", 0.0, 1.0, 0.0),
        seed=_integer(body, "seed", 0, 2**63 - 1, None),
        presence_penalty=_number(body, "presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=_number(body, "frequency_penalty", -2.0, 2.0, 0.0),
        repeat_penalty=_number(body, "repeat_penalty", 0.0, 10.0, 1.0, lo_open=True),
        repeat_last_n=_integer(body, "repeat_last_n", 0, 1 << 20, 64),
        logit_bias=_logit_bias(body, vocab_size),
    )
    max_tokens = _integer(body, "max_tokens", 1, None, None)
    if kind == "chat":
        mct = _integer(body, "max_completion_tokens", 1, None, None)
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
    return GenRequest(kind=kind, stream=stream, include_usage=include_usage and stream,
                      max_tokens=max_tokens, sampling=sampling, stops=_stops(body),
                      cache_salt=_string(body, "cache_salt", max_len=1024),
                      return_tokens=_boolean(body, "return_tokens", False), grammar=g,
                      draft=None if draft is ... else draft in DRAFTS,
                      draft_tokens=_integer(body, "draft_tokens", 1, MAX_DRAFT_TOKENS, None))


def _text_content(content, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                kind = p.get("type") if isinstance(p, dict) else type(p).__name__
                raise bad(f"{where}: only text content parts are supported (got {kind!r})",
                          "messages", "unsupported_content")
            parts.append(p["text"])
        return "".join(parts)
    raise bad(f"{where}: 'content' must be a string, a list of text parts or null", "messages",
              "invalid_type")


def parse_chat(body: dict, vocab_size: int) -> GenRequest:
    req = _common(body, "chat", vocab_size)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("'messages' must be a non-empty list", "messages",
                  "invalid_type" if not isinstance(msgs, list) else "invalid_value")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"{where} must be an object", "messages", "invalid_type")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise bad(f"{where}: 'role' must be one of {sorted(ROLES)}, got {role!r}", "messages",
                      "invalid_value")
        msg = dict(m)
        msg["role"] = "system" if role == "developer" else role
        msg["content"] = _text_content(m.get("content"), where)
        if m.get("tool_calls") is not None:
            if role != "assistant":
                raise bad(f"{where}: only assistant messages have 'tool_calls'", "messages",
                          "invalid_value")
            _check_tool_calls(m["tool_calls"], where)
        if msg["content"] is None and not (role == "assistant" and m.get("tool_calls")):
            raise bad(f"{where}: 'content' is required", "messages", "invalid_value")
        out.append(msg)
    req.messages = out
    try:
        check_tools(body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls"))
    except ToolError as e:
        raise bad(str(e), e.param, "invalid_value") from None
    req.tools = body.get("tools") or None
    req.tool_choice = body.get("tool_choice")
    req.parallel_tool_calls = body.get("parallel_tool_calls")
    _boolean(body, "store", False)
    rf = body.get("response_format")
    if rf is not None and not isinstance(rf, dict):
        raise bad("'response_format' must be an object", "response_format", "invalid_type")
    req.response_format = rf  # its contents are checked when it is compiled
    req.template_kwargs = _template_kwargs(body)
    req.logprobs = _boolean(body, "logprobs", False)
    req.top_logprobs = _integer(body, "top_logprobs", 0, lp.MAX_TOP_LOGPROBS, 0)
    if req.top_logprobs and not req.logprobs:
        raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs", "invalid_value")
    return req


RESERVED_TEMPLATE_VARS = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
EFFORTS = ("low", "medium", "high")


def _template_kwargs(body: dict) -> dict:
    """chat_template_kwargs (vLLM's and llama.cpp's field: variables for the chat template,
    e.g. {"enable_thinking": false}) and reasoning_effort (gpt-oss's template reads it)."""
    kw = body.get("chat_template_kwargs")
    if kw is None:
        kw = {}
    if not isinstance(kw, dict):
        raise bad("'chat_template_kwargs' must be an object", "chat_template_kwargs",
                  "invalid_type")
    bad_keys = sorted(k for k in kw if k in RESERVED_TEMPLATE_VARS or not k.isidentifier())
    if bad_keys:
        raise bad(f"'chat_template_kwargs' cannot set {bad_keys}", "chat_template_kwargs",
                  "invalid_value")
    kw = dict(kw)
    effort = body.get("reasoning_effort")
    if effort is not None and not isinstance(effort, str):
        raise bad(f"'reasoning_effort' must be a string, got {json.dumps(effort)[:40]}",
                  "reasoning_effort", "invalid_type")
    if effort in EFFORTS:  # other levels (OpenAI's "minimal", ...): no template knows them
        kw.setdefault("reasoning_effort", effort)
    return kw


def _check_tool_calls(calls, where: str) -> None:
    """An assistant message's tool_calls, in OpenAI's shape."""
    if not isinstance(calls, list):
        raise bad(f"{where}: 'tool_calls' must be a list", "messages", "invalid_type")
    for j, c in enumerate(calls):
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(
                fn.get("arguments", ""), str) or not isinstance(c.get("id", ""), str):
            raise bad(f"{where}.tool_calls[{j}] must be {{'id': str, 'type': 'function', "
                      "'function': {'name': str, 'arguments': str}}", "messages",
                      "invalid_value")


def parse_completion(body: dict, vocab_size: int) -> GenRequest:
    req = _common(body, "completion", vocab_size)
    p = body.get("prompt")
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
        p = p[0]  # a batch of one prompt
    if isinstance(p, str):
        if not p:
            raise bad("'prompt' is empty", "prompt", "invalid_value")
    elif isinstance(p, list) and p and all(_is_int(t) for t in p):
        if not all(0 <= t < vocab_size for t in p):
            raise bad(f"'prompt' token ids must be in 0..{vocab_size - 1}", "prompt",
                      "invalid_value")
    elif isinstance(p, list) and len(p) > 1:
        raise bad("only one prompt per request is supported", "prompt", "unsupported_value")
    else:
        raise bad("'prompt' must be a non-empty string or a list of token ids", "prompt",
                  "invalid_type")
    req.prompt = p
    if req.max_tokens is None:
        req.max_tokens = 16  # OpenAI's default for completions
    if _boolean(body, "echo", False):
        raise bad("echo is not supported", "echo", "unsupported_value")
    n = _integer(body, "logprobs", 0, lp.MAX_TOP_LOGPROBS, None)  # legacy: an int, or null
    req.logprobs, req.top_logprobs = n is not None, n or 0
    if body.get("suffix") is not None:
        raise bad("suffix is not supported", "suffix", "unsupported_value")
    if _integer(body, "best_of", 1, None, 1) != 1:
        raise bad("only best_of=1 is supported", "best_of", "unsupported_value")
    return req


# ============================================================================ responses


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


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


class Shaper:
    """Builds the response objects of one request (one id, one created time)."""

    def __init__(self, kind: str, model_id: str, fingerprint: str):
        self.kind = kind
        self.model = model_id
        self.fingerprint = fingerprint
        self.id = new_id(kind)
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint}

    def _logprobs(self, entries: list[dict] | None, offset: int = 0):
        """The choice's logprobs object: chat {"content": [...]}, completions the legacy one."""
        if entries is None:
            return None
        if self.kind == "chat":
            return {"content": entries, "refusal": None}
        return lp.legacy(entries, offset)

    def full(self, result, return_tokens: bool) -> dict:
        entries = result.logprobs["content"] if result.logprobs is not None else None
        if self.kind == "chat":
            out = self._head("chat.completion")
            message = {"role": "assistant", "content": result.content}
            if result.reasoning_content is not None:
                message["reasoning_content"] = result.reasoning_content
            if result.tool_calls:
                message["tool_calls"] = result.tool_calls
            out["choices"] = [{"index": 0, "message": message,
                               "logprobs": self._logprobs(entries),
                               "finish_reason": result.finish_reason}]
        else:
            out = self._head("text_completion")
            out["choices"] = [{"index": 0, "text": result.text,
                               "logprobs": self._logprobs(entries),
                               "finish_reason": result.finish_reason}]
        if result.reason is not None:  # a constrained generation says why it ended
            out["choices"][0]["reason"] = result.reason
        out["usage"] = usage(result)
        out["timings"] = timings(result)
        if return_tokens:
            out["tokens"] = list(result.tokens)
        return out

    def chunk(self, *, role: bool = False, text: str | None = None, finish: str | None = None,
              include_usage: bool = False, logprobs: list[dict] | None = None,
              offset: int = 0, tool_call=None, reasoning: str | None = None) -> dict:
        """One stream chunk; logprobs: the entries of the tokens of this chunk's text (offset:
        characters of completion text sent before it, for the legacy text_offset); tool_call:
        a tools.ToolCallDelta."""
        if self.kind == "chat":
            out = self._head("chat.completion.chunk")
            delta = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            if reasoning is not None:
                delta["reasoning_content"] = reasoning
            if tool_call is not None:
                delta["tool_calls"] = [tool_call.as_openai()]
            out["choices"] = [{"index": 0, "delta": delta,
                               "logprobs": self._logprobs(logprobs),
                               "finish_reason": finish}]
        else:
            out = self._head("text_completion")
            out["choices"] = [{"index": 0, "text": text or "",
                               "logprobs": self._logprobs(logprobs, offset),
                               "finish_reason": finish}]
        if include_usage:
            out["usage"] = None
        return out

    def usage_chunk(self, result) -> dict:
        out = self._head("chat.completion.chunk" if self.kind == "chat" else "text_completion")
        out["choices"] = []
        out["usage"] = usage(result)
        out["timings"] = timings(result)
        return out


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
SSE_PING = b": ping\n\n"
