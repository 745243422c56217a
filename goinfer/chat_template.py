"""Chat templates: render a conversation to the prompt text a model was trained on.

Templates are Jinja2 programs shipped inside GGUF files (``tokenizer.chat_template``), written for
Hugging Face transformers' ``apply_chat_template``.  We render them in a sandbox set up to behave
the way transformers' does (same Jinja options, the same helper functions and filters, the same
preparation of the messages), so the output is the same text byte for byte.

Untrusted templates run in Jinja's immutable sandbox; a template that reaches for Python
internals (``__class__``, ``__subclasses__`` ...) fails with ChatTemplateError.  The sandbox
(goinfer/jinja_sandbox.py) is imported on the first render.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .errors import ChatTemplateError

__all__ = ["GEMMA_TEMPLATE", "builtin_template", "render_chat_template"]

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
    from .jinja_sandbox import TemplateError, compile_template  # Jinja2 loads on first use

    try:
        compiled = compile_template(template)
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
