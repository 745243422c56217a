"""Perplexity from llama.cpp (llama-cpp-python) over the same token ids and the same windows
as `goinfer perplexity` (goinfer.fidelity.windows), for docs/benchmarks.md.

    python benchmarks/perplexity_llamacpp.py MODEL.gguf FILE \
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

import numpy as np
import regime

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
    ap.add_argument(
        "--smoke", action="store_true", help="tiny model, a few windows (the test suite)"
    )
    regime.add_json_arg(ap)
    args = ap.parse_args(argv)
    import tempfile
    from pathlib import Path

    tmp = tempfile.TemporaryDirectory()
    if args.smoke:
        from shapes import smoke_model

        args.model = str(smoke_model(tmp.name))
        args.file = str(Path(__file__).resolve().parent / "data" / "agreement_mix.txt")
        args.ctx, args.max_tokens = 128, 300
    if not (args.model and args.file):
        ap.error("MODEL and FILE are needed (or --smoke)")
    text = open(args.file, encoding="utf-8").read()
    tok = Tokenizer.from_metadata(GGUFFile(args.model).metadata)
    ids = np.asarray(tok.encode(text, add_special=False, parse_special=False), np.int32)
    stride = args.stride or args.ctx // 2
    res = {
        "benchmark": "perplexity_llamacpp",
        "regime": regime.header(args.threads, argv=argv, peer_name="llama.cpp"),
        "model": regime.model(args.model),
        "text": Path(args.file).name,
        "ctx": args.ctx,
        "stride": stride,
        "skip_tokens": args.skip_tokens,
        "text_tokens": int(len(ids)),
        "windows": len(
            list(windows(len(ids[args.skip_tokens :][: args.max_tokens]), args.ctx, stride))
        ),
    }
    if not res["regime"]["peer"]["installed"]:
        print(
            f"goinfer side: {len(ids)} tokens, {res['windows']} windows; llama.cpp: skipped "
            "(llama-cpp-python is not installed)"
        )
        tmp.cleanup()
        return regime.finish(res, args.json)
    import llama_cpp

    llm = llama_cpp.Llama(
        args.model,
        n_ctx=args.ctx,
        logits_all=True,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        verbose=False,
    )
    theirs = llm.tokenize(text.encode(), add_bos=False, special=False)
    same_tok = list(theirs) == ids.tolist()
    ids = ids[args.skip_tokens :]
    if args.max_tokens:
        ids = ids[: args.max_tokens]
    total, n, work = 0.0, 0, 0
    t0 = time.perf_counter()
    for b, e, s in windows(len(ids), args.ctx, stride):
        llm.reset()
        llm.eval(ids[b:e].tolist())
        lg = np.asarray(llm.scores[: e - b], dtype=np.float32)  # (e - b, vocab)
        rows = lg[s - 1 - b : e - 1 - b]
        nll = _log_softmax_at(rows, ids[s:e])
        total += float(nll.sum())
        n += len(nll)
        work += e - b
    dt = time.perf_counter() - t0
    res["regime"]["peer"]["system_info"] = regime.system_info()
    res.update(
        engine="llama.cpp",
        n_tokens=int(len(ids)),
        n_scored=n,
        nll=total / n,
        perplexity=math.exp(total / n),
        seconds=dt,
        tokens_per_second=work / dt,
        same_tokenization=same_tok,
    )
    print(json.dumps({k: v for k, v in res.items() if k != "regime"}, indent=1))
    tmp.cleanup()
    return regime.finish(res, args.json)


if __name__ == "__main__":
    main()
