"""What `goinfer serve` runs (ServeOptions): for each server process, the options of the model,
its KV cache and the app (ReplicaSpec), and the app they make (open_app).  The single-process
server and each replica on Ray Serve (goinfer/server/ray.py) are both built here, from the same
fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from goinfer.kv_cache import DEFAULT_KV_DTYPE
from goinfer.server.routing import Policy
from goinfer.speculative import DEFAULT_DRAFT_TOKENS

__all__ = ["ReplicaSpec", "ServeOptions", "open_app"]


@dataclass
class ReplicaSpec:
    """What each server process runs: `goinfer serve`'s options for one process."""

    model: str  # a model name or a .gguf path (hub.locate; each node resolves it)
    model_id: str | None = None  # the id /v1/models reports (default: the name or file stem)
    threads: int | None = None  # kernel threads per process (default: physical cores)
    exact: bool = False  # float64 attention at every position (--exact)
    ctx: int | None = None  # context length (--ctx; default: the model's)
    kv_tokens: int | None = None  # KV cache size in tokens (default: 2 x context)
    kv_dtype: str = DEFAULT_KV_DTYPE  # KV cache storage (--kv-dtype)
    block_size: int = 16  # KV block size: the replica's cache and the router's chain agree on it
    max_batch: int = 8
    max_queue: int = 64
    prefill_chunk: int = 256
    max_body: int = 8 << 20
    api_key: str | None = None
    draft: str | None = None  # speculative drafting default (--draft)
    draft_tokens: int = DEFAULT_DRAFT_TOKENS

    def resolved_model_id(self) -> str:
        if self.model_id:
            return self.model_id
        return Path(self.model).stem if str(self.model).endswith(".gguf") else str(self.model)


@dataclass
class ServeOptions:
    """What `goinfer serve MODEL` runs: each of its flags in the field it names
    (server/cli.py's serve_options)."""

    spec: ReplicaSpec  # each server process: the model, its KV cache and the app
    host: str = "127.0.0.1"
    port: int = 8000
    log_level: str = "info"
    anthropic_normalize: str = "all"  # GOINFER_ANTHROPIC_NORMALIZE, set for the routes
    anthropic_defaults: str = ""  # GOINFER_ANTHROPIC_DEFAULTS, likewise
    replicas: int | None = None  # replicas on Ray Serve (None: one process, no Ray)
    threads_per_replica: int | None = None
    ray_address: str | None = None  # a Ray cluster to join (None: a local Ray instance)
    policy: Policy = field(default_factory=Policy)  # how the replicas are chosen

    @property
    def on_ray(self) -> bool:
        return self.replicas is not None or bool(self.ray_address)


def open_app(spec: ReplicaSpec, *, progress: bool = True, instance: str = ""):
    """Load spec's model, make its KV cache and the FastAPI app over them (create_app).
    instance: the replica's tag among replicas ("": the only server)."""
    from goinfer.kv_cache import KVCache
    from goinfer.model import Model
    from goinfer.server.app import create_app

    model = Model.load(
        spec.model,
        threads=spec.threads,
        exact=spec.exact,
        context_length=spec.ctx,
        kv_dtype=spec.kv_dtype,
        progress=progress,
    )
    cache = KVCache(model, max_tokens=spec.kv_tokens, block_size=spec.block_size)
    return create_app(
        model,
        cache,
        model_id=spec.resolved_model_id(),
        api_key=spec.api_key,
        max_batch=spec.max_batch,
        max_queue=spec.max_queue,
        prefill_chunk=spec.prefill_chunk,
        max_body_bytes=spec.max_body,
        draft=spec.draft,
        draft_tokens=spec.draft_tokens,
        instance=instance,
    )
