"""Whole-model decode under GEMV settings (prefetch, streams, warm) interleaved in one process.

    python benchmarks/decode_prefetch.py MODEL [--settings default,8] [--prompt 4096] \
        [--rounds 40] [--steps 4] [--threads 2] [--kernels] [--json out.json]

One session prefills --prompt tokens, then decodes in bursts of --steps greedy tokens, each
burst under one setting of the decode GEMV's near prefetch distance (goinfer._kernels._config.
set_gemv_prefetch: `default` is each weight kind's default on this CPU, `N` is N groups of 32
weights ahead for every kind, 0 none, `q4_0=8/q6_k=16` sets those kinds and leaves the others
at their defaults), of its far prefetch distance (`far=N`: set_gemv_prefetch_far) and of the
row blocks it reads per call (`streams=N`, 1..4: set_gemv_streams) and of the KB of each
matmul's weight that threads waiting in a replayed step prefetch (`warm=N`, 0 none:
set_gemv_warm); the parts of a setting join with `/` (`streams=1/far=0`), what a setting does
not name keeps its default; a round
runs every setting once, in the given order on even rounds and
reversed on odd ones. So the settings meet the same host: on a shared host whose read bandwidth
moves between phases over seconds to minutes, runs in separate processes minutes apart compare
phases, not settings, while bursts a fraction of a second apart meet the same phase. The
context grows by rounds x settings x steps tokens over the run, alike for every setting.
Reported per setting: the median ms per token over the rounds, tok/s, and the rounds it beat
the first setting. --kernels: time each kernel family too (goinfer.profile's proxy: every
kernel call from Python, not the replayed graph, so slower overall) to see where a setting's
time goes. The bits are the same under every setting (tests/test_kernels_matmul.py), so every
burst decodes the tokens it would under any other. --smoke: the tiny shape
(benchmarks/shapes.py), 2 rounds (the test suite).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time

import numpy as np
import regime

from goinfer import KVCache, hub
from goinfer._kernels import _config
from goinfer.bench import prompt_ids
from goinfer.model import Model
from goinfer.profile import FAMILY, _TimedKernels


def parse_setting(s: str) -> dict:
    """`default` -> {} (every default); `N` -> {"near": N} (every kind); `KIND=N[/KIND=N...]` ->
    {"near": {kind: N}} (the kinds not named keep their default), with `far=N`, `streams=N` and
    `warm=N` among the parts -> {"far": N}, ...: the setters' forms, checked by them"""
    if s == "default":
        return {}
    out: dict = {}
    try:
        if "=" in s:
            near = {}
            for part in s.split("/"):
                k, v = part.split("=")
                if k in ("far", "streams", "warm"):
                    out[k] = int(v)
                else:
                    near[k] = int(v)
            if near:
                out["near"] = near
        else:
            out["near"] = int(s)
        with applied(out):  # the setters check the kinds, distances and counts
            pass
    except ValueError as e:
        raise SystemExit(
            "a setting is `default`, N or KIND=N, far=N, streams=N, warm=N joined by /, "
            f"got {s!r}: {e}"
        ) from None
    return out


@contextlib.contextmanager
def applied(setting: dict):
    """the GEMV under a parsed setting for the block, every default again after it"""
    try:
        _config.set_gemv_prefetch(setting.get("near"))
        _config.set_gemv_prefetch_far(setting.get("far"))
        _config.set_gemv_streams(setting.get("streams"))
        _config.set_gemv_warm(setting.get("warm"))
        yield
    finally:
        _config.set_gemv_prefetch(None)
        _config.set_gemv_prefetch_far(None)
        _config.set_gemv_streams(None)
        _config.set_gemv_warm(None)


def run(model, settings: list[str], prompt: int, rounds: int, steps: int, kernels: bool) -> dict:
    """decode bursts under each setting in turn after one prefill of prompt tokens"""
    parsed = {x: parse_setting(x) for x in settings}
    need = prompt + rounds * len(settings) * steps + 8
    s = model.session(KVCache(model, max_tokens=need))
    logits = s.prefill(prompt_ids(model, prompt))
    tok = int(np.argmax(logits))
    for _ in range(2):  # warm-up: the first steps after a prefill bind the graph
        tok = int(np.argmax(s.decode(tok)))
    per = {x: [] for x in settings}
    proxies = {x: _TimedKernels(model.kernels) for x in settings} if kernels else {}
    ops = model.impl.ops
    try:
        for r in range(rounds):
            for x in settings if r % 2 == 0 else settings[::-1]:
                with applied(parsed[x]):
                    if kernels:
                        model.impl.ops = proxies[x]
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        tok = int(np.argmax(s.decode(tok)))
                    per[x].append((time.perf_counter() - t0) / steps)
                    model.impl.ops = ops
    finally:
        model.impl.ops = ops
    first = settings[0]
    rows = []
    for x in settings:
        med = statistics.median(per[x])
        row = {
            "setting": x,
            **_gemv(parsed[x]),
            "ms_per_token": med * 1e3,
            "tok_s": 1 / med,
            "speed_vs_first": statistics.median(per[first]) / med,
            "rounds_faster_than_first": sum(a < b for a, b in zip(per[x], per[first])),
            "round_ms": [t * 1e3 for t in per[x]],
        }
        if kernels:
            fam: dict[str, float] = {}
            for name, sec in proxies[x].seconds.items():
                key = FAMILY.get(name, "other")
                fam[key] = fam.get(key, 0.0) + sec * 1e3 / (rounds * steps)
            row["kernel_ms_per_token"] = {
                k: v * 1e3 / (rounds * steps) for k, v in sorted(proxies[x].seconds.items())
            }
            row["kernel_calls"] = dict(sorted(proxies[x].calls.items()))
            row["family_ms_per_token"] = fam
        rows.append(row)
    return {"rows": rows, "decoded_tokens": rounds * len(settings) * steps}


def _gemv(setting: dict) -> dict:
    """what a parsed setting gives: {"distances": {kind: groups}, "far": groups, "streams": n,
    "warm_kb": kb}"""
    with applied(setting):
        return {
            "distances": _config.gemv_prefetch(),
            "far": _config.gemv_prefetch_far(),
            "streams": _config.gemv_streams(),
            "warm_kb": _config.gemv_warm(),
        }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--settings", default="default,8")
    ap.add_argument("--prompt", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kernels", action="store_true", help="time each kernel family too")
    ap.add_argument("--smoke", action="store_true", help="tiny model, 2 rounds (the test suite)")
    regime.add_json_arg(ap)
    a = ap.parse_args(argv)
    tmp = tempfile.TemporaryDirectory()
    if a.smoke:
        from shapes import smoke_model

        a.model, a.prompt, a.rounds, a.steps = str(smoke_model(tmp.name)), 32, 2, 2
        a.settings, a.kernels = "default,0,q4_0=8/streams=2/far=0/warm=0", True
    settings = a.settings.split(",")
    for x in settings:
        parse_setting(x)
    if len(set(settings)) != len(settings) or len(settings) < 2:
        raise SystemExit("--settings: two or more distinct settings")
    path = str(hub.resolve(a.model, progress=False))
    hdr = regime.header(a.threads, argv=argv)
    model = Model.load(
        path,
        threads=a.threads,
        context_length=a.prompt + a.rounds * len(settings) * a.steps + 16,
        progress=False,
    )
    print(
        f"{model.name}: decode after {a.prompt} tokens, {a.rounds} rounds of {a.steps} tokens "
        f"per setting, variant {_config.variant()}, {a.threads} threads",
        flush=True,
    )
    out = run(model, settings, a.prompt, a.rounds, a.steps, a.kernels)
    for r in out["rows"]:
        fam = r.get("family_ms_per_token")
        print(
            f"{r['setting']:>8}: {r['ms_per_token']:7.2f} ms/token {r['tok_s']:7.2f} tok/s  "
            f"x{r['speed_vs_first']:.3f} of {settings[0]}, faster in "
            f"{r['rounds_faster_than_first']}/{a.rounds} rounds"
            + ("  " + " ".join(f"{k} {v:.2f}" for k, v in sorted(fam.items())) if fam else ""),
            flush=True,
        )
    res = {
        "benchmark": "decode_prefetch",
        "regime": hdr,
        "model": regime.model(path),
        "variant": _config.variant(),
        "prompt_tokens": a.prompt,
        "rounds": a.rounds,
        "steps": a.steps,
        **out,
    }
    tmp.cleanup()
    return regime.finish(res, a.json)


if __name__ == "__main__":
    main()
