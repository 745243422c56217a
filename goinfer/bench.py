"""`goinfer bench`: prefill tok/s at several prompt lengths and decode tok/s, medians of repeats.

Prompts are seeded random ids of ordinary tokens (types NORMAL and BYTE: what text encodes to;
never a control, user-defined, unknown or unused token such as ``<|im_start|>`` or a ``[PAD]``
row): the cost of a forward step does not depend on which tokens they are.  Every prefill runs
cold (a fresh KV cache, no reuse); each row records the cached tokens its prefills found (0).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from datetime import date

import numpy as np

from goinfer.kv_cache import KVCache
from goinfer.tokenizer import TOKEN_TYPE

ORDINARY = (TOKEN_TYPE.NORMAL, TOKEN_TYPE.BYTE)  # token types plain text encodes to


def prompt_ids(model, n: int, seed: int = 0) -> list[int]:
    """n seeded random ids of ordinary tokens of the model's vocabulary."""
    tok = model.tokenizer
    rng = np.random.default_rng(seed)
    vocab = min(model.vocab_size, tok.vocab_size)  # rows past the tokenizer's are no tokens
    out: list[int] = []
    for _ in range(1000):
        if len(out) >= n:
            return out[:n]
        ids = rng.integers(0, vocab, size=2 * (n - len(out)) + 64)
        out += [int(t) for t in ids if tok.token_type(int(t)) in ORDINARY]
    raise ValueError(f"{n} ordinary tokens not found in the vocabulary ({vocab} tokens)")


# ============================================================================ the machine

# ISA flags that decide which kernels run (goinfer's variants, AMX, llama.cpp's builds)
ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "bmi2",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512vbmi",
    "avx512_bf16",
    "amx_tile",
    "amx_int8",
)


def _lscpu() -> dict[str, str]:
    """lscpu's fields ("Model name" -> "..."), {} where lscpu is missing."""
    try:
        out = subprocess.run(["lscpu", "-J"], capture_output=True, text=True, timeout=10)
        rows = json.loads(out.stdout)["lscpu"]
    except (OSError, ValueError, KeyError, subprocess.SubprocessError):
        return {}
    flat: dict[str, str] = {}

    def walk(items: list) -> None:
        for r in items:
            flat[r["field"].rstrip(":")] = r.get("data") or ""
            walk(r.get("children", []))

    walk(rows)
    return flat


def _cpuinfo() -> dict[str, str]:
    """The first processor's /proc/cpuinfo fields, {} where there is none."""
    out: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                k, _, v = line.partition(":")
                out[k.strip()] = v.strip()
    except OSError:
        pass
    return out


def _int(v) -> int | None:
    try:
        return int(str(v).split()[0])
    except (ValueError, IndexError):
        return None


def machine() -> dict:
    """CPU vendor, model name, family and model, cores, caches, the ISA flags of ISA_FLAGS it
    has, nominal clock and memory: lscpu where present, else /proc/cpuinfo."""
    ls, ci = _lscpu(), _cpuinfo()
    flags = set((ls.get("Flags") or ci.get("flags", "")).split())
    mem = None
    try:
        with open("/proc/meminfo") as f:
            mem = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    mhz = ci.get("cpu MHz")
    return {
        "vendor": ls.get("Vendor ID") or ci.get("vendor_id") or platform.machine(),
        "model_name": ls.get("Model name") or ci.get("model name") or platform.processor(),
        "family": _int(ls.get("CPU family") or ci.get("cpu family")),
        "model": _int(ls.get("Model") or ci.get("model")),
        "logical_cpus": os.cpu_count(),
        "cores_per_socket": _int(ls.get("Core(s) per socket")),
        "sockets": _int(ls.get("Socket(s)")),
        "caches": {k: ls[k] for k in ("L1d cache", "L2 cache", "L3 cache") if ls.get(k)},
        "isa": [f for f in ISA_FLAGS if f in flags],
        "mhz": float(mhz) if mhz else None,
        "memory_gib": mem,
    }


def weight_pages(model) -> dict:
    """How the model's weights are backed in memory (goinfer/layout.py, place_weights): "huge"
    (the mapped layout, mostly 2 MB pages), "copied" (a copy in anonymous huge pages), "small"
    (mapped on 4 KB pages), "process" (converted in process memory, no layout cache); and the
    share of their pages mapped 2 MB at a time, where known."""
    info = model.load_info
    return {"pages": info.pages or "process", "huge_share": info.huge_share}


def mapped_pages(model) -> tuple[str, list] | None:
    """(layout file, its [lo, hi) ranges the weights are mapped from) while the model's weights
    are mapped from its layout cache (their page-cache pages); None when they are not (a copy
    in process memory, or no cache)."""
    info = model.load_info
    if info.path is None or info.pages not in ("huge", "small") or not info.dense:
        return None
    return str(info.path), [list(r) for r in info.dense]


def cold_prefill(model, ids) -> tuple[float, int]:
    """(seconds, cached tokens) of one prefill of ids on a fresh KV cache: the cached count is
    the cache's hit tokens after it, 0 for a cold prefill."""
    cache = KVCache(model, max_tokens=len(ids) + 16)
    s = model.session(cache)
    t0 = time.perf_counter()
    s.prefill(ids)
    dt = time.perf_counter() - t0
    return dt, cache.stats().hit_tokens


def prefill_seconds(model, ids) -> float:
    """Seconds of one cold prefill of ids (a fresh KV cache, no reuse)."""
    return cold_prefill(model, ids)[0]


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


def _prefill_runs(model, n: int, repeats: int) -> tuple[list[float], list[int]]:
    ids = prompt_ids(model, n)
    runs = [cold_prefill(model, ids) for _ in range(repeats)]
    return [t for t, _ in runs], [c for _, c in runs]


def time_decode(model, prompt_len: int, n_tokens: int, repeats: int) -> list[float]:
    """Seconds per decode step (greedy, stop tokens ignored), one value per repeat."""
    ids = prompt_ids(model, prompt_len, seed=1)
    return [decode_seconds(model, ids, n_tokens) for _ in range(repeats)]


def run(
    model,
    prompt_lengths=(128, 512, 2048),
    decode_prompts=(64,),
    decode_tokens: int = 64,
    repeats: int = 3,
    warmup: bool = True,
    log=print,
) -> dict:
    from goinfer import config

    lengths = [n for n in prompt_lengths if n + 1 <= model.n_ctx]
    if warmup:
        time_prefill(model, min(64, model.n_ctx - 1), 1)
    res = {
        "model": model.name,
        "path": str(model.path),
        "arch": model.config.arch,
        "weights": sorted(
            {
                f"{w.kind}" + (f" (from {w.source_type})" if w.source_type else "")
                for w in model.impl.weights()
            }
        ),
        "threads": model.threads,
        "exact": model.exact,
        "kv_dtype": model.kv_dtype,
        "machine": machine(),
        "date": date.today().isoformat(),
        "repeats": repeats,
        "goinfer": config(),
        "weight_pages": weight_pages(model),
        "prefill": [],
        "decode": [],
    }
    for n in lengths:
        ts, cached = _prefill_runs(model, n, repeats)
        med = statistics.median(ts)
        row = {
            "prompt_tokens": n,
            "median_s": med,
            "tok_s": n / med,
            "runs_s": ts,
            "cached_tokens": cached,
        }
        res["prefill"].append(row)
        if log:
            log(
                f"prefill {n:>6} tokens: {n / med:9.1f} tok/s   (median of {repeats}: {med * 1e3:.1f} ms)"
            )
    for p in decode_prompts:
        if p + decode_tokens > model.n_ctx:
            continue
        ts = time_decode(model, p, decode_tokens, repeats)
        med = statistics.median(ts)
        row = {
            "prompt_tokens": p,
            "tokens": decode_tokens,
            "median_s_per_token": med,
            "tok_s": 1.0 / med,
            "runs_s_per_token": ts,
        }
        res["decode"].append(row)
        if log:
            log(
                f"decode after {p:>5} tokens: {1 / med:9.1f} tok/s   ({med * 1e3:.2f} ms/token, "
                f"{decode_tokens} tokens, median of {repeats})"
            )
    return res


def table(res: dict) -> str:
    lines = [
        f"model {res['model']} ({res['arch']}; weights {', '.join(res['weights'])})",
        f"machine {res['machine']['model_name']}, threads {res['threads']}, "
        f"kernels {res['goinfer']['kernel_variant']}, KV cache {res['kv_dtype']}, {res['date']}",
        "",
        "| phase | prompt tokens | tok/s | median ms |",
        "|---|---|---|---|",
    ]
    for r in res["prefill"]:
        lines.append(
            f"| prefill | {r['prompt_tokens']} | {r['tok_s']:.1f} | {r['median_s'] * 1e3:.1f} |"
        )
    for r in res["decode"]:
        lines.append(
            f"| decode ({r['tokens']} tokens) | {r['prompt_tokens']} | {r['tok_s']:.1f} | "
            f"{r['median_s_per_token'] * 1e3:.2f}/token |"
        )
    return "\n".join(lines)


def to_json(res: dict) -> str:
    return json.dumps(res, indent=2)
