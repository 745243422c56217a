"""Teacher-forced top-1 agreement with transformers (float32, weights dequantized from the same
GGUF): goinfer and llama.cpp (llama-cpp-python) over the same positions.

    python benchmarks/agreement.py MODEL.gguf --text FILE [--text FILE ...] \
        [--window 512] [--positions 2048] [--threads 2] [--json out.json] \
        [--bos] [--reference ORIGINAL.gguf] [--also OTHER.gguf ...] [--kv-dtype f16,f32,q8_0]

Needs goinfer, torch, transformers (+accelerate) and llama-cpp-python in one environment
(`pip install '.[bench,test]'`).  The text is tokenized once with
goinfer; the ids are checked against llama.cpp's tokenizer and fed to all three engines, in
windows of --window tokens (each window starts a fresh context; with --bos each window starts
with the BOS token, as the model's tokenizer would put it).  --reference: transformers and
llama.cpp load this file instead of MODEL (e.g. the original quantized file when MODEL is a
re-encoded copy); --also: more GGUFs run by goinfer on the same windows, reported by file name;
--kv-dtype: goinfer's KV cache storage types, the first as "goinfer", the others as
"goinfer kv=TYPE" (the same weights).
--smoke: the tiny shape (benchmarks/shapes.py), one short window (the test suite); llama.cpp
is skipped (with a message) when llama-cpp-python is not installed.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np
import regime


def cosine_rows(a, b):
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--text", action="append", default=None)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--positions", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--exact", "--exact-prefill", dest="exact", action="store_true")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--bos", action="store_true", help="start every window with BOS")
    ap.add_argument("--reference", default=None, help="GGUF for transformers and llama.cpp")
    ap.add_argument("--also", action="append", default=[], help="another GGUF for goinfer")
    ap.add_argument(
        "--smoke", action="store_true", help="tiny model, one short window (the test suite)"
    )
    ap.add_argument("--kv-dtype", default="f16", help="goinfer KV cache type(s), comma-separated")
    regime.add_json_arg(ap)
    args = ap.parse_args(argv)
    import tempfile

    tmp = tempfile.TemporaryDirectory()
    if args.smoke:
        from shapes import smoke_model

        args.model = str(smoke_model(tmp.name, "Q8_0"))
        args.text = [str(Path(__file__).resolve().parent / "data" / "agreement_mix.txt")]
        args.window, args.positions = 32, 40
    if not args.model or not args.text:
        ap.error("a model and --text are needed (or --smoke)")
    if not args.no_llama_cpp:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print("llama.cpp: skipped (llama-cpp-python is not installed)", flush=True)
            args.no_llama_cpp = True

    import torch
    from transformers import AutoModelForCausalLM

    import goinfer

    path = Path(args.model).resolve()
    ref_path = Path(args.reference).resolve() if args.reference else path
    kvs = [k for k in args.kv_dtype.split(",") if k]
    gm = goinfer.Model.load(
        str(path), threads=args.threads, exact=args.exact, progress=False, kv_dtype=kvs[0]
    )
    engines = {"goinfer": gm}
    for kv in kvs[1:]:
        engines[f"goinfer kv={kv}"] = copy.copy(gm)
        engines[f"goinfer kv={kv}"].kv_dtype = kv
    for extra in args.also:
        engines[f"goinfer:{Path(extra).name}"] = goinfer.Model.load(
            str(Path(extra).resolve()), threads=args.threads, exact=args.exact, progress=False
        )
    text = "\n\n".join(Path(t).read_text() for t in args.text)
    ids = gm.tokenize(text)
    head = [gm.tokenizer.bos_id] if args.bos else []
    body = args.window - len(head)
    need = args.positions + -(-args.positions // (args.window - 1))
    if len(ids) < need:
        sys.exit(f"text has {len(ids)} tokens, need {need} for {args.positions} positions")
    windows = []
    i = 0
    n_pos = 0
    while n_pos < args.positions:
        w = head + ids[i : i + body]
        windows.append(w)
        n_pos += len(w) - 1  # logits at position t predict token t+1
        i += len(w) - len(head)

    llm = None
    if not args.no_llama_cpp:
        from llama_cpp import Llama

        llm = Llama(
            str(ref_path),
            n_ctx=args.window,
            n_batch=args.window,
            logits_all=True,
            n_threads=args.threads,
            verbose=False,
        )
        ll_ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        tok_match = ll_ids[: len(ids)] == ids and len(ll_ids) == len(ids)
    torch.set_num_threads(args.threads)
    hf = AutoModelForCausalLM.from_pretrained(
        str(ref_path.parent), gguf_file=ref_path.name, torch_dtype=torch.float32
    ).eval()

    rows = {k: [] for k in [*engines, "llama.cpp"]}
    cos = {k: [] for k in rows}
    gi_vs_ll = []
    t_gi = t_ll = 0.0
    for w in windows:
        with torch.no_grad():
            ref = hf(torch.tensor([w])).logits[0].float().numpy()[:-1]
        t0 = time.perf_counter()
        ours = gm.logits(w)[:-1]
        t_gi += time.perf_counter() - t0
        for name, model in engines.items():
            lg = ours if model is gm else model.logits(w)[:-1]
            rows[name].append(lg.argmax(1) == ref.argmax(1))
            cos[name].append(cosine_rows(lg, ref))
        if llm is not None:
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(w)
            t_ll += time.perf_counter() - t0
            theirs = np.array(llm.scores[: len(w)], dtype=np.float32)[:-1]
            rows["llama.cpp"].append(theirs.argmax(1) == ref.argmax(1))
            cos["llama.cpp"].append(cosine_rows(theirs, ref))
            gi_vs_ll.append(theirs.argmax(1) == ours.argmax(1))

    res = {
        "benchmark": "agreement",
        "regime": regime.header(args.threads, argv=argv, peer_name="llama.cpp"),
        "model": regime.model(path),
        "reference": ref_path.name,
        "bos": args.bos,
        "window": args.window,
        "positions": int(sum(len(r) for r in rows["goinfer"])),
        "texts": [Path(t).name for t in args.text],
        "kv_dtypes": kvs,
        "goinfer_weights": sorted(
            {
                w.kind + (f" (from {w.source_type})" if w.source_type else "")
                for w in gm.impl.weights()
            }
        ),
    }
    for k in rows:
        if rows[k]:
            r = np.concatenate(rows[k])
            c = np.concatenate(cos[k])
            res[k] = {
                "top1_agreement_with_transformers": float(r.mean()),
                "mean_logit_cosine": float(c.mean()),
                "min_logit_cosine": float(c.min()),
            }
    if gi_vs_ll:
        res["goinfer_vs_llama.cpp_top1"] = float(np.concatenate(gi_vs_ll).mean())
        res["llama.cpp_tokenization_identical"] = bool(tok_match)
        res["seconds"] = {"goinfer": t_gi, "llama.cpp": t_ll}
    print(json.dumps({k: v for k, v in res.items() if k != "regime"}, indent=2))
    tmp.cleanup()
    return regime.finish(res, args.json)


if __name__ == "__main__":
    main()
