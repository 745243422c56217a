"""Fast vs exact attention on a real model: distance and prefill speed, for docs/benchmarks.md.

    PYTHONPATH=. python benchmarks/numerics_fast_vs_exact.py [MODEL] [--text FILE] \
        [--lengths 1024 2048 4096] [--threads 1] [--reps 2] [--json out.json] \
        [--kv-dtype f16] [--exact-kv-dtype f32]

For each length n: the first n tokens of the text (goinfer's tokenizer, no BOS) as one prompt.
  cosine   of the last position's logits, default mode (fast from position 512) vs exact=True
  top-1    teacher-forced agreement of the two over every position of the prompt, with the
           mean and minimum logit cosine and the mean NLL difference (goinfer.fidelity.compare,
           one window of n tokens)
  speed    Session.prefill(prompt) on a fresh cache, exact and fast alternating, median wall
           and CPU seconds; speed-up = exact / fast (wall, and CPU)

--kv-dtype: the fast model's KV cache type (default f16, goinfer's default); --exact-kv-dtype:
the exact model's (default f32: the float64 kernel over an unrounded cache, the reference), so
a row measures fast attention and the cache type together; give both the same type to see fast
attention alone, or compare two exact types with --exact-only.

--noise-floor: instead, compare exact with exact whose attention outputs get a random
relative perturbation of 2^-24 (about half an ulp of float32) per element: how far a W4A8
model moves for a perturbation far smaller than fast attention's, the floor against which
the fast path's top-1 agreement is read.

--smoke: the tiny shape (benchmarks/shapes.py), one 520-token prompt, both modes (the test suite).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time

import numpy as np
import regime

from goinfer import KVCache, Model, fidelity
from goinfer._kernels import attention_counters, reset_attention_counters


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="smollm2-135m", help="a GGUF or a registered name")
    ap.add_argument(
        "--text",
        default=os.path.join(
            os.path.dirname(__file__), "..", "tests", "data", "tokenizer_corpus.txt"
        ),
    )
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--noise-floor", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="tiny model, one prompt (the test suite)")
    ap.add_argument("--kv-dtype", default="f16", help="the fast model's KV cache type")
    ap.add_argument("--exact-kv-dtype", default="f32", help="the exact model's KV cache type")
    ap.add_argument(
        "--exact-only",
        action="store_true",
        help="the second model is exact too (compare two KV cache types)",
    )
    regime.add_json_arg(ap)
    args = ap.parse_args(argv)
    if args.smoke:
        import tempfile

        from shapes import smoke_model

        with tempfile.TemporaryDirectory() as d:
            args.model, args.lengths, args.reps, args.smoke = str(smoke_model(d)), [520], 1, False
            res = main([args.model, "--lengths", "520", "--reps", "1", "--text", args.text])
            res["noise_floor"] = noise_floor(args)
            res["regime"]["command"] = regime.header(argv=argv)["command"]
        return regime.finish(res, args.json)
    from goinfer import hub

    args.model = str(hub.resolve(args.model, progress=False))
    if args.noise_floor:
        return regime.finish(
            {
                "benchmark": "numerics_noise_floor",
                "regime": regime.header(args.threads, argv=argv),
                "model": regime.model(args.model),
                "rows": noise_floor(args),
            },
            args.json,
        )
    hdr = regime.header(args.threads, argv=argv)
    fast = Model.load(args.model, threads=args.threads, progress=False, kv_dtype=args.kv_dtype)
    fast.exact = args.exact_only
    exact = copy.copy(fast)  # the same weights, exact=True
    exact.exact = True
    exact.kv_dtype = args.exact_kv_dtype
    ids_all = fidelity.read_ids(fast, args.text)
    rows = []
    for n in args.lengths:
        ids = ids_all[:n].tolist()
        times = {"exact": [], "fast": []}
        last, counts = {}, {}
        for _ in range(args.reps):
            for name, m in (("exact", exact), ("fast", fast)):
                s = m.session(KVCache(m, max_tokens=n + 16))
                reset_attention_counters()
                c0, t0 = time.process_time(), time.perf_counter()
                last[name] = s.prefill(ids)
                times[name].append((time.perf_counter() - t0, time.process_time() - c0))
                c = attention_counters()
                assert (c["fast_calls"] > 0) == (name == "fast" and not args.exact_only), c
                counts[name] = c
                s.reset()
        a, b = last["exact"].astype(np.float64), last["fast"].astype(np.float64)
        cos_last = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
        cmp = fidelity.compare(exact, fast, np.asarray(ids, np.int32), n, n, progress=False)
        (we, ce), (wf, cf) = (np.median(np.array(times[k]), axis=0) for k in ("exact", "fast"))
        row = dict(
            n=n,
            cos_last=cos_last,
            same_last_argmax=bool(a.argmax() == b.argmax()),
            top1_agreement=cmp.top1_agreement,
            cos_mean=cmp.cosine_mean,
            cos_min=cmp.cosine_min,
            nll_exact=cmp.nll_a,
            nll_fast=cmp.nll_b,
            exact_wall_s=we,
            exact_cpu_s=ce,
            fast_wall_s=wf,
            fast_cpu_s=cf,
            speedup_wall=we / wf,
            speedup_cpu=ce / cf if cf > 0 else None,
            fast_queries=counts["fast"]["fast_queries"],
            exact_queries_of_fast=counts["fast"]["exact_queries"],
            fast_queries_of_exact=counts["exact"]["fast_queries"],
        )
        rows.append(row)
        print(json.dumps(row), flush=True)
    res = dict(
        benchmark="numerics_fast_vs_exact",
        regime=hdr,
        model=regime.model(args.model),
        text=os.path.basename(args.text),
        kv_dtype=args.kv_dtype,
        exact_kv_dtype=args.exact_kv_dtype,
        exact_only=args.exact_only,
        reps=args.reps,
        rows=rows,
    )
    return regime.finish(res, args.json)


class _NoisyAttention:
    """the kernels module, with attention outputs multiplied by (1 + 2^-24 * N(0, 1))"""

    def __init__(self, kernels, seed=0):
        self._k = kernels
        self._rng = np.random.default_rng(seed)

    def __getattr__(self, name):
        return getattr(self._k, name)

    def attention(self, *a, **kw):
        out = self._k.attention(*a, **kw)
        out *= (1.0 + 2.0**-24 * self._rng.standard_normal(out.shape)).astype(np.float32)
        return out


def noise_floor(args) -> list[dict]:
    exact = Model.load(args.model, threads=args.threads, exact=True, progress=False)
    noisy = Model.load(args.model, threads=args.threads, exact=True, progress=False)
    noisy.impl.ops = _NoisyAttention(noisy.impl.ops)
    ids_all = fidelity.read_ids(exact, args.text)
    rows = []
    for n in args.lengths:
        cmp = fidelity.compare(exact, noisy, ids_all[:n], n, n, progress=False)
        rows.append(
            dict(
                n=n,
                top1_agreement=cmp.top1_agreement,
                cos_mean=cmp.cosine_mean,
                cos_min=cmp.cosine_min,
                nll_diff=cmp.nll_diff_mean,
            )
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
