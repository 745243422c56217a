"""What tools cost a request: decode tok/s of a free-text reply with and without the tools'
"auto" grammar, the grammar's mask time per token, and the per-request set-up (checks,
template, grammar; compiled grammars are cached).

    PYTHONPATH=. python benchmarks/tools.py                      # SmolLM2-135M
    PYTHONPATH=. python benchmarks/tools.py --model gemma3-270m
    PYTHONPATH=. python benchmarks/tools.py --smoke              # tiny model, seconds

Every request with tools and tool_choice "auto" (OpenAI's default) decodes under the lazy
grammar even when the model answers in plain text, so that is the case measured: the same
prompt (tools in it) and the same number of tokens (stop tokens banned), "plain" without a
grammar and "auto" with it, alternated run by run and reported as medians.  Prints the load
average: numbers taken on a busy machine are not speed claims.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import numpy as np
import regime

from goinfer import chat as T
from goinfer import constrained
from goinfer.constrained import compile_request

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "top_k": {"type": "integer", "minimum": 1},
                },
                "required": ["query"],
            },
        },
    },
]
PROMPT = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]


def tiny_model(d: str):
    """The smoke runs' tiny shape (benchmarks/shapes.py; ChatML template), one thread."""
    from shapes import smoke_model

    from goinfer import Model

    return Model.load(str(smoke_model(d)), threads=1, progress=False)


def decode(model, ids, grammar, n: int) -> dict:
    ban = {t: -np.inf for t in model.tokenizer.stop_ids}
    s = model.session()
    r = s.generate(ids, max_tokens=n, logit_bias=ban, grammar=grammar)
    s.reset()
    return {"tok_s": r.timings.decode_tok_s, "n": r.completion_tokens, "tokens": r.tokens}


def mask_ms(model, grammar: str, tokens: list[int]) -> float:
    """Mean ms to compute one mask and consume one token along a run's tokens, computed when
    needed (no overlap with a forward pass)."""
    constrained.OVERLAP = False
    try:
        c = compile_request(model.tokenizer, grammar=grammar).start(model.vocab_size)
        t0 = time.perf_counter()
        for t in tokens:
            c.mask()
            c.advance(t)
            c.prefetch()
        return (time.perf_counter() - t0) / max(1, len(tokens)) * 1e3
    finally:
        constrained.OVERLAP = True


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5, help="runs per mode (alternated)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny model, few tokens")
    regime.add_json_arg(ap)
    a = ap.parse_args(argv)
    tmp = tempfile.TemporaryDirectory()
    if a.smoke:
        model, a.tokens, a.runs = tiny_model(tmp.name), 16, 2
    else:
        import goinfer

        model = goinfer.Model.load(a.model, threads=a.threads, progress=False)

    hdr = regime.header(model.threads, argv=argv)
    setup = []
    for _ in range(20 if not a.smoke else 3):
        t0 = time.perf_counter()
        tc = T.prepare_chat(model, PROMPT, TOOLS, "auto")
        compile_request(model.tokenizer, grammar=tc.grammar)  # a cache hit after the first
        setup.append((time.perf_counter() - t0) * 1e3)
    ids = model.tokenize_chat(tc.prompt)

    runs = {"plain": [], "auto": []}
    last = {}
    for _ in range(a.runs):
        for mode in runs:
            r = decode(model, ids, tc.grammar if mode == "auto" else None, a.tokens)
            runs[mode].append(r["tok_s"])
            last[mode] = r
    med = {k: statistics.median(v) for k, v in runs.items()}
    out = {
        "benchmark": "tools",
        "regime": hdr,
        "model": regime.model(model.path),
        "format": tc.fmt.name,
        "prompt_tokens": len(ids),
        "tokens_decoded": {k: len(v["tokens"]) for k, v in last.items()},
        "tokens": a.tokens,
        "runs": a.runs,
        "plain_tok_s": med["plain"],
        "auto_tok_s": med["auto"],
        "auto_vs_plain": med["auto"] / med["plain"] if med["plain"] else float("nan"),
        "mask_ms_per_token": mask_ms(model, tc.grammar, last["auto"]["tokens"]),
        "setup_ms_first": setup[0],
        "setup_ms_median": statistics.median(setup[1:] or setup),
        "same_tokens": last["auto"]["tokens"] == last["plain"]["tokens"],
    }
    print(
        f"{model.name} ({out['format']} tool format), prompt {len(ids)} tokens, "
        f"{a.tokens} decoded, {a.runs} runs per mode, load average {hdr['load_avg_start'][0]:.1f}"
    )
    print(f"  decode plain          {med['plain']:8.1f} tok/s")
    print(f"  decode tools 'auto'   {med['auto']:8.1f} tok/s   ({out['auto_vs_plain']:.3f}x)")
    print(f"  grammar mask + advance {out['mask_ms_per_token']:7.3f} ms/token (hidden by overlap)")
    print(
        f"  request set-up        {out['setup_ms_first']:8.1f} ms first, "
        f"{out['setup_ms_median']:.2f} ms after (grammar cached)"
    )
    print(f"  same tokens with and without the grammar: {out['same_tokens']}")
    print(json.dumps({k: v for k, v in out.items() if k != "regime"}))
    del model
    tmp.cleanup()
    return regime.finish(out, a.json)


if __name__ == "__main__":
    main()
