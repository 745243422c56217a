"""goinfer vs llama.cpp (llama-cpp-python) side by side on the same GGUF, same threads,
alternating runs; medians and ratios; JSON out.  Optionally transformers (float32) prefill.

    python benchmarks/peers.py MODEL.gguf [--threads 2] [--prompt-lengths 512,2048]
        [--decode-prompts 64,2048] [--decode-tokens 32] [--repeats 5] [--flash-attn both]
        [--kv-dtype f16[,q8_0,f32]] [--transformers] [--json out.json] [--no-llama-cpp | --no-goinfer]

Needs goinfer and llama-cpp-python in one environment (an optional benchmark extra:
`pip install '.[bench]'`, never a CI dependency; without it only goinfer runs and the table
says the peer was skipped).  MODEL can be any GGUF, e.g. the shapes of real 1B-8B models that
benchmarks/shapes.py writes.  --smoke: the tiny shape, one short run of each row (the test
suite's check that the script runs).  Every prefill is cold (a fresh KV state);
decode is greedy from a random prompt of the given length.  Prompts are seeded random ids of
ordinary tokens, identical for both engines.  --kv-dtype: goinfer's KV cache storage type(s),
one goinfer engine each (llama.cpp keeps its default f16 cache); ratios are against llama.cpp's
best engine of the row.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import numpy as np


def _ids(vocab: int, n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(200, vocab - 200, n)]


# ============================================================================ engines


class GoinferEngine:
    name = "goinfer"

    def __init__(self, path, threads, exact=False, kv_dtype="f16", tag=False):
        import goinfer
        from goinfer import bench

        self.bench = bench
        self.model = goinfer.Model.load(path, threads=threads, exact=exact, progress=False,
                                        kv_dtype=kv_dtype)
        self.label = ("goinfer" + (f" {kv_dtype}" if tag else "")
                      + (" (exact)" if exact else ""))

    def prefill(self, ids) -> float:
        return self.bench.prefill_seconds(self.model, ids)

    def decode(self, ids, n) -> float:
        return self.bench.decode_seconds(self.model, ids, n)

    def weights(self) -> list[str]:
        """Native weight kinds and the GGUF types they came from (conversions included)."""
        return sorted({w.kind + (f" (from {w.source_type})" if w.source_type else "")
                       for w in self.model.impl.weights()})


class LlamaCppEngine:
    def __init__(self, path, threads, n_ctx, flash_attn):
        from llama_cpp import Llama

        self.llm = Llama(path, n_ctx=n_ctx, n_batch=min(n_ctx, 2048), n_ubatch=512,
                         n_threads=threads, n_threads_batch=threads, flash_attn=flash_attn,
                         verbose=False)
        self.label = "llama.cpp" + (" flash-attn" if flash_attn else "")

    def prefill(self, ids) -> float:
        self.llm.reset()  # eval() drops cached positions >= n_tokens: a cold prefill
        t0 = time.perf_counter()
        self.llm.eval(ids)
        return time.perf_counter() - t0

    def decode(self, ids, n) -> float:
        self.llm.reset()
        self.llm.eval(ids)
        tok = self.next_token()
        t0 = time.perf_counter()
        for _ in range(n):
            self.llm.eval([tok])
            tok = self.next_token()
        return (time.perf_counter() - t0) / n

    def next_token(self) -> int:
        """Greedy next token from the last evaluated row (Llama keeps no scores without
        logits_all: read the context's logits, as goinfer's decode loop reads its own)."""
        row = np.ctypeslib.as_array(self.llm._ctx.get_logits_ith(-1), shape=(self.llm.n_vocab(),))
        return int(np.argmax(row))


class TransformersEngine:
    label = "transformers float32"

    def __init__(self, path, threads):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch = torch
        p = Path(path)
        self.model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name,
                                                          dtype=torch.float32).eval()

    def prefill(self, ids) -> float:
        with self.torch.no_grad():
            t0 = time.perf_counter()
            self.model(self.torch.tensor([ids]), use_cache=True)
            return time.perf_counter() - t0


# ============================================================================ driver


def machine() -> dict:
    cpu = platform.processor()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "load_avg": os.getloadavg()}


def alternate(engines, fn, repeats):
    """Run fn(engine) for each engine in turn, repeats times; returns per engine list of values."""
    out = {e.label: [] for e in engines}
    for _ in range(repeats):
        for e in engines:
            out[e.label].append(fn(e))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-lengths", default="512,2048")
    ap.add_argument("--decode-prompts", default="64,2048")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--flash-attn", choices=["on", "off", "both"], default="both")
    ap.add_argument("--exact", "--exact-prefill", dest="exact", action="store_true",
                    help="also run goinfer with exact=True (float64 attention everywhere)")
    ap.add_argument("--kv-dtype", default="f16", help="goinfer KV cache type(s), comma-separated")
    ap.add_argument("--transformers", action="store_true", help="also time transformers prefill")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--no-goinfer", action="store_true",
                    help="llama.cpp only: models too big for both engines in one process's memory "
                         "(gpt-oss-20b on 24 GB: run the two sides as separate processes)")
    ap.add_argument("--smoke", action="store_true", help="tiny model, one short run (the test suite)")
    args = ap.parse_args(argv)
    import tempfile

    import goinfer
    from goinfer.gguf import GGUFFile

    tmp = tempfile.TemporaryDirectory()
    if args.smoke:
        from shapes import smoke_model  # benchmarks/ is on sys.path when run as a script

        args.model = str(smoke_model(tmp.name))
        args.prompt_lengths, args.decode_prompts = "64", "16"
        args.decode_tokens, args.repeats, args.flash_attn = 2, 1, "off"
    if not args.model:
        ap.error("a model path is needed (or --smoke)")
    llama_cpp = None
    if not args.no_llama_cpp:
        try:
            import llama_cpp
        except ImportError:
            print("llama.cpp: skipped (llama-cpp-python is not installed)", flush=True)

    lengths = [int(x) for x in args.prompt_lengths.split(",") if x]
    dprompts = [int(x) for x in args.decode_prompts.split(",") if x]
    need = max(lengths + [p + args.decode_tokens for p in dprompts])  # tokens the longest row holds
    n_ctx = need + 64
    with GGUFFile(args.model) as g:  # the training context both engines read, before any load
        ctx = g.arch_get("context_length")
    if ctx is not None and need > ctx:
        ap.error(f"the rows need {need} tokens of context (longest prompt, or decode prompt "
                 f"+ --decode-tokens); {Path(args.model).name} has {ctx}")
    kvs = [k for k in args.kv_dtype.split(",") if k]
    engines = [] if args.no_goinfer else [GoinferEngine(args.model, args.threads, kv_dtype=k,
                                                         tag=len(kvs) > 1) for k in kvs]
    if args.exact and not args.no_goinfer:
        engines.append(GoinferEngine(args.model, args.threads, exact=True, kv_dtype=kvs[0],
                                     tag=len(kvs) > 1))
    fas = {"on": [True], "off": [False], "both": [False, True]}[args.flash_attn]
    if llama_cpp is not None:
        engines += [LlamaCppEngine(args.model, args.threads, n_ctx, fa) for fa in fas]
    if not engines:
        ap.error("no engine left to run (--no-goinfer without llama-cpp-python)")
    g0 = engines[0] if not args.no_goinfer else None
    vocab = g0.model.vocab_size if g0 else engines[0].llm.n_vocab()
    hf = TransformersEngine(args.model, args.threads) if args.transformers else None

    res = {"model": Path(args.model).name, "date": date.today().isoformat(),
           "threads": args.threads, "repeats": args.repeats, "machine": machine(),
           "llama_cpp_python": (llama_cpp.__version__ if llama_cpp is not None else
                                "not run (--no-llama-cpp)" if args.no_llama_cpp else
                                "skipped (not installed)"),
           "goinfer": goinfer.config(), "goinfer_load": g0.model.load_info.source if g0 else "not run",
           "goinfer_weights": g0.weights() if g0 else ["not run"], "prefill": [], "decode": []}
    for n in lengths:
        ids = _ids(vocab, n, seed=n)
        for e in engines:  # warm-up
            e.prefill(ids[:64])
        runs = alternate(engines, lambda e: e.prefill(ids), args.repeats)
        if hf is not None:
            runs[hf.label] = [hf.prefill(ids) for _ in range(max(1, args.repeats // 2))]
        row = {"prompt_tokens": n, "tok_s": {k: n / statistics.median(v) for k, v in runs.items()},
               "runs_s": runs}
        res["prefill"].append(row)
        print(f"prefill {n}: " + ", ".join(f"{k} {v:.1f}" for k, v in row["tok_s"].items()), flush=True)
    for p in dprompts:
        ids = _ids(vocab, p, seed=10_000 + p)
        runs = alternate(engines, lambda e: e.decode(ids, args.decode_tokens), args.repeats)
        row = {"prompt_tokens": p, "tokens": args.decode_tokens,
               "tok_s": {k: 1.0 / statistics.median(v) for k, v in runs.items()},
               "runs_s_per_token": runs}
        res["decode"].append(row)
        print(f"decode after {p}: " + ", ".join(f"{k} {v:.1f}" for k, v in row["tok_s"].items()), flush=True)
    res["machine"]["load_avg_end"] = os.getloadavg()
    text = json.dumps(res, indent=2)
    if args.json:
        Path(args.json).write_text(text)
    print(table(res))
    tmp.cleanup()
    return res


def table(res) -> str:
    """One line per row: every engine's tok/s, and each goinfer engine's ratio to llama.cpp's
    best engine of the row."""
    lines = [f"{res['model']}, {res['threads']} threads, {res['machine']['cpu']}, {res['date']}, "
             f"medians of {res['repeats']} alternating runs, load {res['machine']['load_avg']}; "
             f"llama-cpp-python {res['llama_cpp_python']}; goinfer weights: "
             f"{', '.join(res['goinfer_weights'])}"]
    for kind, key, fmt in (("prefill", "prefill", ".0f"), ("decode after", "decode", ".1f")):
        for r in res[key]:
            ts = r["tok_s"]
            peers = {k: v for k, v in ts.items() if not k.startswith("goinfer") and "transformers" not in k}
            best = max(peers.values()) if peers else None
            parts = [f"{k} {v:{fmt}}" for k, v in ts.items()]
            if best:
                parts += [f"{k} x{v / best:.2f} of llama.cpp's best" for k, v in ts.items()
                          if k.startswith("goinfer")]
            lines.append(f"{kind} {r['prompt_tokens']:>5}: " + ", ".join(parts) + " tok/s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
