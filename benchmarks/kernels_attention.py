"""Exact attention kernel timing at SmolLM2-135M's shape (one layer).

    PYTHONPATH=. python benchmarks/kernels_attention.py [--threads 1 2] [--variant NAME]

9 query heads, 3 kv heads, head_dim 64, block 16.  Decode (T=1) at several contexts and
prefill (T queries at positions 0..T-1 over the T keys just written).  Median (and min) of
repeated calls, wall clock, in ms, and GFLOP/s counting 4 * hd flops per (query head, visible key): 2*hd for QK
and 2*hd for AV (the exp and the softmax bookkeeping are not counted).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from goinfer._kernels import _config, attention, kv_write

H, N_KV, HD, BS = 9, 3, 64, 16


def make_cache(n_tokens: int, rng):
    nb = (n_tokens + BS - 1) // BS
    k_cache = np.zeros((nb + 4, N_KV, HD, BS), np.float32)
    v_cache = np.zeros((nb + 4, N_KV, BS, HD), np.float32)
    block_table = rng.permutation(nb + 4)[:nb].astype(np.int32)  # non-contiguous ids
    k = rng.standard_normal((n_tokens, N_KV, HD)).astype(np.float32)
    v = rng.standard_normal((n_tokens, N_KV, HD)).astype(np.float32)
    pos = np.arange(n_tokens)
    slots = (block_table[pos // BS].astype(np.int64) * BS + pos % BS).astype(np.int64)
    kv_write(k_cache, v_cache, k, v, slots)
    return k_cache, v_cache, block_table


def bench(fn, min_time=0.4, max_reps=200):
    """(median, min) wall-clock seconds of repeated calls"""
    fn()  # warm up
    times = []
    t_end = time.perf_counter() + min_time
    while len(times) < 5 or (time.perf_counter() < t_end and len(times) < max_reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), float(np.min(times))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--variant", default=None)
    args = ap.parse_args()
    if args.variant:
        _config.set_variant(args.variant)
    rng = np.random.default_rng(0)
    scale = 1.0 / np.sqrt(HD)
    cases = [("decode", 64), ("decode", 512), ("decode", 2048), ("decode", 8192),
             ("prefill", 512), ("prefill", 2048)]
    print(f"variant {_config.variant()}, H={H} n_kv={N_KV} hd={HD} bs={BS}")
    print(f"{'case':<16}{'threads':>8}{'median ms':>11}{'GFLOP/s':>9}{'min ms':>9}{'GFLOP/s':>9}")
    for kind, n in cases:
        k_cache, v_cache, bt = make_cache(n, rng)
        if kind == "decode":
            T = 1
            q_pos = np.array([n - 1], np.int32)
            keys = n
        else:
            T = n
            q_pos = np.arange(n, dtype=np.int32)
            keys = n * (n + 1) // 2
        q = rng.standard_normal((T, H, HD)).astype(np.float32)
        out = np.empty_like(q)
        flops = 4.0 * HD * keys * H
        for nt in args.threads:
            t, tmin = bench(lambda: attention(q, k_cache, v_cache, bt, q_pos, scale, out=out,
                                              nthreads=nt))
            print(f"{kind + ' ' + str(n):<16}{nt:>8}{t * 1e3:>11.3f}{flops / t * 1e-9:>9.2f}"
                  f"{tmin * 1e3:>9.3f}{flops / tmin * 1e-9:>9.2f}")


if __name__ == "__main__":
    main()
