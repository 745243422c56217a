"""Tool calls as an agent framework sends them: the official openai client against a goinfer
server, OpenAI's defaults (parallel_tool_calls unset = true, temperature unset = 1), tool_choice
"required" and "auto", greedy and sampled over seeds.  Counts how replies end and whether every
call's arguments validate against its tool's schema.  Not a speed benchmark.

    PYTHONPATH=. python benchmarks/tool_defaults.py                     # SmolLM2 and Gemma 3
    PYTHONPATH=. python benchmarks/tool_defaults.py --models smollm2-135m --seeds 10
    PYTHONPATH=. python benchmarks/tool_defaults.py --smoke             # tiny model, seconds
    PYTHONPATH=. python benchmarks/tool_defaults.py --without fold bounds  # as before them

A reply is "ok" when it ends by itself with finish_reason "tool_calls" and valid calls
("required"), or with "tool_calls" and valid calls or "stop" and content ("auto").  A reply that
reaches max_tokens is "length".
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import threading
import time

import regime

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
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer", "minimum": 0}, "b": {"type": "number"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
QUESTIONS = [
    "What is the weather in Paris? Use the tools.",
    "What is 2 plus 3? Use the tools.",
    "Is it colder in Oslo or in Rome right now?",
]


def tiny_model(d: str):
    """The smoke runs' tiny shape (benchmarks/shapes.py; ChatML template), one thread."""
    from shapes import smoke_model

    import goinfer

    return goinfer.Model.load(str(smoke_model(d)), threads=1, progress=False)


class Serve:
    """A goinfer server on a random loopback port, in a thread."""

    def __init__(self, model):
        import uvicorn

        from goinfer import KVCache
        from goinfer.server.app import create_app

        self.app = create_app(model, KVCache(model, max_tokens=4096), model_id="m")
        self.uv = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning")
        )
        self.thread = threading.Thread(target=self.uv.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        while not self.uv.started:
            time.sleep(0.01)
        port = self.uv.servers[0].sockets[0].getsockname()[1]
        import openai

        return openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600
        )

    def __exit__(self, *exc):
        self.uv.should_exit = True
        self.thread.join(30)


def verdict(choice, ch) -> str:
    import jsonschema

    if ch.finish_reason == "length":
        return "length"
    calls = ch.message.tool_calls or []
    for c in calls:
        try:
            jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
        except (ValueError, jsonschema.ValidationError):
            return "invalid"
    if ch.finish_reason == "tool_calls" and calls:
        return "ok"
    if choice == "auto" and ch.finish_reason == "stop" and not calls and ch.message.content:
        return "ok"
    return f"bad:{ch.finish_reason}"


def run(
    client, seeds: list[int | None], max_tokens: int, show: bool, choices=("required", "auto")
) -> dict:
    out = {}
    for choice in choices:
        tally, n_calls, dups = collections.Counter(), collections.Counter(), 0
        for q in QUESTIONS:
            for seed in seeds:
                kw = {"temperature": 0} if seed is None else {"seed": seed}
                r = client.chat.completions.create(
                    model="m",
                    messages=[SYSTEM, {"role": "user", "content": q}],
                    tools=TOOLS,
                    tool_choice=choice,
                    max_tokens=max_tokens,
                    **kw,
                )
                ch = r.choices[0]
                v = verdict(choice, ch)
                tally[v] += 1
                calls = [
                    (c.function.name, c.function.arguments) for c in ch.message.tool_calls or []
                ]
                n_calls[len(calls)] += 1
                dups += len(calls) - len(set(calls))
                if show:
                    print(
                        f"  {choice:8s} seed={seed} {v:7s} {ch.finish_reason:10s} "
                        f"{calls} {ch.message.content!r:.60}"
                    )
        out[choice] = {
            "replies": dict(tally),
            "calls_per_reply": dict(sorted(n_calls.items())),
            "duplicate_calls": dups,
        }
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--seeds", type=int, default=5, help="sampled runs per question (T=1)")
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--show", action="store_true", help="print every reply")
    ap.add_argument(
        "--choices", nargs="+", default=["required", "auto"], choices=["required", "auto"]
    )
    ap.add_argument("--smoke", action="store_true", help="tiny random model, one seed")
    ap.add_argument(
        "--without",
        nargs="+",
        default=[],
        choices=["fold", "bounds"],
        help="turn off the end folding after calls (Constraint.fold_end) or the "
        "number bounds in call arguments, to compare",
    )
    regime.add_json_arg(ap)
    a = ap.parse_args(argv)
    tmp = tempfile.TemporaryDirectory()
    import goinfer
    from goinfer import constrained
    from goinfer.chat import grammar

    if "fold" in a.without:
        constrained.Constraint.fold_end = lambda self, logits, mask, *_: (logits, mask)
    if "bounds" in a.without:
        grammar.bound_numbers = lambda schema: schema  # every tool schema goes through it

    models = (
        [tiny_model(tmp.name)]
        if a.smoke
        else [goinfer.Model.load(m, threads=None, progress=False) for m in a.models]
    )
    if a.smoke:
        a.seeds, a.max_tokens = 1, 160
    seeds = [None] + list(range(a.seeds))  # None: greedy
    res = {
        "benchmark": "tool_defaults",
        "regime": regime.header(None, argv=argv),
        "seeds": a.seeds,
        "max_tokens": a.max_tokens,
        "questions": len(QUESTIONS),
        "without": a.without,
        "models": {},
    }
    result = res["models"]
    for model in models:
        with Serve(model) as client:
            print(
                f"{model.name}: {len(QUESTIONS)} questions x (greedy + {a.seeds} seeds), "
                f"max_tokens {a.max_tokens}, parallel_tool_calls default"
                + (f", without {' and '.join(a.without)}" if a.without else "")
            )
            result[model.name] = r = run(client, seeds, a.max_tokens, a.show, a.choices)
            for choice, x in r.items():
                print(f"  {choice:8s} {x}")
    print(json.dumps(result))
    models.clear()
    tmp.cleanup()
    return regime.finish(res, a.json)


if __name__ == "__main__":
    main()
