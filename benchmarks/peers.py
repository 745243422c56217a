"""goinfer vs llama.cpp (llama-cpp-python) on the same GGUF, same threads, same prompt ids:
prefill and decode tok/s, medians of repeats, ratios, each decode step's weight bytes and the
fraction of the machine's read bandwidth each engine achieves; JSON out.

    python benchmarks/peers.py MODEL.gguf [--threads 2] [--prompt-lengths 512,2048]
        [--decode-prompts 64,2048] [--decode-tokens 32] [--repeats 5] [--flash-attn both]
        [--kv-dtype f16[,q8_0,f32]] [--exact] [--transformers] [--no-llama-cpp | --no-goinfer]
        [--bandwidth GBS | --measure-bandwidth] [--json out.json]
    python benchmarks/peers.py --smoke [--json out.json]

Each engine runs alone in its own process (benchmarks/isolate.py): one process per engine and
repeat, the engines alternating (goinfer, llama.cpp, goinfer, llama.cpp, ...), each loading
the model, warming up on 64 tokens, then timing every row once; the parent only prepares the
prompts and collects the medians.  Every prefill is cold (a fresh KV state; goinfer's rows
record the cached tokens they found, 0); decode is greedy from a random prompt of the given
length.  Prompts are seeded random ids of ordinary tokens (goinfer.bench.prompt_ids, from the
file's vocabulary), identical for every engine.  --kv-dtype: goinfer's KV cache storage
type(s), one goinfer engine each (llama.cpp keeps its default f16 cache); ratios are against
llama.cpp's best engine of the row.  --flash-attn both: llama.cpp with and without flash
attention (two engines).  Without llama-cpp-python only goinfer runs and the output says the
peer was not installed.

Weight bytes per decode step (the "weight_bytes_per_token" of each decode row), from the GGUF's
tensor infos (the file's bytes, the same for both engines): every tensor once, except the token
embedding (one row; the whole table when the output head is tied to it) and the stacked expert
tensors of an MoE (the used share, expert_used_count / expert_count, of their bytes).  The KV
cache a step also reads is counted apart ("kv_bytes_per_token": keys and values in f16, the
default cache of both engines, at the positions each layer attends, its sliding window at
most, averaged over the decode steps; a goinfer engine with another --kv-dtype its own); the
fractions below are of both.  --bandwidth GBS adds, per decode row and engine, bytes x tok/s /
bandwidth: the achieved fraction of it.  --measure-bandwidth measures it instead (limits.py's
streaming read with the same threads) before every engine's run and after the last: a shared
host's bandwidth moved by up to 2x within minutes, so each run's fraction is of the mean of
the two samples around it, and the row's fraction is the median of its runs'.  It also sweeps,
right after each goinfer run, the page-cache pages that run mapped its weights from (its layout
file's, limits.read_bandwidth with pages=): in a virtual machine whose memory is not uniformly
fast the same file's pages read up to 25% slower or faster depending on where they landed when
the file was cached, which a fresh buffer does not show; each goinfer decode row also gives
its fraction of that ("fraction_of_weight_pages").  llama.cpp's weights are partly its own
repacked copies, so its rows have only the fresh buffer's fraction.

MODEL can be any GGUF, e.g. the shapes of real models that benchmarks/shapes.py writes.
--smoke: the tiny shape, one short run of each row, bandwidth on a small buffer (the test suite).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import isolate
import numpy as np
import regime

HERE = Path(__file__).resolve()

# ============================================================================ engines (children)


class GoinferEngine:
    def __init__(self, path: str, threads: int, exact: bool = False, kv_dtype: str = "f16"):
        import goinfer
        from goinfer import bench

        self.bench = bench
        self.model = goinfer.Model.load(
            path, threads=threads, exact=exact, progress=False, kv_dtype=kv_dtype
        )

    def prefill(self, ids) -> tuple[float, int]:
        return self.bench.cold_prefill(self.model, ids)

    def decode(self, ids, n: int) -> float:
        return self.bench.decode_seconds(self.model, ids, n)

    def facts(self) -> dict:
        """Native weight kinds and the GGUF types they came from; where the weights came from;
        the layout file ranges the weights are mapped from (None when they are not: a copy in
        process memory, or no layout cache)."""
        return {
            "load_source": self.model.load_info.source,
            "weight_pages": self.bench.weight_pages(self.model),
            "mapped_pages": self.bench.mapped_pages(self.model),
            "weights": sorted(
                {
                    w.kind + (f" (from {w.source_type})" if w.source_type else "")
                    for w in self.model.impl.weights()
                }
            ),
        }


class LlamaCppEngine:
    def __init__(self, path: str, threads: int, n_ctx: int, flash_attn: bool):
        from llama_cpp import Llama

        self.llm = Llama(
            path,
            n_ctx=n_ctx,
            n_batch=min(n_ctx, 2048),
            n_ubatch=512,
            n_threads=threads,
            n_threads_batch=threads,
            flash_attn=flash_attn,
            verbose=False,
        )

    def prefill(self, ids) -> tuple[float, int]:
        self.llm.reset()  # eval() drops cached positions >= n_tokens: a cold prefill
        t0 = time.perf_counter()
        self.llm.eval(ids)
        return time.perf_counter() - t0, 0

    def decode(self, ids, n: int) -> float:
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

    def facts(self) -> dict:
        return {"system_info": regime.system_info()}


class TransformersEngine:
    def __init__(self, path: str, threads: int):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch = torch
        p = Path(path)
        self.model = AutoModelForCausalLM.from_pretrained(
            str(p.parent), gguf_file=p.name, dtype=torch.float32
        ).eval()

    def prefill(self, ids) -> tuple[float, int]:
        with self.torch.no_grad():
            t0 = time.perf_counter()
            self.model(self.torch.tensor([ids]), use_cache=True)
            return time.perf_counter() - t0, 0

    def facts(self) -> dict:
        import transformers

        return {"version": transformers.__version__}


def child() -> None:
    """One engine, every row once: {"prefill": [(seconds, cached)], "decode": [s/token], facts}."""
    spec = isolate.child_spec()
    kind, o = spec["engine"], spec["options"]
    t0 = time.perf_counter()
    if kind == "goinfer":
        e = GoinferEngine(spec["model"], spec["threads"], o["exact"], o["kv_dtype"])
    elif kind == "llama.cpp":
        e = LlamaCppEngine(spec["model"], spec["threads"], spec["n_ctx"], o["flash_attn"])
    else:
        e = TransformersEngine(spec["model"], spec["threads"])
    load_s = time.perf_counter() - t0
    e.prefill(spec["warmup"])
    out = {
        "load_s": load_s,
        "prefill": [e.prefill(ids) for ids in spec["prefill"]],
        "decode": (
            [e.decode(ids, spec["decode_tokens"]) for ids in spec["decode"]]
            if kind != "transformers"
            else []
        ),
        **e.facts(),
    }
    isolate.child_reply(out)


# ============================================================================ the parent


def decode_weight_bytes(path: str) -> int:
    """Bytes of the file's tensors one decode step reads (the rule in the module docstring)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from goinfer.gguf import GGUFFile

    with GGUFFile(path) as g:
        names = list(g.tensor_names)
        n_exp, n_used = g.arch_get("expert_count"), g.arch_get("expert_used_count")
        total = 0.0
        for name in names:
            tname, shape = g.tensor_info(name)
            bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType[tname]]
            nbytes = int(np.prod(shape, dtype=np.int64)) * ts // bs
            if name.endswith("token_embd.weight"):
                tied = name == "token_embd.weight" and "output.weight" not in names
                total += nbytes if tied else nbytes / shape[0]
            elif "_exps." in name and n_exp:
                total += nbytes * (n_used or n_exp) / n_exp
            else:
                total += nbytes
    return int(total)


KV_ELEM_BYTES = {"f16": 2, "f32": 4, "q8_0": 34 / 32}  # per element, block scales included


def decode_kv_bytes(path: str, prompt: int, tokens: int, elem_bytes: int = 2) -> int:
    """Bytes of KV cache one decode step reads, averaged over ``tokens`` steps after a prompt
    of ``prompt`` tokens: every KV layer's keys and values (``elem_bytes`` per element: 2 for
    the f16 caches both engines keep by default) at the positions it attends, its sliding
    window at most.  A recurrent layer's state is not counted."""
    from goinfer.gguf import GGUFFile
    from goinfer.models.registry import read_config

    with GGUFFile(path) as g:
        _, cfg = read_config(g)
    per_pos = [
        (2 * h * d * elem_bytes, w) for (h, d), w in zip(cfg.kv_geometry(), cfg.kv_windows())
    ]
    total = 0
    for t in range(tokens):
        n = prompt + t + 1  # positions the step's query attends (itself included)
        total += sum(b * (min(n, w) if w else n) for b, w in per_pos)
    return total // max(tokens, 1)


def engines_of(args, have_llama: bool) -> list[dict]:
    """[{"label", "engine", "options"}] in the order they alternate."""
    kvs = [k for k in args.kv_dtype.split(",") if k]
    out = []
    if not args.no_goinfer:
        for k in kvs:
            out.append(
                {
                    "label": "goinfer" + (f" {k}" if len(kvs) > 1 else ""),
                    "engine": "goinfer",
                    "options": {"exact": False, "kv_dtype": k},
                }
            )
        if args.exact:
            out.append(
                {
                    "label": "goinfer" + (f" {kvs[0]}" if len(kvs) > 1 else "") + " (exact)",
                    "engine": "goinfer",
                    "options": {"exact": True, "kv_dtype": kvs[0]},
                }
            )
    if have_llama:
        for fa in {"on": [True], "off": [False], "both": [False, True]}[args.flash_attn]:
            out.append(
                {
                    "label": "llama.cpp" + (" flash-attn" if fa else ""),
                    "engine": "llama.cpp",
                    "options": {"flash_attn": fa},
                }
            )
    if args.transformers:
        out.append({"label": "transformers float32", "engine": "transformers", "options": {}})
    return out


def _ratios(tok_s: dict) -> tuple[str | None, dict]:
    """(llama.cpp's best engine of the row, {goinfer engine: its tok/s over that one's})"""
    peers = {k: v for k, v in tok_s.items() if k.startswith("llama.cpp")}
    if not peers:
        return None, {}
    best = max(peers, key=peers.get)
    return best, {k: v / peers[best] for k, v in tok_s.items() if k.startswith("goinfer")}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-lengths", default="512,2048")
    ap.add_argument("--decode-prompts", default="64,2048")
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--flash-attn", choices=["on", "off", "both"], default="both")
    ap.add_argument(
        "--exact",
        "--exact-prefill",
        dest="exact",
        action="store_true",
        help="also run goinfer with exact=True (float64 attention everywhere)",
    )
    ap.add_argument("--kv-dtype", default="f16", help="goinfer KV cache type(s), comma-separated")
    ap.add_argument("--transformers", action="store_true", help="also time transformers prefill")
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--no-goinfer", action="store_true", help="llama.cpp only")
    ap.add_argument(
        "--bandwidth",
        type=float,
        default=None,
        help="the machine's read bandwidth in GB/s (limits.py) for the decode fractions",
    )
    ap.add_argument(
        "--measure-bandwidth",
        action="store_true",
        help="measure it (limits.py's streaming read, the same threads) before every engine's "
        "run and after the last; each run's fraction is of the two samples around it",
    )
    ap.add_argument(
        "--smoke", action="store_true", help="tiny model, one short run (the test suite)"
    )
    regime.add_json_arg(ap)
    args = ap.parse_args(argv)
    from goinfer import bench
    from goinfer.gguf import GGUFFile
    from goinfer.tokenizer import Tokenizer

    tmp = tempfile.TemporaryDirectory()
    bw_bytes = None
    if args.smoke:
        from shapes import smoke_model

        args.model = str(smoke_model(tmp.name))
        args.prompt_lengths, args.decode_prompts = "64", "16"
        args.decode_tokens, args.repeats, args.flash_attn = 2, 1, "off"
        args.measure_bandwidth, bw_bytes = True, 16 << 20
    if not args.model:
        ap.error("a model path is needed (or --smoke)")
    peer = regime.peer("llama.cpp")
    have_llama = peer["installed"] and not args.no_llama_cpp
    if args.no_llama_cpp:
        print("llama.cpp: skipped (--no-llama-cpp)", flush=True)
    elif not peer["installed"]:
        print("llama.cpp: skipped (llama-cpp-python is not installed)", flush=True)

    lengths = [int(x) for x in args.prompt_lengths.split(",") if x]
    dprompts = [int(x) for x in args.decode_prompts.split(",") if x]
    need = max(lengths + [p + args.decode_tokens for p in dprompts])  # tokens the longest row holds
    with GGUFFile(args.model) as g:  # the training context every engine reads, before any load
        ctx = g.arch_get("context_length")
        tok = Tokenizer.from_metadata(g.metadata)
    if ctx is not None and need > ctx:
        ap.error(
            f"the rows need {need} tokens of context (longest prompt, or decode prompt "
            f"+ --decode-tokens); {Path(args.model).name} has {ctx}"
        )
    engines = engines_of(args, have_llama)
    if not engines:
        ap.error("no engine left to run (--no-goinfer without llama-cpp-python)")

    vocab = SimpleNamespace(tokenizer=tok, vocab_size=tok.vocab_size)
    spec = {
        "model": str(Path(args.model).resolve()),
        "threads": args.threads,
        "n_ctx": need + 64,
        "decode_tokens": args.decode_tokens,
        "warmup": bench.prompt_ids(vocab, 64, seed=7),
        "prefill": [bench.prompt_ids(vocab, n, seed=n) for n in lengths],
        "decode": [bench.prompt_ids(vocab, p, seed=10_000 + p) for p in dprompts],
    }
    res = {
        "benchmark": "peers",
        "regime": regime.header(args.threads, argv=argv, peer_name="llama.cpp"),
        "model": regime.model(args.model),
        "settings": {
            "repeats": args.repeats,
            "prompt_lengths": lengths,
            "decode_prompts": dprompts,
            "decode_tokens": args.decode_tokens,
            "flash_attn": args.flash_attn,
            "kv_dtypes": [k for k in args.kv_dtype.split(",") if k],
            "engines": [e["label"] for e in engines],
            "one_process_per_engine": True,
        },
        "prefill": [],
        "decode": [],
    }
    # the bandwidth, when measured: before every engine's run and after the last (the host's
    # load shifts during a run); run j lies between samples j and j + 1
    bw_samples = []
    pages_GBs = {}  # a goinfer engine's: the bandwidth of its run's weight pages, after each run

    def sample_bandwidth():
        from limits import read_bandwidth

        bw_samples.append(read_bandwidth(args.threads, bw_bytes, 1 if args.smoke else 11))
        print(f"read bandwidth: {bw_samples[-1]['GBs']:.1f} GB/s", flush=True)

    def sample_pages(label: str, run: dict):
        """The read bandwidth of the page-cache pages the run's weights were mapped from (the
        same physical memory while the file stays cached), swept with the same threads."""
        from limits import read_bandwidth

        where = run.get("mapped_pages")
        if where is None:  # copied into the process's own memory, gone with it
            pages_GBs.setdefault(label, []).append(None)
            return
        r = read_bandwidth(args.threads, reps=1 if args.smoke else 11, pages=tuple(where))
        pages_GBs.setdefault(label, []).append(r["GBs"])
        print(f"{label}: its weight pages read at {r['GBs']:.1f} GB/s", flush=True)

    if args.bandwidth:
        res["bandwidth"] = {"GBs": args.bandwidth, "source": "given (--bandwidth)"}
    measure = args.measure_bandwidth and not args.bandwidth

    # the engines alternate, each alone in its own process: goinfer, llama.cpp, goinfer, ...
    runs = {e["label"]: [] for e in engines}
    before = {e["label"]: [] for e in engines}  # the sample just before each run, by index
    for _ in range(args.repeats):
        for e in engines:
            if measure:
                sample_bandwidth()
                before[e["label"]].append(len(bw_samples) - 1)  # and after it: the next one
            runs[e["label"]].append(isolate.run_child(HERE, {**spec, **e}))
            if measure and e["engine"] == "goinfer":
                sample_pages(e["label"], runs[e["label"]][-1])
    if measure:
        sample_bandwidth()
        gbs = [b["GBs"] for b in bw_samples]
        res["bandwidth"] = {
            **{
                k: bw_samples[0][k]
                for k in ("processes", "buffer_bytes_per_process", "reps", "sync")
            },
            "GBs": statistics.median(gbs),
            "samples_GBs": gbs,
            "runs_GBs": {k: [(gbs[j] + gbs[j + 1]) / 2 for j in v] for k, v in before.items()},
            "per_run": True,
            "source": "measured (limits.read_bandwidth) before every engine's run and after the "
            "last; each run's fraction is of the mean of the two samples around it, a row's "
            "the median of its runs'; GBs: the median sample",
            "weight_pages_GBs": pages_GBs,
            "weight_pages_source": "a goinfer engine's: limits.read_bandwidth over the layout "
            "file's pages its run mapped its weights from, right after the run (None: the "
            "weights were a copy in the process's memory)",
        }
        print(
            f"read bandwidth: {res['bandwidth']['GBs']:.1f} GB/s, the median of "
            f"{len(bw_samples)} samples ({min(gbs):.1f}-{max(gbs):.1f})",
            flush=True,
        )
    res["processes"] = {
        "parent": os.getpid(),
        **{k: [r["pid"] for r in v] for k, v in runs.items()},
    }
    first = {k: v[0] for k, v in runs.items()}
    g = next((first[e["label"]] for e in engines if e["engine"] == "goinfer"), None)
    res["goinfer_load"] = g["load_source"] if g else "not run"
    res["goinfer_weights"] = g["weights"] if g else ["not run"]
    # each process maps (or copies) the weights itself: how each run's were backed
    res["goinfer_pages"] = [
        r.get("weight_pages") for e in engines if e["engine"] == "goinfer" for r in runs[e["label"]]
    ]
    ll = next((first[e["label"]] for e in engines if e["engine"] == "llama.cpp"), None)
    if ll is not None:
        res["regime"]["peer"]["system_info"] = ll["system_info"]
    res["load_s"] = {k: [r["load_s"] for r in v] for k, v in runs.items()}

    for i, n in enumerate(lengths):
        secs = {k: [r["prefill"][i][0] for r in v] for k, v in runs.items()}
        tok_s = {k: n / statistics.median(v) for k, v in secs.items()}
        best, ratio = _ratios(tok_s)
        res["prefill"].append(
            {
                "prompt_tokens": n,
                "tok_s": tok_s,
                "runs_s": secs,
                "best_peer": best,
                "ratio": ratio,
                "cached_tokens": {k: [r["prefill"][i][1] for r in v] for k, v in runs.items()},
            }
        )
    wbytes = decode_weight_bytes(args.model) if dprompts else None
    res["weight_bytes_per_token"] = wbytes
    for i, p in enumerate(dprompts):
        secs = {k: [r["decode"][i] for r in v] for k, v in runs.items() if v[0]["decode"]}
        tok_s = {k: 1.0 / statistics.median(v) for k, v in secs.items()}
        best, ratio = _ratios(tok_s)
        kv = decode_kv_bytes(args.model, p, args.decode_tokens)
        kv_of = {  # an engine's own KV bytes (a goinfer engine may keep another dtype)
            e["label"]: kv * KV_ELEM_BYTES[e["options"].get("kv_dtype", "f16")] / 2 for e in engines
        }
        row = {
            "prompt_tokens": p,
            "tokens": args.decode_tokens,
            "tok_s": tok_s,
            "runs_s_per_token": secs,
            "best_peer": best,
            "ratio": ratio,
            "weight_bytes_per_token": wbytes,
            "kv_bytes_per_token": kv,
            "weight_GBs": {k: wbytes * v / 1e9 for k, v in tok_s.items()},
            "kv_bytes_per_token_by_engine": {k: int(kv_of[k]) for k in tok_s},
            "GBs": {k: (wbytes + kv_of[k]) * v / 1e9 for k, v in tok_s.items()},
        }
        if "bandwidth" in res:
            bw = res["bandwidth"]
            row["runs_fraction_of_bandwidth"] = {  # each run's bytes/s over its bandwidth
                k: [
                    (wbytes + kv_of[k]) / s / 1e9 / (bw["runs_GBs"][k][j] if measure else bw["GBs"])
                    for j, s in enumerate(v)
                ]
                for k, v in secs.items()
            }
            row["fraction_of_bandwidth"] = {
                k: statistics.median(v) for k, v in row["runs_fraction_of_bandwidth"].items()
            }
            # a goinfer engine's bytes/s over its own weight pages' bandwidth, run by run
            of_pages = {
                k: [(wbytes + kv_of[k]) / s / 1e9 / p for s, p in zip(secs[k], v) if p]
                for k, v in bw.get("weight_pages_GBs", {}).items()
                if k in secs
            }
            if any(of_pages.values()):
                row["runs_fraction_of_weight_pages"] = of_pages
                row["fraction_of_weight_pages"] = {
                    k: statistics.median(v) for k, v in of_pages.items() if v
                }
        res["decode"].append(row)
    print(table(res))
    tmp.cleanup()
    return regime.finish(res, args.json)


def table(res) -> str:
    """One line per row: every engine's tok/s, each goinfer engine's ratio to llama.cpp's best
    engine of the row, and the decode rows' weight GB/s (and fraction of the bandwidth)."""
    r0 = res["regime"]
    peer = r0["peer"]
    lines = [
        f"{res['model']['file']} ({res['model']['quantization']}), {r0['threads']} threads, "
        f"{r0['machine']['model_name']}, goinfer {r0['goinfer']['kernel_variant']}"
        f"{' + AMX' if r0['goinfer']['amx'] else ''}"
        f"{' + AVX-VNNI' if r0['goinfer'].get('avxvnni') else ''}, {r0['date']}, medians of "
        f"{res['settings']['repeats']} alternating runs, each engine in its own process; "
        f"llama-cpp-python {peer['version'] if peer['installed'] else 'not installed'}; "
        f"goinfer weights: {', '.join(res['goinfer_weights'])}"
    ]
    for kind, key, fmt in (("prefill", "prefill", ".0f"), ("decode after", "decode", ".1f")):
        for r in res[key]:
            parts = [f"{k} {v:{fmt}}" for k, v in r["tok_s"].items()]
            parts += [f"{k} x{v:.2f} of llama.cpp's best" for k, v in r["ratio"].items()]
            if "fraction_of_bandwidth" in r:
                of = "~" if res["bandwidth"].get("per_run") else ""  # each run its own
                parts += [
                    f"{k} {100 * v:.0f}% of {of}{res['bandwidth']['GBs']:.1f} GB/s"
                    for k, v in r["fraction_of_bandwidth"].items()
                ]
                parts += [
                    f"{k} {100 * v:.0f}% of its weight pages' bandwidth"
                    for k, v in r.get("fraction_of_weight_pages", {}).items()
                ]
            lines.append(f"{kind} {r['prompt_tokens']:>5}: " + ", ".join(parts) + " tok/s")
    for r in res["decode"]:
        lines.append(
            f"decode after {r['prompt_tokens']} reads {r['weight_bytes_per_token'] / 1e6:.1f} MB "
            f"of weights and {r['kv_bytes_per_token'] / 1e6:.1f} MB of f16 KV per token"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child()
    else:
        main()
