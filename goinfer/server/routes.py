"""The API routes the server serves: one module each, one line each here.

Adding an API: a module with an ApiRoute subclass (goinfer/server/route.py) and its entry
below; the app (app.py) and the Ray ingress (ray.py) serve every route listed.
"""

from __future__ import annotations

from goinfer.server import anthropic_messages, openai_chat, openai_completions, openai_responses
from goinfer.server.route import ApiRoute

__all__ = ["ROUTES", "route_for"]

ROUTES: tuple[ApiRoute, ...] = (
    openai_chat.ROUTE,  # POST /v1/chat/completions
    openai_completions.ROUTE,  # POST /v1/completions
    openai_responses.ROUTE,  # POST /v1/responses (and its stored responses)
    anthropic_messages.ROUTE,  # POST /v1/messages
    anthropic_messages.COUNT_ROUTE,  # POST /v1/messages/count_tokens
)
_BY_PATH = {r.path: r for r in ROUTES}


def route_for(path: str) -> ApiRoute | None:
    """The generation route served at `path` (None: another path)."""
    return _BY_PATH.get(path)
