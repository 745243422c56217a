"""OpenAI-compatible HTTP server with continuous batching and a shared prefix cache.

    goinfer serve smollm2-135m --port 8000
    from goinfer.server import create_app      # the FastAPI app, for embedding

Needs the ``server`` extra (fastapi, uvicorn).
"""

from __future__ import annotations

from goinfer.server.scheduler import Engine, Job, QueueFullError


def create_app(*args, **kwargs):
    from goinfer.server.app import create_app as _create

    return _create(*args, **kwargs)


__all__ = ["Engine", "Job", "QueueFullError", "create_app"]
