"""llama.cpp's prefill and decode speed (through llama-cpp-python) measured the way
`goinfer bench` measures goinfer's, on the same prompt ids, for side-by-side numbers.

    python benchmarks/llama_cpp_speed.py MODEL.gguf [--prompt-lengths 512,2048] \
        [--decode-prompts 64] [--decode-tokens 64] [--repeats 3] [--threads 2]

Prefill: a cold context (KV cache cleared) evaluates the whole prompt (n_batch = prompt length,
llama.cpp's default micro-batch of 512), logits of the last position only, wall time.  Decode:
after a prompt, greedy steps of one token each (argmax of the last logits), seconds per step.
Medians of --repeats.  Prompt ids: goinfer.bench.prompt_ids (seeded random non-special tokens).
Needs llama-cpp-python and goinfer in one environment (e.g. /tmp/peers-venv with goinfer on
PYTHONPATH).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import date

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt-lengths", default="512,2048")
    ap.add_argument("--decode-prompts", default="64")
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    import llama_cpp

    import goinfer
    from goinfer.bench import prompt_ids

    gm = goinfer.Model.load(args.model, progress=False)  # for its vocabulary only
    lengths = [int(x) for x in args.prompt_lengths.split(",") if x]
    decode_prompts = [int(x) for x in args.decode_prompts.split(",") if x]
    n_ctx = max(lengths + [p + args.decode_tokens for p in decode_prompts]) + 16
    llm = llama_cpp.Llama(args.model, n_ctx=n_ctx, n_batch=max(lengths + decode_prompts),
                          n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    res = {"engine": "llama.cpp", "llama_cpp_python": llama_cpp.__version__, "model": args.model,
           "threads": args.threads, "date": date.today().isoformat(), "repeats": args.repeats,
           "prefill": [], "decode": []}
    llm.reset()
    llm.eval(prompt_ids(gm, 64))  # warm-up
    for n in lengths:
        ids = prompt_ids(gm, n)
        ts = []
        for _ in range(args.repeats):
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(ids)
            ts.append(time.perf_counter() - t0)
        med = statistics.median(ts)
        res["prefill"].append({"prompt_tokens": n, "tok_s": n / med, "median_s": med, "runs_s": ts})
        print(f"prefill {n:>6} tokens: {n / med:9.1f} tok/s   (median of {args.repeats})")
    for p in decode_prompts:
        ids = prompt_ids(gm, p, seed=1)
        ts = []
        for _ in range(args.repeats):
            llm.reset()
            llm.eval(ids)
            t0 = time.perf_counter()
            for _ in range(args.decode_tokens):
                nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
                llm.eval([nxt])
            ts.append((time.perf_counter() - t0) / args.decode_tokens)
        med = statistics.median(ts)
        res["decode"].append({"prompt_tokens": p, "tokens": args.decode_tokens, "tok_s": 1 / med,
                              "median_s_per_token": med, "runs_s_per_token": ts})
        print(f"decode after {p:>5} tokens: {1 / med:9.1f} tok/s   (median of {args.repeats})")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
