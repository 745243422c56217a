"""Anthropic's Messages API request -> the runner's Request (anthropic_messages.py serves it).

The body's ``system``, ``messages`` (content blocks), ``tools`` and ``tool_choice`` become the
chat layer's OpenAI-shaped messages and tools; ``thinking`` and ``output_config`` become
template variables and a response_format.  Fields that change nothing goinfer computes are
accepted; a field or block goinfer cannot honour is a 400 naming it.

Prompt normalisations (docs/agents.md), each on by default and turned off with
``goinfer serve --anthropic-normalize`` or ``$GOINFER_ANTHROPIC_NORMALIZE``:

- ``billing_header``: a system text block that starts with ``x-anthropic-billing-header:``
  (Claude Code's per-session attribution line, first in the prompt) is not rendered.
- ``system_in_place``: system messages inside ``messages`` are rendered where they stand, for
  any chat template (goinfer/chat/system.py).
- ``deferred_tools``: tools with ``defer_loading`` are left out of the prompt's tool list; a
  ``tool_reference`` block in a tool result renders the tool's definition there, and from then
  on the tool may be called.

Always: ``cache_control`` and other metadata are never rendered, and a list of text blocks
renders as the same text given as a string (the blocks joined as they are).

Request defaults (``goinfer serve --anthropic-defaults JSON``, ``$GOINFER_ANTHROPIC_DEFAULTS``):
sampling fields and stop sequences for the requests that do not set them (Claude Code sends
none: a model that needs its own, such as a base model that only ends a reply at a stop
sequence, gets them here).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from goinfer.chat.spec import check_tools
from goinfer.errors import ToolError
from goinfer.server import fields as F
from goinfer.server.errors import bad
from goinfer.server.request import Request

__all__ = [
    "Normalize",
    "NORMALIZATIONS",
    "NORMALIZE_ENV",
    "DEFAULTS_ENV",
    "normalize_setting",
    "parse_defaults",
    "defaults_setting",
    "parse_body",
    "Options",
    "sign",
    "unsign",
    "BILLING_HEADER",
]

NORMALIZE_ENV = "GOINFER_ANTHROPIC_NORMALIZE"
DEFAULTS_ENV = "GOINFER_ANTHROPIC_DEFAULTS"
DEFAULT_FIELDS = ("temperature", "top_p", "top_k", "stop_sequences")
NORMALIZATIONS = ("billing_header", "system_in_place", "deferred_tools")
BILLING_HEADER = "x-anthropic-billing-header:"

# fields that change nothing goinfer computes: accepted, not used
IGNORED = {
    "metadata",
    "service_tier",
    "cache_control",
    "safeguards",
    "context_management",
    "diagnostics",
    "speed",
    "inference_geo",
    "user_profile_id",
    "workspace_id",
}
FIELDS = {
    "model",
    "messages",
    "max_tokens",
    "system",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "tools",
    "tool_choice",
    "thinking",
    "output_config",
} | IGNORED
# fields of the API that would change the result and that goinfer does not implement
REFUSED = {
    "container": "code execution containers",
    "mcp_servers": "MCP connectors",
    "output_format": "'output_format' (send output_config.format)",
}
TOOL_KEYS = {
    "name",
    "description",
    "input_schema",
    "type",
    "cache_control",
    "defer_loading",
    "strict",
    "eager_input_streaming",
}
DISPLAYS = ("summarized", "omitted", "updates")
EFFORTS = ("low", "medium", "high")
SIGNATURE_PREFIX = "goinfer1:"  # a thinking signature of goinfer's: the thinking text, base64


# ============================================================================ settings


@dataclass(frozen=True)
class Normalize:
    """Which prompt normalisations are on (the module's docstring)."""

    billing_header: bool = True
    system_in_place: bool = True
    deferred_tools: bool = True

    @classmethod
    def parse(cls, text: str | None) -> Normalize:
        """'all' (also None or ''), 'none', or a comma-separated list of NORMALIZATIONS (the
        ones on); ValueError naming anything else."""
        text = (text or "all").strip()
        if text == "all":
            return cls()
        names = [] if text == "none" else [x.strip() for x in text.split(",") if x.strip()]
        unknown = [x for x in names if x not in NORMALIZATIONS]
        if unknown:
            raise ValueError(
                f"unknown normalisation(s) {unknown}: give 'all', 'none' or a "
                f"comma-separated list of {', '.join(NORMALIZATIONS)}"
            )
        return cls(**{n: n in names for n in NORMALIZATIONS})


def normalize_setting() -> Normalize:
    """The server's setting: $GOINFER_ANTHROPIC_NORMALIZE (set by goinfer serve's
    --anthropic-normalize; read per request, so the Ray ingress and replicas agree)."""
    return _parsed(os.environ.get(NORMALIZE_ENV, ""))


_cache: dict[str, Normalize] = {}


def _parsed(text: str) -> Normalize:
    if text not in _cache:
        _cache[text] = Normalize.parse(text)
    return _cache[text]


def parse_defaults(text: str | None) -> dict:
    """Request defaults: a JSON object of DEFAULT_FIELDS ('' or None: none); ValueError."""
    if not text:
        return {}
    try:
        d = json.loads(text)
    except ValueError as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(d, dict) or set(d) - set(DEFAULT_FIELDS):
        raise ValueError(f"must be a JSON object of {', '.join(DEFAULT_FIELDS)}")
    parse_body(
        dict(d, model="m", max_tokens=1, messages=[{"role": "user", "content": "x"}]),
        0,
        normalize=Normalize(),
        defaults={},
    )  # the fields' own checks (APIError)
    return d


def defaults_setting() -> dict:
    """The server's request defaults: $GOINFER_ANTHROPIC_DEFAULTS (goinfer serve's
    --anthropic-defaults), read per request as the normalisations are."""
    text = os.environ.get(DEFAULTS_ENV, "")
    if text not in _defaults:
        _defaults[text] = parse_defaults(text)
    return _defaults[text]


_defaults: dict[str, dict] = {}


@dataclass
class Options:
    """How a Messages reply is shaped (Request.options)."""

    display: str = "summarized"  # thinking blocks: "omitted" sends their text in the signature


# ============================================================================ thinking signatures


def sign(thinking: str) -> str:
    """The signature of a thinking block goinfer wrote: its text, so that a client that sends
    the block back without the text (display "omitted") still gives the model its thinking."""
    return SIGNATURE_PREFIX + base64.b64encode(thinking.encode()).decode()


def unsign(signature) -> str | None:
    """The thinking text a goinfer signature carries (None: not one of goinfer's)."""
    if not isinstance(signature, str) or not signature.startswith(SIGNATURE_PREFIX):
        return None
    try:
        return base64.b64decode(signature[len(SIGNATURE_PREFIX) :], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


# ============================================================================ the body


def parse_body(
    body,
    vocab_size: int,
    *,
    counting: bool = False,
    normalize: Normalize | None = None,
    defaults: dict | None = None,
) -> Request:
    """A Messages API body -> Request (APIError 400 naming the field).  counting: a
    count_tokens body (no max_tokens needed).  normalize, defaults: the server's settings
    (None: from the environment)."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    norm = normalize if normalize is not None else normalize_setting()
    defaults = defaults if defaults is not None else defaults_setting()
    if defaults:
        body = {**defaults, **{k: v for k, v in body.items() if v is not None}}
    for k in body:
        if k in REFUSED:
            raise bad(f"{k}: {REFUSED[k]} are not supported by goinfer", k, "unsupported_value")
        if k not in FIELDS:
            raise bad(f"{k}: Extra inputs are not permitted", k, "unknown_parameter")
    F.string(body, "model")
    _context_management(body.get("context_management"))
    max_tokens = F.integer(body, "max_tokens", 0, None, None)  # 0: only fill the cache
    if max_tokens is None and not counting:
        raise bad("max_tokens: Field required", "max_tokens", "invalid_value")
    top_p = F.number(body, "top_p", 0.0, 1.0, 1.0)
    top_k = F.integer(body, "top_k", 0, None, 0)
    if top_p == 0.0:  # only the most likely token
        top_p, top_k = 1.0, 1
    sampling = dict(
        temperature=F.number(body, "temperature", 0.0, 1.0, 1.0), top_p=top_p, top_k=top_k
    )
    req = Request(
        kind="chat",
        stream=F.boolean(body, "stream", False),
        max_tokens=max_tokens,
        sampling=sampling,
        stops=F.stop_strings(body, "stop_sequences"),
        fit_max_tokens=True,
        system_in_place=norm.system_in_place,
    )
    tools, deferred = _tools(body.get("tools"))
    conv = _Conversation(tools, deferred if norm.deferred_tools else {})
    system = _system(body.get("system"), norm)
    if system:
        conv.out.append({"role": "system", "content": system})
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad(
            "messages: a non-empty list of messages is required",
            "messages",
            "invalid_type" if not isinstance(msgs, list) else "invalid_value",
        )
    for i, m in enumerate(msgs):
        conv.message(m, i, last=i == len(msgs) - 1)
    req.messages = conv.out
    callable_ = [
        t
        for t in tools
        if t.get("name") not in deferred or t.get("name") in conv.loaded or not norm.deferred_tools
    ]
    choice, parallel = _tool_choice(body.get("tool_choice"))
    oa_tools = [_openai_tool(t) for t in callable_]
    try:
        check_tools([_openai_tool(t) for t in tools] or None)  # each tool, at its own index
        check_tools(oa_tools or None, choice, parallel)
    except ToolError as e:
        raise bad(_anthropic_param(str(e)), _anthropic_param(e.param), "invalid_value") from None
    req.tools, req.tool_choice, req.parallel_tool_calls = oa_tools or None, choice, parallel
    if norm.deferred_tools:
        req.unlisted_tools = frozenset(t["name"] for t in callable_ if t["name"] in deferred)
    req.options = Options()
    _thinking(body.get("thinking"), req)
    _output_config(body.get("output_config"), req)
    return req


def _anthropic_param(param: str | None) -> str | None:
    """A chat-layer tool param (OpenAI's names) in the Messages API's names."""
    if param is None:
        return None
    return param.replace(".function.parameters", ".input_schema").replace(".function.", ".")


def _context_management(cm) -> None:
    """Context editing: only clearing thinking is accepted (the chat template decides which
    earlier thinking it renders); clearing tool results would change the prompt."""
    if cm is None:
        return
    edits = cm.get("edits", []) if isinstance(cm, dict) else None
    if not isinstance(edits, list):
        raise bad(
            "context_management: must be an object with a list 'edits'",
            "context_management",
            "invalid_type",
        )
    for j, e in enumerate(edits):
        kind = e.get("type") if isinstance(e, dict) else None
        if not isinstance(kind, str) or not kind.startswith("clear_thinking"):
            raise bad(
                f"context_management.edits[{j}]: context editing of type {kind!r} is not "
                "supported by goinfer (only clear_thinking)",
                f"context_management.edits[{j}]",
                "unsupported_value",
            )


# ============================================================================ content


def _text_blocks(content, where: str) -> str:
    """A string, or a list of text blocks joined as they are."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad(f"{where}: must be a string or a list of text blocks", where, "invalid_type")
    parts = []
    for j, b in enumerate(content):
        parts.append(_text_of(b, f"{where}[{j}]"))
    return "".join(parts)


def _text_of(b, where: str) -> str:
    if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
        kind = b.get("type") if isinstance(b, dict) else type(b).__name__
        if kind in ("image", "document"):
            raise _unsupported_media(kind, where)
        raise bad(f"{where}: expected a text block, got {kind!r}", where, "invalid_value")
    return b["text"]


def _unsupported_media(kind: str, where: str):
    return bad(
        f"{where}: {kind} blocks are not supported: this model reads text only",
        where,
        "unsupported_content",
    )


def _system(system, norm: Normalize) -> str:
    """The system prompt's text (the billing header block dropped when normalising)."""
    if system is None:
        return ""
    if isinstance(system, list) and norm.billing_header:
        system = [
            b
            for b in system
            if not (
                isinstance(b, dict)
                and isinstance(b.get("text"), str)
                and b["text"].startswith(BILLING_HEADER)
            )
        ]
    return _text_blocks(system, "system")


class _Conversation:
    """Messages API turns -> the chat layer's messages (OpenAI's shape), in order."""

    def __init__(self, tools: list[dict], deferred: dict[str, dict]):
        self.tools = {t.get("name"): t for t in tools}
        self.deferred = deferred  # name -> tool, rendered where a tool_reference loads it
        self.loaded: set[str] = set()  # deferred tools a tool_reference has loaded
        self.out: list[dict] = []

    def message(self, m, i: int, last: bool) -> None:
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad(f"{where}: must be an object", where, "invalid_type")
        role, content = m.get("role"), m.get("content")
        extra = set(m) - {"role", "content"}
        if extra:
            raise bad(
                f"{where}.{sorted(extra)[0]}: Extra inputs are not permitted",
                f"{where}.{sorted(extra)[0]}",
                "unknown_parameter",
            )
        if role == "system":
            self.out.append(
                {"role": "system", "content": _text_blocks(content, f"{where}.content")}
            )
        elif role == "user":
            self._user(content, where)
        elif role == "assistant":
            if last:
                raise bad(
                    f"{where}: a last assistant message (a prefilled reply to continue) "
                    "is not supported by goinfer",
                    where,
                    "unsupported_value",
                )
            self._assistant(content, where)
        else:
            raise bad(
                f"{where}.role: must be 'user', 'assistant' or 'system', got {role!r}",
                f"{where}.role",
                "invalid_value",
            )

    def _user(self, content, where: str) -> None:
        if isinstance(content, str):
            self.out.append({"role": "user", "content": content})
            return
        if not isinstance(content, list):
            raise bad(
                f"{where}.content: must be a string or a list of blocks",
                f"{where}.content",
                "invalid_type",
            )
        text: list[str] | None = None  # the text blocks since the last tool result
        for j, b in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = b.get("type") if isinstance(b, dict) else None
            if kind == "tool_result":
                if text is not None:
                    self.out.append({"role": "user", "content": "".join(text)})
                    text = None
                self.out.append(self._tool_result(b, at))
            else:
                text = (text or []) + [_text_of(b, at)]
        if text is not None or not content:
            self.out.append({"role": "user", "content": "".join(text or [])})

    def _tool_result(self, b: dict, where: str) -> dict:
        tid = b.get("tool_use_id")
        if not isinstance(tid, str):
            raise bad(
                f"{where}.tool_use_id: must be a string", f"{where}.tool_use_id", "invalid_type"
            )
        content = b.get("content", "")
        if isinstance(content, str):
            text = content
        elif isinstance(content, list):
            parts, refs = [], []
            for k, x in enumerate(content):
                at = f"{where}.content[{k}]"
                if isinstance(x, dict) and x.get("type") == "tool_reference":
                    refs.append(self._reference(x, at))
                    continue
                if refs:
                    parts.append(_functions(refs))
                    refs = []
                parts.append(_text_of(x, at))
            if refs:
                parts.append(_functions(refs))
            text = "".join(parts)
        else:
            raise bad(
                f"{where}.content: must be a string or a list of blocks",
                f"{where}.content",
                "invalid_type",
            )
        is_error = b.get("is_error", False)
        if not isinstance(is_error, bool):
            raise bad(f"{where}.is_error: must be a boolean", f"{where}.is_error", "invalid_type")
        if is_error:
            text = "Error: " + text
        return {"role": "tool", "tool_call_id": tid, "content": text}

    def _reference(self, x: dict, where: str) -> dict:
        """A tool_reference block: the tool it loads (its definition is rendered here)."""
        name = x.get("tool_name")
        tool = self.tools.get(name) if isinstance(name, str) else None
        if tool is None:
            raise bad(
                f"{where}: tool_reference names {name!r}, which is not in tools",
                where,
                "invalid_value",
            )
        self.loaded.add(name)
        return tool

    def _assistant(self, content, where: str) -> None:
        if isinstance(content, str):
            self.out.append({"role": "assistant", "content": content})
            return
        if not isinstance(content, list):
            raise bad(
                f"{where}.content: must be a string or a list of blocks",
                f"{where}.content",
                "invalid_type",
            )
        text, thinking, calls = [], [], []
        for j, b in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = b.get("type") if isinstance(b, dict) else None
            if kind == "text":
                text.append(_text_of(b, at))
            elif kind == "tool_use":
                calls.append(_tool_use(b, at))
            elif kind == "thinking":
                t = b.get("thinking")
                if not isinstance(t, str):
                    raise bad(f"{at}.thinking: must be a string", f"{at}.thinking", "invalid_type")
                thinking.append(t or unsign(b.get("signature")) or "")
            elif kind == "redacted_thinking":
                continue  # encrypted by another server: nothing goinfer can render
            else:
                raise bad(
                    f"{at}: {kind!r} blocks are not supported in assistant turns",
                    at,
                    "unsupported_content",
                )
        msg: dict = {"role": "assistant", "content": "".join(text)}
        if calls:
            msg["tool_calls"] = calls
        reasoning = "".join(thinking)
        if reasoning:
            msg["reasoning_content"] = reasoning
        self.out.append(msg)


def _tool_use(b: dict, where: str) -> dict:
    tid, name, args = b.get("id"), b.get("name"), b.get("input", {})
    if not isinstance(tid, str) or not isinstance(name, str):
        raise bad(
            f"{where}: a tool_use block needs a string 'id' and 'name'", where, "invalid_value"
        )
    if not isinstance(args, dict):
        raise bad(f"{where}.input: must be an object", f"{where}.input", "invalid_type")
    # the arguments as json.dumps writes them: the layout goinfer's tool grammars give a call,
    # so a call the model wrote renders token for token as it was generated
    return {
        "id": tid,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
    }


def _functions(tools: list[dict]) -> str:
    """Tool definitions where a tool_reference loads them: one line each in a <functions>
    block, as Claude Code's ToolSearch describes its result."""
    lines = "\n".join(
        "<function>"
        + json.dumps(
            {
                "description": t.get("description", ""),
                "name": t["name"],
                "parameters": t["input_schema"],
            },
            ensure_ascii=False,
        )
        + "</function>"
        for t in tools
    )
    return f"<functions>\n{lines}\n</functions>"


# ============================================================================ tools


def _tools(tools) -> tuple[list[dict], dict[str, dict]]:
    """The tools (checked shape) and the deferred ones by name."""
    if tools is None:
        return [], {}
    if not isinstance(tools, list):
        raise bad("tools: must be a list", "tools", "invalid_type")
    out, deferred = [], {}
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict):
            raise bad(f"{where}: must be an object", where, "invalid_type")
        kind = t.get("type", "custom")
        if kind != "custom":
            raise bad(
                f"{where}: tools of type {kind!r} (run by Anthropic's servers) are not "
                "supported by goinfer; give client tools (name, description, "
                "input_schema)",
                f"{where}.type",
                "unsupported_value",
            )
        extra = sorted(set(t) - TOOL_KEYS)
        if extra:
            raise bad(
                f"{where}.{extra[0]}: not supported by goinfer",
                f"{where}.{extra[0]}",
                "unsupported_value",
            )
        if not isinstance(t.get("input_schema"), dict):
            raise bad(
                f"{where}.input_schema: Field required (a JSON schema object)",
                f"{where}.input_schema",
                "invalid_value",
            )
        defer = t.get("defer_loading", False)
        if not isinstance(defer, bool):
            raise bad(
                f"{where}.defer_loading: must be a boolean",
                f"{where}.defer_loading",
                "invalid_type",
            )
        out.append(t)
        if defer and isinstance(t.get("name"), str):
            deferred[t["name"]] = t
    return out, deferred


def _openai_tool(t: dict) -> dict:
    fn = {"name": t.get("name"), "parameters": t["input_schema"]}
    if t.get("description") is not None:
        fn["description"] = t["description"]
    return {"type": "function", "function": fn}


def _tool_choice(tc) -> tuple[str | dict | None, bool | None]:
    """tool_choice -> (the chat layer's tool_choice, parallel_tool_calls)."""
    if tc is None:
        return None, None
    if not isinstance(tc, dict) or tc.get("type") not in ("auto", "any", "tool", "none"):
        raise bad(
            "tool_choice: must be {'type': 'auto' | 'any' | 'tool' | 'none'}",
            "tool_choice",
            "invalid_value",
        )
    extra = set(tc) - {"type", "name", "disable_parallel_tool_use"}
    if extra:
        raise bad(
            f"tool_choice.{sorted(extra)[0]}: Extra inputs are not permitted",
            "tool_choice",
            "unknown_parameter",
        )
    no_parallel = F.boolean(tc, "disable_parallel_tool_use", False)
    kind = tc["type"]
    if kind == "tool":
        if not isinstance(tc.get("name"), str):
            raise bad("tool_choice.name: Field required", "tool_choice.name", "invalid_value")
        choice: str | dict = {"type": "function", "function": {"name": tc["name"]}}
    else:
        choice = {"auto": "auto", "any": "required", "none": "none"}[kind]
    return choice, (False if no_parallel else None)


# ============================================================================ reasoning, format


def _thinking(th, req: Request) -> None:
    """thinking -> the template's enable_thinking (templates without a reasoning channel do not
    read it) and how thinking blocks are displayed.  budget_tokens is a target in Anthropic's
    API, not a limit: accepted, not enforced."""
    if th is None:
        req.template_kwargs["enable_thinking"] = False  # the API's default: no thinking
        return
    kind = th.get("type") if isinstance(th, dict) else None
    if kind not in ("enabled", "disabled", "adaptive"):
        raise bad(
            "thinking: must be {'type': 'enabled' | 'disabled' | 'adaptive'}",
            "thinking",
            "invalid_value",
        )
    extra = set(th) - {"type", "budget_tokens", "display"}
    if extra:
        raise bad(
            f"thinking.{sorted(extra)[0]}: Extra inputs are not permitted",
            "thinking",
            "unknown_parameter",
        )
    F.integer(th, "budget_tokens", 1, None, None)
    display = th.get("display", "summarized")
    if display not in DISPLAYS:
        raise bad(
            f"thinking.display: must be one of {list(DISPLAYS)}",
            "thinking.display",
            "invalid_value",
        )
    req.options.display = display
    if kind == "disabled":
        req.template_kwargs["enable_thinking"] = False
    elif kind == "enabled":
        req.template_kwargs["enable_thinking"] = True
    # adaptive: the template's own default


def _output_config(oc, req: Request) -> None:
    """output_config: effort (gpt-oss's template reads reasoning_effort; others ignore it) and
    format (a JSON schema the reply is held to)."""
    if oc is None:
        return
    if not isinstance(oc, dict) or set(oc) - {"effort", "format"}:
        raise bad("output_config: may hold 'effort' and 'format'", "output_config", "invalid_value")
    effort = oc.get("effort")
    if effort in EFFORTS:
        req.template_kwargs.setdefault("reasoning_effort", effort)
    elif effort is not None and not isinstance(effort, str):
        raise bad("output_config.effort: must be a string", "output_config.effort", "invalid_type")
    fmt = oc.get("format")
    if fmt is None:
        return
    if (
        not isinstance(fmt, Mapping)
        or fmt.get("type") != "json_schema"
        or not isinstance(fmt.get("schema"), Mapping)
    ):
        raise bad(
            "output_config.format: must be {'type': 'json_schema', 'schema': {...}}",
            "output_config.format",
            "invalid_value",
        )
    req.response_format = {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": dict(fmt["schema"])},
    }
