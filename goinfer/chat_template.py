"""Chat templates: render a conversation to the prompt text a model was trained on.

Templates are Jinja2 programs shipped inside GGUF files (``tokenizer.chat_template``), written for
Hugging Face transformers' ``apply_chat_template``.  We render them in a sandbox set up to behave
the way transformers' does (same Jinja options, the same helper functions and filters, the same
preparation of the messages), so the output is the same text byte for byte.

Untrusted templates run in Jinja's immutable sandbox; a template that reaches for Python
internals (``__class__``, ``__subclasses__`` ...) fails with ChatTemplateError.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import ChatTemplateError

__all__ = ["GEMMA_TEMPLATE", "builtin_template", "render_chat_template"]

# --------------------------------------------------------------------------------------------
# Helpers visible to templates
# --------------------------------------------------------------------------------------------


def _raise_exception(message: Any) -> None:
    raise TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # Unlike Jinja's own tojson, no HTML escaping, and non-ASCII stays as it is.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _DictFactory:
    """``dict(...)`` inside templates, without handing the `dict` type itself to the template."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses attribute names starting with an underscore."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a chat template may not set the namespace attribute {name!r}")


class _GenerationTag(jinja2.ext.Extension):
    """Accepts ``{% generation %}...{% endgeneration %}`` (marks assistant text for training);
    the body is rendered as if the tags were not there."""

    tags = frozenset({"generation"})

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Any) -> str:
        return caller()


class _Sandbox(ImmutableSandboxedEnvironment):
    def unsafe_undefined(self, obj: Any, attribute: Any) -> Any:
        # Jinja would hand back an undefined value that only fails when used further; a template
        # that touches an unsafe attribute at all is hostile, so fail right away.
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
        )


# --------------------------------------------------------------------------------------------
# Compiling (cached per template text)
# --------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def _compile(template: str) -> jinja2.Template:
    env = _Sandbox(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _DictFactory()
    env.globals["namespace"] = _Namespace
    return env.from_string(template)


# --------------------------------------------------------------------------------------------
# Preparing what the template sees
# --------------------------------------------------------------------------------------------

_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


def _to_dicts(value: Any) -> Any:
    """Message objects (dataclasses, pydantic models) -> plain dicts, recursively."""
    if isinstance(value, Mapping):
        return {k: _to_dicts(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_dicts(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_to_dicts(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _to_dicts(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _to_dicts(value.model_dump())
    return value


def _plain(value: Any) -> Any:
    """Rebuild `value` from JSON-like types only; anything else becomes '<TypeName>'."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    item = getattr(value, "item", None)
    if callable(item) and type(value).__module__ == "numpy":  # numpy scalars
        return _plain(item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _prepare_messages(messages: Any) -> list[dict]:
    messages = _to_dicts(getattr(messages, "messages", messages))
    if not isinstance(messages, (list, tuple)):
        raise ChatTemplateError(f"messages must be a list of dicts, got {type(messages).__name__}")
    out = []
    for m in messages:
        if not isinstance(m, dict):
            raise ChatTemplateError(f"a chat message must be a dict, got {m!r}")
        # Keys set to None are dropped: many templates handle a missing key but print "None".
        m = _plain({k: v for k, v in m.items() if v is not None})
        reasoning = next((m[k] for k in _REASONING_KEYS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


def render_chat_template(
    template: str,
    messages: Any,
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    **extra: Any,
) -> str:
    """Render `messages` with the Jinja chat `template`, as transformers' apply_chat_template does.

    Extra keyword arguments are passed to the template as variables (for example
    ``enable_thinking=False`` or ``date_string=...``).  Any failure -- a syntax error, an error
    the template raises itself, a sandbox violation -- raises ChatTemplateError.
    """
    if not isinstance(template, str):
        raise ChatTemplateError(f"a chat template must be a str, got {type(template).__name__}")
    try:
        compiled = _compile(template)
    except TemplateError as e:
        raise ChatTemplateError(f"the chat template does not compile: {e}") from e
    except Exception as e:
        raise ChatTemplateError(
            f"the chat template does not compile: {type(e).__name__}: {e}"
        ) from e

    msgs = _prepare_messages(messages)
    if tools is not None:
        for t in tools:
            if not isinstance(t, Mapping):
                raise ChatTemplateError(f"tools must be JSON-schema dicts, got {type(t).__name__}")
    if documents is not None:
        for d in documents:
            if not isinstance(d, Mapping):
                raise ChatTemplateError(
                    "documents must be a list of dicts with 'title' and 'text' keys"
                )
    variables = _plain({"bos_token": bos_token, "eos_token": eos_token, **extra})
    try:
        return compiled.render(
            messages=msgs,
            tools=_plain(tools),
            documents=_plain(documents),
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except TemplateError as e:
        raise ChatTemplateError(f"the chat template failed: {e}") from e
    except Exception as e:
        raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e}") from e


# --------------------------------------------------------------------------------------------
# Built-in templates for GGUFs that carry none
# --------------------------------------------------------------------------------------------

# Gemma: no system role -- system text (trimmed, concatenated) opens the next user turn,
# followed by a blank line; "assistant" is called "model"; every message is trimmed of ASCII
# whitespace.  No BOS: the tokenizer adds it (tokenizer.ggml.add_bos_token).
GEMMA_TEMPLATE = r"""{%- set ns = namespace(system='') -%}
{%- for message in messages -%}
{%- set content = message['content'] if message['content'] is string else '' -%}
{%- if message['role'] == 'system' -%}
{%- set ns.system = ns.system + content.strip(' \t\n\v\f\r') -%}
{%- else -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{- '<start_of_turn>' + role + '\n' -}}
{%- if ns.system and role != 'model' -%}
{{- ns.system + '\n\n' -}}
{%- set ns.system = '' -%}
{%- endif -%}
{{- content.strip(' \t\n\v\f\r') + '<end_of_turn>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<start_of_turn>model\n' -}}
{%- endif -%}"""

_BUILTIN = {"gemma": GEMMA_TEMPLATE, "gemma2": GEMMA_TEMPLATE, "gemma3": GEMMA_TEMPLATE}


def builtin_template(arch: str) -> str | None:
    """A chat template for architecture `arch` (general.architecture) when its GGUF has none."""
    return _BUILTIN.get(arch)
