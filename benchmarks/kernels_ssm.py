"""Linear-attention kernel timing (one Gated DeltaNet layer): gated_delta and ssm_conv.

    PYTHONPATH=. python benchmarks/kernels_ssm.py [--T 512] [--heads 16x32x128] [--threads 2]
        [--variant NAME ...] [--repeats 7]
    PYTHONPATH=. python benchmarks/kernels_ssm.py --smoke   # tiny, one repeat (the test suite)

One layer's calls at a shape HKxHVxD (key heads x value heads x head dim; Qwen3.5-4B:
16x32x128, conv width 4): gated_delta over T tokens from a fresh state, and ssm_conv over the
(T, 2*HK*D + HV*D) q|k|v rows.  Seeded standard-normal inputs (the kernel tests' scale: no
denormals).  Per variant, median and min wall ms of --repeats calls, and for gated_delta the
state bytes a call streams through (3 x HV x D x D x 4 bytes per token: two reads, one write).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import regime

from goinfer._kernels import _config, ssm


def inputs(T: int, Hk: int, Hv: int, d: int, K: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    C = 2 * Hk * d + Hv * d
    return dict(
        qkv=rng.standard_normal((T, C)).astype(np.float32),  # (T, C): q | k | v
        ab=(2 * rng.standard_normal((T, 2 * Hv))).astype(np.float32),  # (T, 2 Hv): beta | alpha
        A=-rng.uniform(0.05, 8.0, Hv).astype(np.float32),  # (Hv,)
        dt=rng.standard_normal(Hv).astype(np.float32),  # (Hv,)
        state=rng.standard_normal((Hv, d, d)).astype(np.float32),  # (Hv, dk, dv)
        wT=rng.standard_normal((K, C)).astype(np.float32),  # (K, C) conv taps
        conv_state=rng.standard_normal((K - 1, C)).astype(np.float32),  # (K-1, C)
    )


def timed(fn, repeats: int) -> tuple[float, float]:
    """(median, min) ms of repeats calls after one warm-up call."""
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts), min(ts)


def run(T: int, Hk: int, Hv: int, d: int, threads: int, variant: str, repeats: int) -> dict:
    x = inputs(T, Hk, Hv, d)
    old = _config.variant()
    _config.set_variant(variant)
    try:
        gd = timed(
            lambda: ssm.gated_delta(
                x["qkv"], x["ab"], x["A"], x["dt"], x["state"].copy(), Hk, nthreads=threads
            ),
            repeats,
        )
        cv = timed(
            lambda: ssm.ssm_conv(x["qkv"], x["wT"], x["conv_state"].copy(), nthreads=threads),
            repeats,
        )
    finally:
        _config.set_variant(old)
    gbs = 3 * Hv * d * d * 4 * T / (gd[0] * 1e-3) / 1e9
    return {"variant": variant, "gated_delta_ms": gd, "ssm_conv_ms": cv, "state_gb_s": gbs}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=512, help="tokens per call")
    ap.add_argument("--heads", default="16x32x128", help="HKxHVxD (Qwen3.5-4B: 16x32x128)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--variant", nargs="*", default=None, help="ISA variants (default: all supported)"
    )
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--smoke", action="store_true", help="tiny shape, one repeat (the test suite)")
    regime.add_json_arg(ap)
    args = ap.parse_args(argv)
    if args.smoke:
        args.T, args.heads, args.repeats = 8, "1x2x16", 1
    try:
        Hk, Hv, d = (int(v) for v in args.heads.split("x"))
    except ValueError:
        ap.error(f"--heads wants HKxHVxD, got {args.heads!r}")
    variants = args.variant or _config.supported_variants()
    hdr = regime.header(args.threads, argv=argv)
    print(f"T {args.T}, heads {Hk}x{Hv}x{d}, {args.threads} threads, medians of {args.repeats}")
    print("| variant | gated_delta ms (min) | state GB/s | ssm_conv ms (min) |")
    print("|---|---|---|---|")
    rows = []
    for v in variants:
        r = run(args.T, Hk, Hv, d, args.threads, v, args.repeats)
        rows.append(r)
        (gm, gn), (cm, cn) = r["gated_delta_ms"], r["ssm_conv_ms"]
        print(
            f"| {v} | {gm:.2f} ({gn:.2f}) | {r['state_gb_s']:.1f} | {cm:.2f} ({cn:.2f}) |",
            flush=True,
        )
    return regime.finish(
        {
            "benchmark": "kernels_ssm",
            "regime": hdr,
            "T": args.T,
            "heads": [Hk, Hv, d],
            "repeats": args.repeats,
            "rows": rows,
        },
        args.json,
    )


if __name__ == "__main__":
    main()
