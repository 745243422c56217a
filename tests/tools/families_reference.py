"""Reference distances of the newer families: goinfer and llama.cpp, each against transformers
float32, on the same tiny random-weight models (tests/fixtures/hfconvert.py: llama.cpp's own
converter writes the GGUF both engines read) and the same ids.  It lives with the test fixtures
it is built on (fixtures.hfconvert, fixtures.compare); tests/test_benchmarks.py runs its --smoke.

Per family and engine: max |logit difference| over every position of ids of lengths 1, 7, 70
and 300, and the share of positions whose top-1 token agrees; also goinfer vs llama.cpp.

    PYTHONPATH=. python tests/tools/families_reference.py     # with llama-cpp-python installed
    PYTHONPATH=. python tests/tools/families_reference.py --smoke      # no llama.cpp needed
    ... families_reference.py --family gemma4                          # one family's rows

It needs torch and transformers (the test extra) and, for the llama.cpp columns,
llama-cpp-python (the bench extra); without llama_cpp those columns are left empty.  Both engines keep K/V in float32 here.  Prints a markdown table (docs/design/families.md
holds the measured one) and, with --json, writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

TESTS = str(Path(__file__).resolve().parent.parent)  # tests/: the fixtures package
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)

# (label, hfconvert family, build options)
FAMILIES = [
    ("SmolLM3", "smollm3", {}),
    ("Qwen3.5 dense", "qwen35", {}),
    ("Qwen3.5 MoE", "qwen35moe", {}),
    ("gpt-oss, F32 experts", "gpt-oss", dict(mxfp4=False)),  # with attention sinks
    ("gpt-oss, MXFP4 experts", "gpt-oss", {}),
    # goinfer with llama.cpp's truncated YaRN range: what is left between the two engines
    (
        "gpt-oss, F32 experts, goinfer YaRN truncated",
        "gpt-oss",
        dict(mxfp4=False, truncate_yarn=True),
    ),
    ("Gemma 4 dense (PLE, shared KV, k=v)", "gemma4", {}),
    ("Gemma 4 MoE", "gemma4", dict(gemma4_moe=True)),  # hfconvert.GEMMA4_MOE
]
LENGTHS = (1, 7, 70, 300)


def llama_cpp_logits(path, ids, threads: int):
    from llama_cpp import Llama

    # float32 K/V (type 0): llama.cpp's default f16 cache alone moves tiny models' logits by
    # ~2e-2, which would hide the model differences this compares
    llm = Llama(
        model_path=str(path),
        logits_all=True,
        n_ctx=max(64, len(ids) + 16),
        n_batch=512,
        n_ubatch=512,
        n_threads=threads,
        verbose=False,
        type_k=0,
        type_v=0,
    )
    llm.eval(list(ids))
    out = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.close()
    return out


def distance(a, b):
    return float(np.abs(a - b).max()), float((a.argmax(-1) == b.argmax(-1)).mean())


def measure(label, family, opts, lengths, threads, use_llama):
    from fixtures import hfconvert
    from fixtures.compare import hf_logits, load

    opts = dict(opts)
    truncate_yarn = opts.pop("truncate_yarn", False)
    if opts.pop("gemma4_moe", False):
        opts.update(hfconvert.GEMMA4_MOE)
    hf, path = hfconvert.build(family, **opts)
    m = load(path, threads=threads)
    if truncate_yarn:
        m.impl.rope.yarn = replace(m.impl.rope.yarn, truncate=True)
    rows = dict(
        label=label,
        family=family,
        gguf=str(path),
        lengths=list(lengths),
        logit_scale=0.0,
        goinfer=[0.0, 1.0],
        llama_cpp=None,
        goinfer_vs_llama_cpp=None,
    )
    worst_g, agree_g, worst_l, agree_l, worst_gl, agree_gl, n = 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0
    for T in lengths:
        ids = np.random.default_rng(1000 + T).integers(0, m.vocab_size, T).tolist()
        ref = hf_logits(hf, ids)
        ours = m.logits(ids)
        rows["logit_scale"] = max(rows["logit_scale"], float(np.abs(ref).max()))
        d, a = distance(ours, ref)
        worst_g, agree_g = max(worst_g, d), agree_g + a * T
        if use_llama:
            lc = llama_cpp_logits(path, ids, threads)
            d, a = distance(lc, ref)
            worst_l, agree_l = max(worst_l, d), agree_l + a * T
            d, a = distance(ours, lc)
            worst_gl, agree_gl = max(worst_gl, d), agree_gl + a * T
        n += T
    rows["goinfer"] = [worst_g, agree_g / n]
    if use_llama:
        rows["llama_cpp"] = [worst_l, agree_l / n]
        rows["goinfer_vs_llama_cpp"] = [worst_gl, agree_gl / n]
    return rows


def table(results) -> str:
    def cell(v):
        return "-" if v is None else f"{v[0]:.1e} / {100 * v[1]:.1f}%"

    lines = [
        "| model | goinfer vs transformers | llama.cpp vs transformers | goinfer vs llama.cpp | logit scale |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['label']} | {cell(r['goinfer'])} | {cell(r['llama_cpp'])} | "
            f"{cell(r['goinfer_vs_llama_cpp'])} | {r['logit_scale']:.1f} |"
        )
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--smoke", action="store_true", help="one family, short ids (the test suite's run)"
    )
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp even if installed")
    ap.add_argument("--family", help="only the rows of this hfconvert family (e.g. gemma4)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args(argv)
    use_llama = not args.no_llama
    if use_llama:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print("llama_cpp not importable: llama.cpp columns skipped", file=sys.stderr)
            use_llama = False
    fams = FAMILIES[1:2] if args.smoke else FAMILIES
    if args.family:
        fams = [f for f in fams if f[1] == args.family]
    lengths = (1, 7) if args.smoke else LENGTHS
    t0 = time.perf_counter()
    results = [measure(*f, lengths, args.threads, use_llama) for f in fams]
    print(
        f"max |logit diff| / top-1 agreement over every position of ids of lengths "
        f"{', '.join(map(str, lengths))} ({time.perf_counter() - t0:.0f} s)\n"
    )
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
