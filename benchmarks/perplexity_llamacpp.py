"""Perplexity from llama.cpp (llama-cpp-python) over the same token ids and the same windows
as `goinfer perplexity` (goinfer.fidelity.windows), for docs/benchmarks.md.

    PYTHONPATH=. /tmp/peers-venv/bin/python benchmarks/perplexity_llamacpp.py MODEL.gguf FILE \
        [--ctx 1024] [--stride 512] [--skip-tokens K] [--max-tokens N] [--threads 2] [--json out.json]

The text is tokenized by goinfer's tokenizer (no BOS, special-token strings as plain text) so
both engines read the same ids (llama.cpp's own tokenization of the text is compared and
reported).  Each window is a fresh context: ``Llama(path, n_ctx=ctx, logits_all=True)``,
``reset()``, ``eval(window)``, ``scores`` -> -log softmax in float64 at the scored targets.
--smoke: the tiny shape (benchmarks/shapes.py), a few hundred tokens (the test suite); without
llama-cpp-python only goinfer's side (tokenization, windows) runs and the peer is skipped.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from datetime import date

import numpy as np

from goinfer.fidelity import _log_softmax_at, windows
from goinfer.gguf import GGUFFile
from goinfer.tokenizer import Tokenizer


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("file", nargs="?")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--stride", type=int, default=None)
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--skip-tokens", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny model, a few windows (the test suite)")
    args = ap.parse_args(argv)
    import tempfile
    from pathlib import Path

    tmp = tempfile.TemporaryDirectory()
    if args.smoke:
        from shapes import smoke_model  # benchmarks/ is on sys.path when run as a script

        args.model = str(smoke_model(tmp.name))
        args.file = str(Path(__file__).resolve().parent / "data" / "agreement_mix.txt")
        args.ctx, args.max_tokens = 128, 300
    if not (args.model and args.file):
        ap.error("MODEL and FILE are needed (or --smoke)")
    text = open(args.file, encoding="utf-8").read()
    tok = Tokenizer.from_metadata(GGUFFile(args.model).metadata)
    ids = np.asarray(tok.encode(text, add_special=False, parse_special=False), np.int32)
    try:
        import llama_cpp
    except ImportError:
        n_win = len(list(windows(len(ids[args.skip_tokens:][:args.max_tokens]), args.ctx,
                                 args.stride or args.ctx // 2)))
        print(f"goinfer side: {len(ids)} tokens, {n_win} windows; llama.cpp: skipped "
              "(llama-cpp-python is not installed)")
        return None
    llm = llama_cpp.Llama(args.model, n_ctx=args.ctx, logits_all=True, n_threads=args.threads,
                          n_threads_batch=args.threads, verbose=False)
    theirs = llm.tokenize(text.encode(), add_bos=False, special=False)
    same_tok = list(theirs) == ids.tolist()
    ids = ids[args.skip_tokens:]
    if args.max_tokens:
        ids = ids[:args.max_tokens]
    stride = args.stride or args.ctx // 2
    total, n, work = 0.0, 0, 0
    t0 = time.perf_counter()
    for b, e, s in windows(len(ids), args.ctx, stride):
        llm.reset()
        llm.eval(ids[b:e].tolist())
        lg = np.asarray(llm.scores[:e - b], dtype=np.float32)  # (e - b, vocab)
        rows = lg[s - 1 - b:e - 1 - b]
        nll = _log_softmax_at(rows, ids[s:e])
        total += float(nll.sum())
        n += len(nll)
        work += e - b
    dt = time.perf_counter() - t0
    res = dict(engine="llama.cpp", llama_cpp_python=llama_cpp.__version__, model=args.model,
               ctx=args.ctx, stride=stride, threads=args.threads, skip_tokens=args.skip_tokens,
               n_tokens=int(len(ids)),
               n_scored=n, nll=total / n, perplexity=math.exp(total / n), seconds=dt,
               tokens_per_second=work / dt, same_tokenization=same_tok,
               date=date.today().isoformat())
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    tmp.cleanup()
    return res


if __name__ == "__main__":
    main()
