"""`goinfer profile`: where the time of a prefill and of decode steps goes, per kernel family.

The model's kernel module is swapped for a proxy that times every call (wall clock around the
compiled call, which releases the GIL and runs its own OpenMP region).  Families:
  matmul     quantize_act, matmul, get_rows
  attention  attention (exact), attention_fast, kv_write; the two attention kernels' time is
             split further into QK (with the key gather), softmax and AV in proportion to the
             thread-time their phase timers measure (attention_phase_timing)
  moe        routing and expert dispatch kernels
  other      norms, RoPE, activations (quantize_gated: a gated activation with its
             quantization), residual adds, and Python between kernel calls
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

from goinfer._kernels import attention_phase_seconds, attention_phase_timing
from goinfer.bench import prompt_ids
from goinfer.errors import ContextLengthError
from goinfer.kv_cache import KVCache

FAMILY = {
    "quantize_act": "matmul",
    "matmul": "matmul",
    "matmul_experts": "matmul",
    "get_rows": "matmul",
    "attention": "attention",
    "attention_fast": "attention",
    "kv_write": "attention",
    "moe_route": "moe",
    "moe_group": "moe",
    "moe_fold": "moe",
}


class _TimedKernels:
    """Forwards attribute access to a kernel module, timing the callables."""

    def __init__(self, kernels):
        self._k = kernels
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def __getattr__(self, name):
        fn = getattr(self._k, name)
        if not callable(fn) or name.startswith("_"):
            return fn
        seconds, calls = self.seconds, self.calls

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                seconds[name] += time.perf_counter() - t0
                calls[name] += 1

        return timed


def _swap(model, proxy):
    impl = model.impl
    old = impl.ops
    impl.ops = proxy
    return old


def _attention_phases(proxy: _TimedKernels, phase_seconds: dict) -> dict:
    """The attention kernels' wall seconds split into QK / softmax / AV by the thread-time
    shares of the kernels' phase timers."""
    wall = proxy.seconds.get("attention", 0.0) + proxy.seconds.get("attention_fast", 0.0)
    timed = sum(phase_seconds.values())
    return {
        ph: {
            "seconds": wall * t / timed if timed else 0.0,
            "share_of_attention": t / timed if timed else 0.0,
        }
        for ph, t in phase_seconds.items()
    }


def _families(proxy: _TimedKernels, total: float) -> dict:
    fam: dict[str, float] = defaultdict(float)
    for name, s in proxy.seconds.items():
        fam[FAMILY.get(name, "other")] += s
    fam["other"] += max(0.0, total - sum(proxy.seconds.values()))
    out = {
        f: {"seconds": fam.get(f, 0.0), "share": fam.get(f, 0.0) / total if total else 0.0}
        for f in ("matmul", "attention", "moe", "other")
    }
    out["kernels"] = {
        n: {"seconds": s, "calls": proxy.calls[n]} for n, s in sorted(proxy.seconds.items())
    }
    return out


def run(model, prompt_tokens: int, decode_tokens: int = 16) -> dict:
    """Profile one cold prefill of prompt_tokens and decode_tokens decode steps after it."""
    if prompt_tokens + decode_tokens + 1 > model.n_ctx:
        raise ContextLengthError(
            f"{prompt_tokens} prompt + {decode_tokens} decode tokens exceed the "
            f"context of {model.n_ctx}: lower --prompt-tokens or raise --ctx"
        )
    ids = prompt_ids(model, prompt_tokens)
    cache = KVCache(model, max_tokens=prompt_tokens + decode_tokens + 16)
    s = model.session(cache)
    model.session(KVCache(model, max_tokens=80)).prefill(ids[:64])  # warm-up
    res = {
        "model": model.name,
        "threads": model.threads,
        "prompt_tokens": prompt_tokens,
        "decode_tokens": decode_tokens,
        "fast_from": model.fast_from,
        "kv_dtype": cache.dtype,
        "kv_bytes_per_token": cache.bytes_per_token,
    }
    proxy = _TimedKernels(model.kernels)
    old = _swap(model, proxy)
    was_timing = attention_phase_timing(True)
    attention_phase_seconds(reset=True)
    try:
        t0 = time.perf_counter()
        logits = s.prefill(ids)
        total = time.perf_counter() - t0
        res["prefill"] = {
            "seconds": total,
            "tok_s": prompt_tokens / total,
            **_families(proxy, total),
            "attention_phases": _attention_phases(proxy, attention_phase_seconds(reset=True)),
        }
        proxy = _TimedKernels(model.kernels)
        model.impl.ops = proxy
        t0 = time.perf_counter()
        for _ in range(decode_tokens):
            logits = s.decode(int(np.argmax(logits)))
        total = time.perf_counter() - t0
        res["decode"] = {
            "seconds": total,
            "tok_s": decode_tokens / total,
            **_families(proxy, total),
            "attention_phases": _attention_phases(proxy, attention_phase_seconds(reset=True)),
        }
    finally:
        model.impl.ops = old
        attention_phase_timing(was_timing)
    return res


def table(res: dict) -> str:
    ff = res["fast_from"]
    attn = "exact attention" if ff is None else f"fast attention from position {ff}"
    lines = [
        f"{res['model']}: prefill {res['prompt_tokens']} tokens ({attn}), {res['decode_tokens']} "
        f"decode steps, {res['threads']} threads, KV cache {res['kv_dtype']} "
        f"({res['kv_bytes_per_token']} bytes/token)",
        "",
        "| phase | total ms | tok/s | matmul | attention | moe | other |",
        "|---|---|---|---|---|---|---|",
    ]
    for ph in ("prefill", "decode"):
        r = res[ph]
        lines.append(
            f"| {ph} | {r['seconds'] * 1e3:.1f} | {r['tok_s']:.1f} | "
            + " | ".join(
                f"{r[f]['share'] * 100:.1f}%" for f in ("matmul", "attention", "moe", "other")
            )
            + " |"
        )
    lines += ["", "| phase | attention QK ms | softmax ms | AV ms |", "|---|---|---|---|"]
    for ph in ("prefill", "decode"):
        a = res[ph]["attention_phases"]
        lines.append(
            f"| {ph} | "
            + " | ".join(
                f"{a[k]['seconds'] * 1e3:.1f} ({a[k]['share_of_attention'] * 100:.0f}%)"
                for k in ("qk", "softmax", "av")
            )
            + " |"
        )
    lines += ["", "| phase | kernel | calls | ms |", "|---|---|---|---|"]
    for ph in ("prefill", "decode"):
        for n, k in res[ph]["kernels"].items():
            lines.append(f"| {ph} | {n} | {k['calls']} | {k['seconds'] * 1e3:.1f} |")
    return "\n".join(lines)
