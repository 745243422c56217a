"""Constrained decode speed: tok/s with and without a JSON schema, same prompt, same length.

    PYTHONPATH=. python benchmarks/constrained.py                       # SmolLM2-135M
    PYTHONPATH=. python benchmarks/constrained.py --model gemma3-270m
    PYTHONPATH=. python benchmarks/constrained.py --smoke               # tiny model, seconds

Three modes, alternated run by run (plain, schema, schema-sync, plain, ...) and reported as
medians, so a change of machine load hits all alike:

- plain:        no constraint;
- schema:       a JSON schema (response_format), the next mask computed in a worker thread
                while the forward pass runs (goinfer's default);
- schema-sync:  the same schema with the mask computed when it is needed (no overlap).

Every run decodes exactly --tokens tokens (stop tokens are banned by logit_bias in all modes,
the schema asks for a long array), so tok/s compare like for like.  Also printed: the mask
computation alone (ms per token, replaying the schema run's tokens through a fresh matcher),
which is what the overlap hides.  Prints the load average: numbers taken on a busy machine
are not speed claims.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import numpy as np
import regime

from goinfer import constrained
from goinfer.constrained import compile_request

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["people"],
    "properties": {
        "people": {
            "type": "array",
            "minItems": 200,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["name", "age", "city"],
                "properties": {
                    "name": {"type": "string", "maxLength": 24},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "city": {"type": "string", "maxLength": 24},
                },
            },
        }
    },
}
PROMPT = [{"role": "user", "content": "List people with their name, age and city as JSON."}]


def tiny_model(d: str):
    """The smoke runs' tiny shape (benchmarks/shapes.py; ChatML template), one thread."""
    from shapes import smoke_model

    from goinfer import Model

    return Model.load(str(smoke_model(d)), threads=1, progress=False)


def run(model, mode: str, n: int) -> dict:
    tok = model.tokenizer
    rf = {"type": "json_schema", "json_schema": {"name": "people", "schema": SCHEMA}}
    constrained.OVERLAP = mode != "schema-sync"
    ban = {t: -np.inf for t in tok.stop_ids}
    s = model.session()
    kw = dict(max_tokens=n, logit_bias=ban)
    if mode != "plain":
        kw["response_format"] = rf
    if model.chat_template:
        r = s.chat(PROMPT, **kw)
    else:
        r = s.generate("List people as JSON:", **kw)
    s.reset()
    constrained.OVERLAP = True
    return {
        "tok_s": r.timings.decode_tok_s,
        "n": r.completion_tokens,
        "tokens": r.tokens,
        "finish": r.finish_reason,
    }


def mask_ms(model, tokens: list[int]) -> float:
    """Mean ms to compute one mask (and unpack it) along the schema run's tokens."""
    g = compile_request(
        model.tokenizer,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "people", "schema": SCHEMA},
        },
    )
    c = g.start(model.vocab_size)
    c.close()
    t = []
    for tid in tokens:
        t0 = time.perf_counter()
        c._compute()
        t.append(time.perf_counter() - t0)
        c.matcher.consume_token(int(tid))
    return 1e3 * statistics.mean(t) if t else 0.0


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny model, 1 rep, 16 tokens")
    regime.add_json_arg(ap)
    a = ap.parse_args(argv)
    tmp = tempfile.TemporaryDirectory()
    if a.smoke:
        model, a.tokens, a.reps = tiny_model(tmp.name), 16, 1
    else:
        from goinfer import Model

        model = Model.load(a.model, threads=a.threads, progress=False)
    modes = ["plain", "schema", "schema-sync"]
    run(model, "schema", 4)  # warm up: tokenizer view, grammar compiled and cached
    runs = {m: [] for m in modes}
    last = {}
    for _ in range(a.reps):
        for m in modes:
            r = run(model, m, a.tokens)
            if r["n"] != a.tokens:
                raise SystemExit(f"{m}: decoded {r['n']} tokens, not {a.tokens} ({r['finish']})")
            runs[m].append(r["tok_s"])
            last[m] = r
    med = {m: statistics.median(v) for m, v in runs.items()}
    ms = mask_ms(model, last["schema"]["tokens"])
    res = {
        "benchmark": "constrained",
        "regime": regime.header(model.threads, argv=argv),
        "model": regime.model(model.path),
        "tokens": a.tokens,
        "reps": a.reps,
        "tok_s": runs,
        "median_tok_s": med,
        "mask_ms_per_token": ms,
        "tokens_decoded": {m: r["n"] for m, r in last.items()},
        "schema_output_start": model.detokenize(last["schema"]["tokens"])[:80],
    }
    load = res["regime"]["load_avg_start"][0]
    print(
        f"{model.name}: {a.tokens} decode tokens, {a.reps} alternating reps, threads "
        f"{model.threads}, load average {load:.1f}"
    )
    print(f"{'mode':<14}{'decode tok/s (median)':>24}{'vs plain':>12}")
    for m in modes:
        print(f"{m:<14}{med[m]:>24.1f}{100.0 * (med[m] / med['plain'] - 1):>+11.1f}%")
    print(f"mask alone: {ms:.3f} ms/token (hidden by the overlap in 'schema')")
    print("schema output starts:", json.dumps(res["schema_output_start"]))
    del model
    tmp.cleanup()
    return regime.finish(res, a.json)


if __name__ == "__main__":
    main()
