"""`goinfer bench`: prefill tok/s at several prompt lengths and decode tok/s, medians of repeats.

Prompts are seeded random ids of ordinary (non-special) tokens: the cost of a forward step does
not depend on which tokens they are.  Every prefill runs cold (a fresh KV cache, no reuse).
"""
from __future__ import annotations

import json
import platform
import statistics
import time
from datetime import date

import numpy as np

from goinfer.kv_cache import KVCache


def prompt_ids(model, n: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    special = set(model.tokenizer.special_ids) if hasattr(model.tokenizer, "special_ids") else set()
    ids = rng.integers(0, model.vocab_size, size=n + 64)
    return [int(t) for t in ids if int(t) not in special][:n]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def prefill_seconds(model, ids) -> float:
    """Seconds of one cold prefill of ids (a fresh KV cache, no reuse)."""
    s = model.session(KVCache(model, max_tokens=len(ids) + 16))
    t0 = time.perf_counter()
    s.prefill(ids)
    return time.perf_counter() - t0


def decode_seconds(model, ids, n_tokens: int) -> float:
    """Seconds per greedy decode step (stop tokens ignored) after a cold prefill of ids."""
    s = model.session(KVCache(model, max_tokens=len(ids) + n_tokens + 16))
    logits = s.prefill(ids)
    t0 = time.perf_counter()
    for _ in range(n_tokens):
        logits = s.decode(int(np.argmax(logits)))
    return (time.perf_counter() - t0) / n_tokens


def time_prefill(model, n: int, repeats: int) -> list[float]:
    ids = prompt_ids(model, n)
    return [prefill_seconds(model, ids) for _ in range(repeats)]


def time_decode(model, prompt_len: int, n_tokens: int, repeats: int) -> list[float]:
    """Seconds per decode step (greedy, stop tokens ignored), one value per repeat."""
    ids = prompt_ids(model, prompt_len, seed=1)
    return [decode_seconds(model, ids, n_tokens) for _ in range(repeats)]


def run(model, prompt_lengths=(128, 512, 2048), decode_prompts=(64,), decode_tokens: int = 64,
        repeats: int = 3, warmup: bool = True, log=print) -> dict:
    from goinfer import config

    lengths = [n for n in prompt_lengths if n + 1 <= model.n_ctx]
    if warmup:
        time_prefill(model, min(64, model.n_ctx - 1), 1)
    res = {
        "model": model.name, "path": str(model.path), "arch": model.config.arch,
        "weights": sorted({f"{w.kind}" + (f" (from {w.source_type})" if w.source_type else "")
                           for w in model.impl.weights()}),
        "threads": model.threads, "exact": model.exact, "kv_dtype": model.kv_dtype,
        "machine": _cpu_name(), "date": date.today().isoformat(), "repeats": repeats,
        "goinfer": config(), "prefill": [], "decode": [],
    }
    for n in lengths:
        ts = time_prefill(model, n, repeats)
        med = statistics.median(ts)
        row = {"prompt_tokens": n, "median_s": med, "tok_s": n / med, "runs_s": ts}
        res["prefill"].append(row)
        if log:
            log(f"prefill {n:>6} tokens: {n / med:9.1f} tok/s   (median of {repeats}: {med * 1e3:.1f} ms)")
    for p in decode_prompts:
        if p + decode_tokens > model.n_ctx:
            continue
        ts = time_decode(model, p, decode_tokens, repeats)
        med = statistics.median(ts)
        row = {"prompt_tokens": p, "tokens": decode_tokens, "median_s_per_token": med,
               "tok_s": 1.0 / med, "runs_s_per_token": ts}
        res["decode"].append(row)
        if log:
            log(f"decode after {p:>5} tokens: {1 / med:9.1f} tok/s   ({med * 1e3:.2f} ms/token, "
                f"{decode_tokens} tokens, median of {repeats})")
    return res


def table(res: dict) -> str:
    lines = [f"model {res['model']} ({res['arch']}; weights {', '.join(res['weights'])})",
             f"machine {res['machine']}, threads {res['threads']}, "
             f"kernels {res['goinfer']['kernel_variant']}, KV cache {res['kv_dtype']}, {res['date']}",
             "", "| phase | prompt tokens | tok/s | median ms |", "|---|---|---|---|"]
    for r in res["prefill"]:
        lines.append(f"| prefill | {r['prompt_tokens']} | {r['tok_s']:.1f} | {r['median_s'] * 1e3:.1f} |")
    for r in res["decode"]:
        lines.append(f"| decode ({r['tokens']} tokens) | {r['prompt_tokens']} | {r['tok_s']:.1f} | "
                     f"{r['median_s_per_token'] * 1e3:.2f}/token |")
    return "\n".join(lines)


def to_json(res: dict) -> str:
    return json.dumps(res, indent=2)
