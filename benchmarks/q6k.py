"""Q6_K tensors: native q6_k against the old conversion to q8_0 (docs/benchmarks.md, "Q6_K in
Q4_K_M files").  Two measurements; the kernel speed is benchmarks/kernels_matmul.py --set q6k-1b.

    PYTHONPATH=. python benchmarks/q6k.py bytes llama-3.2-1b-Q4_K_M.gguf
    PYTHONPATH=. python benchmarks/q6k.py agreement MODEL.gguf --reference F32-ORIGINAL.gguf \
        --text benchmarks/data/agreement_mix.txt [--ctx 1024] [--max-tokens 3072] [--threads 2]
    PYTHONPATH=. python benchmarks/q6k.py paired MODEL.gguf --reference F32-ORIGINAL.gguf \
        --text benchmarks/data/agreement_mix.txt [--ctx 1024] [--windows 3]
    PYTHONPATH=. python benchmarks/q6k.py speed llama-3.2-1b-Q4_K_M.gguf \
        [--prompt 512] [--decode 32] [--rounds 3] [--threads 2] [--clock wall|cpu]

bytes: per GGUF type, the tensors' bytes in the file, in goinfer's layout with Q6_K as q6_k
    (every variant) and as q8_0 (requantized), from the tensor infos (GGUFFile.native_bytes'
    rule).
agreement: teacher-forced top-1 agreement and logit cosine (goinfer.fidelity.compare) of the
    file run as goinfer runs it (int8 activations), Q6_K native and Q6_K requantized to q8_0,
    against REFERENCE: a float32 copy holding the file's exact values
    (`benchmarks/float_copy.py MODEL.gguf F32-ORIGINAL.gguf --values original`), which goinfer
    runs with float matmuls.  Layout cache off (the two conversions must not share one).
paired: --windows windows of --ctx tokens, each BOS + text (as a prompt is run), through the
    reference and both loads; per position the relative RMS logit error against the reference,
    so the two conversions are compared position by position (top-1 over few positions moves
    with a handful of near ties; this statistic does not).
speed: the same file loaded twice (Q6_K as q6_k, Q6_K as q8_0, whatever the variant's own
    choice: on avx512-vnni q6_k runs the AVX2 microkernels), prefill of --prompt tokens
    and --decode greedy decode steps, the two loads alternating for --rounds rounds (the
    machine is shared); per load the median over rounds.  --clock cpu: process CPU seconds
    divided by the threads (the rate while running on a loaded machine).
--smoke: all three on the tiny shape (the test suite).
"""

from __future__ import annotations

import argparse
import contextlib
import json

import numpy as np
import regime


@contextlib.contextmanager
def q6k_as(kind: str):
    """Load Q6_K as KIND ("q6_k": the file's codes repacked; "q8_0": requantized) with the kernel
    variant in use, whatever that variant's own choice is (q6_k on every variant by default)."""
    from goinfer import gguf
    from goinfer._kernels import _config

    how = {"q6_k": "repack", "q8_0": "requantize"}[kind]
    v = str(_config.variant())
    old = gguf.VARIANT_TARGET.get(v)
    gguf.VARIANT_TARGET[v] = {**(old or {}), "Q6_K": (kind, how)}
    try:
        yield
    finally:
        if old is None:
            del gguf.VARIANT_TARGET[v]
        else:
            gguf.VARIANT_TARGET[v] = old


# ============================================================================ bytes


def byte_table(path) -> list[dict]:
    """Per GGUF type: tensors, bytes in the file, bytes in goinfer's layout (Q6_K native / q8_0)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    from goinfer.gguf import GGUFFile, native_target
    from goinfer.quant import ROWS

    per = {
        "f32": 4.0,
        "f16": 2.0,
        "bf16": 2.0,
        "q4_0": 18 / 32,
        "q4_1": 20 / 32,
        "q8_0": 34 / 32,
        "mxfp4": 17 / 32,
        "q6_k": 210 / 256,
        "q4_k": 144 / 256,
        "q5_k": 176 / 256,
        "q5_0": 22 / 32,
        "q5_1": 24 / 32,
    }
    g = GGUFFile(path)
    rows: dict[str, dict] = {}
    for name in g.tensor_names:
        tname, shape = g.tensor_info(name)
        n_el = int(np.prod(shape, dtype=np.int64))
        bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType[tname]]
        r = rows.setdefault(tname, {"type": tname, "tensors": 0, "file": 0, "native": 0, "q8_0": 0})
        r["tensors"] += 1
        r["file"] += n_el * ts // bs
        if len(shape) < 2:
            r["native"] += 4 * n_el
            r["q8_0"] += 4 * n_el
            continue
        padded = n_el // shape[-2] * (-(-shape[-2] // ROWS) * ROWS)
        r["native"] += int(padded * per[native_target(tname, "avx2")[0]])
        r["q8_0"] += int(
            padded * per["q8_0" if tname == "Q6_K" else native_target(tname, "avx2")[0]]
        )
    out = sorted(rows.values(), key=lambda r: -r["file"])
    out.append(
        {
            "type": "total",
            **{k: sum(r[k] for r in out) for k in ("tensors", "file", "native", "q8_0")},
        }
    )
    return out


def print_bytes(path) -> list[dict]:
    rows = byte_table(path)
    print(f"{path}")
    print("| GGUF type | tensors | MB in the GGUF | MB, Q6_K as q6_k | MB, Q6_K as q8_0 |")
    print("|---|---|---|---|---|")
    for r in rows:
        f, n, q = (r[k] / 1e6 for k in ("file", "native", "q8_0"))
        print(
            f"| {r['type']} | {r['tensors']} | {f:.1f} | {n:.1f} ({n / f - 1:+.0%}) | {q:.1f} ({q / f - 1:+.0%}) |"
        )
    return rows


# ============================================================================ agreement


def agreement(path, reference, text, ctx: int, max_tokens: int, threads: int | None) -> list[dict]:
    from goinfer.fidelity import compare, read_ids
    from goinfer.model import Model

    ref = Model.load(reference, threads=threads, layout_cache=False, progress=False)
    ids = read_ids(ref, text, max_tokens=max_tokens)
    res = []
    for label in ("q6_k (native)", "q8_0 (requantized)"):
        with q6k_as(label.split()[0]):
            m = Model.load(path, threads=threads, layout_cache=False, progress=False)
        kinds = sorted({f"{r.source_type}->{r.kind}" for r in m.conversions.rows})
        r = compare(ref, m, ids, ctx=ctx, stride=ctx, progress=False)
        row = {
            "q6_k as": label,
            "top1": r.top1_agreement,
            "cos_mean": r.cosine_mean,
            "cos_min": r.cosine_min,
            "nll_ref": r.nll_a,
            "nll": r.nll_b,
            "positions": r.n_scored,
            "conversions": kinds,
        }
        print(json.dumps(row))
        res.append(row)
        del m
    print(
        "| Q6_K loaded as | positions | top-1 vs the file's exact values | mean logit cosine | min cosine | NLL (ref) |"
    )
    print("|---|---|---|---|---|---|")
    for r in res:
        print(
            f"| {r['q6_k as']} | {r['positions']} | {100 * r['top1']:.2f}% | {r['cos_mean']:.5f} | "
            f"{r['cos_min']:.4f} | {r['nll']:.4f} ({r['nll_ref']:.4f}) |"
        )
    return res


def paired(path, reference, text, ctx: int, n_windows: int, threads: int | None) -> dict:
    from goinfer.fidelity import read_ids
    from goinfer.model import Model

    ref = Model.load(reference, threads=threads, layout_cache=False, progress=False)
    models = {}
    for label in ("q6_k", "q8_0"):
        with q6k_as(label):
            models[label] = Model.load(path, threads=threads, layout_cache=False, progress=False)
    bos = ref.tokenize("", add_special=True)  # [BOS] or []
    ids = read_ids(ref, text, max_tokens=n_windows * ctx)
    err: dict[str, list] = {k: [] for k in models}
    agree = dict.fromkeys(models, 0)
    n = 0
    for w in range(n_windows):
        seq = (bos + list(ids[w * ctx : (w + 1) * ctx]))[:ctx]
        if len(seq) < 2:
            break
        lr = ref.logits(seq).astype(np.float64)  # (T, V)
        for label, m in models.items():
            lg = m.logits(seq).astype(np.float64)
            err[label].append(np.sqrt(((lg - lr) ** 2).mean(1) / (lr**2).mean(1)))  # (T,)
            agree[label] += int((lg.argmax(1) == lr.argmax(1)).sum())
        n += len(seq)
    e6, e8 = np.concatenate(err["q6_k"]), np.concatenate(err["q8_0"])
    res = {
        "positions": n,
        "top1": {k: v / n for k, v in agree.items()},
        "median_err": {"q6_k": float(np.median(e6)), "q8_0": float(np.median(e8))},
        "mean_err": {"q6_k": float(e6.mean()), "q8_0": float(e8.mean())},
        "q6_k_closer": float((e6 < e8).mean()),
    }
    print(json.dumps(res))
    print(
        "| Q6_K loaded as | positions | top-1 vs the file's exact values | median / mean relative logit error | closer than the other at |"
    )
    print("|---|---|---|---|---|")
    for k, e, c in (("q6_k", e6, res["q6_k_closer"]), ("q8_0", e8, float((e8 < e6).mean()))):
        print(
            f"| {k} | {n} | {100 * res['top1'][k]:.2f}% | {np.median(e):.5f} / {e.mean():.5f} | {100 * c:.1f}% of positions |"
        )
    return res


# ============================================================================ speed


def speed(path, prompt: int, decode: int, rounds: int, threads: int | None, clock: str) -> dict:
    import time

    from goinfer.model import Model

    models = {}
    for label in ("q6_k", "q8_0"):
        with q6k_as(label):
            models[label] = Model.load(path, threads=threads, layout_cache=False, progress=False)
    nt = models["q6_k"].threads
    now = (lambda: time.process_time() / nt) if clock == "cpu" else time.perf_counter
    vocab = models["q6_k"].vocab_size
    times: dict[str, list] = {k: [] for k in models}
    for r in range(rounds):
        # new tokens every round (a repeated prompt would come from the prefix cache), the
        # same for both loads
        ids = np.random.default_rng(r).integers(min(100, vocab // 2), vocab, prompt).tolist()
        for label, m in models.items():
            s = m.session()
            t0 = now()
            logits = s.prefill(ids)
            t1 = now()
            tok = int(logits[-1].argmax())
            for _ in range(decode):
                tok = int(s.decode(tok).argmax())
            t2 = now()
            times[label].append((t1 - t0, t2 - t1))
            print(
                f"round {r} {label}: prefill {prompt / (t1 - t0):.1f} tok/s, decode {decode / (t2 - t1):.1f} tok/s"
            )
    res = {}
    print(f"| Q6_K as | prefill {prompt} tok/s | decode {decode} tok/s | rounds |")
    print("|---|---|---|---|")
    for label, ts in times.items():
        p = prompt / float(np.median([t[0] for t in ts]))
        d = decode / float(np.median([t[1] for t in ts]))
        res[label] = {"prefill": p, "decode": d}
        print(f"| {label} | {p:.1f} | {d:.1f} | {rounds} |")
    return res


def smoke() -> dict:
    import tempfile
    from pathlib import Path

    from float_copy import copy
    from shapes import smoke_model

    with tempfile.TemporaryDirectory() as d:
        src = smoke_model(d)
        out = {"bytes": print_bytes(src)}
        ref = Path(d) / "f32.gguf"
        copy(str(src), str(ref), "original", "")
        text = Path(d) / "t.txt"
        text.write_text("The quick brown fox jumps over the lazy dog. " * 4)
        out["agreement"] = agreement(
            str(src), str(ref), str(text), ctx=32, max_tokens=64, threads=1
        )
        out["paired"] = paired(str(src), str(ref), str(text), ctx=16, n_windows=2, threads=1)
        out["speed"] = speed(str(src), prompt=8, decode=2, rounds=1, threads=1, clock="cpu")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("what", nargs="?", choices=["bytes", "agreement", "paired", "speed"])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--reference", help="agreement: float32 copy with the file's exact values")
    ap.add_argument("--text", default="benchmarks/data/agreement_mix.txt")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=3072)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"])
    ap.add_argument(
        "--smoke", action="store_true", help="both measurements on the tiny shape (the test suite)"
    )
    regime.add_json_arg(ap)
    args = ap.parse_args(argv)
    res = {"benchmark": "q6k", "regime": regime.header(args.threads, argv=argv)}
    if args.smoke:
        res.update(smoke())
        return regime.finish(res, args.json)
    if not (args.what and args.model):
        ap.error("bytes|agreement|paired|speed MODEL (or --smoke)")
    res["model"] = regime.model(args.model)
    if args.what in ("agreement", "paired") and not args.reference:
        ap.error(
            f"{args.what} needs --reference F32.gguf (benchmarks/float_copy.py --values original)"
        )
    if args.what == "bytes":
        res["bytes"] = print_bytes(args.model)
    elif args.what == "paired":
        res["paired"] = paired(
            args.model, args.reference, args.text, args.ctx, args.windows, args.threads
        )
    elif args.what == "speed":
        res["speed"] = speed(
            args.model, args.prompt, args.decode, args.rounds, args.threads, args.clock
        )
    else:
        res["agreement"] = agreement(
            args.model, args.reference, args.text, args.ctx, args.max_tokens, args.threads
        )
    return regime.finish(res, args.json)


if __name__ == "__main__":
    main()
