"""Cost of one sampled step of the sampler (goinfer/sampling.py) on a large vocabulary, per
setting of the chain, against sorting the whole vocabulary (what the sampler did before it
sorted only what a cut needs; kept here as the baseline, `full_sort_sample`).

    PYTHONPATH=. python benchmarks/sampling.py [--vocab 262144] [--calls 15] [--rounds 3]
    PYTHONPATH=. python benchmarks/sampling.py --smoke

Logits: float32, standard normal x 2.5 ("flat": the nucleus holds most of the vocabulary) and
the same with 200 tokens raised by 12 ("peaked": an LM's usual shape).  Temperature 0.8.
Medians of --calls calls, the best of --rounds alternating rounds (the machine is shared).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import regime

from goinfer.sampling import Sampler, SamplingParams

SETTINGS = [
    dict(),
    dict(top_k=40),
    dict(top_p=0.95),
    dict(min_p=0.05),
    dict(top_k=40, top_p=0.95, min_p=0.05),
]


def full_sort_sample(s: Sampler, logits) -> int:
    """The baseline: rank every token (a stable argsort of the vocabulary), then the chain."""
    p = s.params
    z = s.adjust(logits)
    order = np.argsort(-z, kind="stable")
    if p.top_k > 0:
        order = order[: p.top_k]
    zs = z[order] - z[order[0]]
    probs = np.exp(zs)
    probs /= probs.sum()
    keep = len(order)
    if p.top_p < 1.0:
        keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p, side="left")) + 1)
    if p.min_p > 0.0:
        keep = min(keep, max(1, int((probs >= p.min_p * probs[0]).sum())))
    w = np.exp(zs[:keep] / p.temperature)
    return int(order[s.rng.choice(keep, p=w / w.sum())])


def median_ms(fn, calls: int) -> float:
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=262144)
    ap.add_argument("--calls", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="small vocabulary, one round")
    regime.add_json_arg(ap)
    a = ap.parse_args(argv)
    res = {
        "benchmark": "sampling",
        "regime": regime.header(1, argv=argv),
        "vocab": a.vocab,
        "calls": a.calls,
        "rounds": a.rounds,
        "temperature": 0.8,
        "rows": [],
    }
    if a.smoke:
        a.vocab, a.calls, a.rounds = 4096, 3, 1
    rng = np.random.default_rng(0)
    flat = (rng.standard_normal(a.vocab) * 2.5).astype(np.float32)
    peaked = flat + np.where(np.arange(a.vocab) < 200, 12.0, 0.0).astype(np.float32)
    print(
        f"vocabulary {a.vocab}, temperature 0.8, ms per sampled step (median of {a.calls}, "
        f"best of {a.rounds} alternating rounds)"
    )
    print("| logits | setting | full sort | goinfer | ratio |\n|---|---|---|---|---|")
    for name, z in (("flat", flat), ("peaked", peaked)):
        for kw in SETTINGS:
            s = Sampler(SamplingParams(temperature=0.8, seed=0, **kw), a.vocab)
            base, ours = [], []
            for _ in range(a.rounds):
                base.append(median_ms(lambda: full_sort_sample(s, z), a.calls))
                ours.append(median_ms(lambda: s.sample(z), a.calls))
            b, o = min(base), min(ours)
            label = ", ".join(f"{k}={v}" for k, v in kw.items()) or "temperature only"
            res["rows"].append(
                {
                    "logits": name,
                    "setting": label,
                    "full_sort_ms": b,
                    "goinfer_ms": o,
                    "ratio": b / o,
                }
            )
            print(f"| {name} | {label} | {b:.1f} | {o:.1f} | {b / o:.1f}x |")
    return regime.finish(res, a.json)


if __name__ == "__main__":
    main()
