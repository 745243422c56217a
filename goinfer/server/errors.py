"""The server's errors, in no API's shape yet: a status, a kind and the parameter at fault.

Every route answers an APIError in its own wire shape (``ApiRoute.error_body``); the kinds
(``type``) are OpenAI's names, which the other APIs' errors map onto.
"""

from __future__ import annotations

from goinfer.errors import CacheFullError, ContextLengthError

__all__ = ["APIError", "bad", "engine_error"]


class APIError(Exception):
    """An error answered with HTTP ``status``: ``type`` is its kind ("invalid_request_error",
    "authentication_error", "not_found_error", "rate_limit_error", "server_error"), ``param``
    the request field at fault, ``code`` a finer reason; ``cause`` the goinfer error behind
    it, if any (a route may word it its own way)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
        cause: BaseException | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.cause = cause

    def body(self) -> dict:
        """OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad(
    message: str,
    param: str | None = None,
    code: str | None = None,
    cause: BaseException | None = None,
) -> APIError:
    """A 400: the request is wrong."""
    return APIError(400, message, param=param, code=code, cause=cause)


def engine_error(e: BaseException | None) -> APIError:
    """What a generation that failed in the engine answers."""
    if isinstance(e, (CacheFullError, ContextLengthError)):
        return APIError(
            400 if isinstance(e, ContextLengthError) else 503,
            str(e),
            type="invalid_request_error" if isinstance(e, ContextLengthError) else "server_error",
            code="kv_cache_full",
            cause=e,
        )
    return APIError(500, f"generation failed: {e}", type="server_error", cause=e)
