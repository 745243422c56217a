"""Prometheus text exposition of the server's counters (no client library needed)."""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict

MAX_KEYS = 64  # conversation keys /metrics reports (the most recently used)
MAX_KEY_CHARS = 64


class RequestCounts:
    """HTTP responses by route and status code."""

    def __init__(self):
        self._lock = threading.Lock()
        self._n: Counter = Counter()

    def add(self, path: str, status: int) -> None:
        with self._lock:
            self._n[(path, int(status))] += 1

    def items(self) -> list[tuple[tuple[str, int], int]]:
        with self._lock:
            return sorted(self._n.items())


class KeyStats:
    """Prompt and cached tokens per conversation key (Request.cache_key: OpenAI's
    prompt_cache_key, a client's session id), for the MAX_KEYS most recently used keys: how
    much of each conversation's prompts the prefix cache served."""

    def __init__(self, max_keys: int = MAX_KEYS):
        self._lock = threading.Lock()
        self.max_keys = max_keys
        self._n: OrderedDict[str, list[int]] = OrderedDict()  # key -> [requests, prompt, cached]

    def add(self, key: str | None, prompt_tokens: int, cached_tokens: int) -> None:
        if not key:
            return
        key = key[:MAX_KEY_CHARS]
        with self._lock:
            row = self._n.pop(key, None) or [0, 0, 0]
            row[0] += 1
            row[1] += int(prompt_tokens)
            row[2] += int(cached_tokens)
            self._n[key] = row
            while len(self._n) > self.max_keys:
                self._n.popitem(last=False)

    def items(self) -> list[tuple[str, list[int]]]:
        with self._lock:
            return [(k, list(v)) for k, v in self._n.items()]


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(engine, cache, counts: RequestCounts, keys: KeyStats | None = None) -> str:
    lines: list[str] = []

    def metric(name: str, kind: str, help: str, samples) -> None:
        lines.append(f"# HELP {name} {help}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lab = ",".join(f'{k}="{_esc(str(v))}"' for k, v in labels.items())
            lines.append(f"{name}{{{lab}}} {value}" if lab else f"{name} {value}")

    metric(
        "goinfer_http_requests_total",
        "counter",
        "HTTP responses by route and status code.",
        [({"route": p, "code": c}, n) for (p, c), n in counts.items()],
    )
    metric(
        "goinfer_requests_total",
        "counter",
        "Generation requests by outcome.",
        [
            ({"outcome": "finished"}, engine.n_finished),
            ({"outcome": "cancelled"}, engine.n_cancelled),
            ({"outcome": "failed"}, engine.n_failed),
        ],
    )
    metric(
        "goinfer_preemptions_total",
        "counter",
        "Requests sent back to the queue because the KV cache was full.",
        [({}, engine.n_preempted)],
    )
    metric(
        "goinfer_prompt_tokens_total",
        "counter",
        "Prompt tokens of admitted requests.",
        [({}, engine.prompt_tokens)],
    )
    metric(
        "goinfer_prefix_cache_hit_tokens_total",
        "counter",
        "Prompt tokens served from the shared prefix cache.",
        [({}, engine.cached_tokens)],
    )
    metric(
        "goinfer_prefill_tokens_total",
        "counter",
        "Prompt tokens computed (not cached), recomputation after preemption included.",
        [({}, engine.prefill_tokens)],
    )
    metric(
        "goinfer_decode_tokens_total",
        "counter",
        "Tokens run as decode steps.",
        [({}, engine.decode_tokens)],
    )
    metric(
        "goinfer_completion_tokens_total",
        "counter",
        "Tokens generated for finished requests.",
        [({}, engine.completion_tokens)],
    )
    metric("goinfer_engine_steps_total", "counter", "Batched forward steps.", [({}, engine.steps)])
    metric(
        "goinfer_engine_busy_seconds_total",
        "counter",
        "Time spent in forward steps.",
        [({}, round(engine.busy_seconds, 6))],
    )
    prefill_rate, decode_rate = engine.rates()
    metric(
        "goinfer_prefill_tokens_per_second",
        "gauge",
        "Prompt tokens computed per second over the last 10 s.",
        [({}, round(prefill_rate, 3))],
    )
    metric(
        "goinfer_decode_tokens_per_second",
        "gauge",
        "Decode tokens per second (all sequences) over the last 10 s.",
        [({}, round(decode_rate, 3))],
    )
    metric(
        "goinfer_queue_depth",
        "gauge",
        "Requests waiting for a seat in the batch.",
        [({}, engine.queue_depth)],
    )
    metric(
        "goinfer_active_requests",
        "gauge",
        "Requests in the running batch.",
        [({}, engine.n_active)],
    )
    s = cache.stats()
    metric(
        "goinfer_kv_blocks",
        "gauge",
        "KV cache blocks by state.",
        [
            ({"state": "used"}, s.blocks_used),
            ({"state": "cached"}, s.blocks_cached),
            ({"state": "free"}, s.blocks_free),
        ],
    )
    metric(
        "goinfer_kv_blocks_total", "gauge", "KV cache blocks in the pool.", [({}, s.blocks_total)]
    )
    metric("goinfer_kv_block_tokens", "gauge", "Tokens per KV block.", [({}, s.block_size)])
    metric(
        "goinfer_kv_evictions_total",
        "counter",
        "Cached KV blocks evicted for reuse.",
        [({}, s.evictions)],
    )
    rows = keys.items() if keys is not None else []
    metric(
        "goinfer_cache_key_requests_total",
        "counter",
        f"Finished requests per conversation key (prompt_cache_key; the {MAX_KEYS} most "
        "recently used keys).",
        [({"key": k}, r[0]) for k, r in rows],
    )
    metric(
        "goinfer_cache_key_prompt_tokens_total",
        "counter",
        "Prompt tokens per conversation key.",
        [({"key": k}, r[1]) for k, r in rows],
    )
    metric(
        "goinfer_cache_key_cached_tokens_total",
        "counter",
        "Prompt tokens served from the prefix cache per conversation key.",
        [({"key": k}, r[2]) for k, r in rows],
    )
    return "\n".join(lines) + "\n"
