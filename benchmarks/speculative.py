"""Speculative decoding on a copy-heavy agent task: decode speed with and without drafting.

    python benchmarks/speculative.py [MODEL] [--tasks 4]
        [--max-tokens 256] [--draft-tokens 16] [--repeats 3] [--threads 2] [--no-llama-cpp]
        [--json out.json]
    PYTHONPATH=. python benchmarks/speculative.py [TINY.gguf] --smoke   (the test suite's run)

The task: the agent was shown a file and must return it edited.  Each task takes the first
~40 lines of one Python source file of tests/data/tokenizer_corpus.txt (CPython's standard
library) and asks the model to rename the excerpt's most frequent identifier everywhere and
reply with the complete updated file (greedy, up to --max-tokens tokens).  The prompt is
rendered with the model's chat template and tokenized once by goinfer; llama.cpp gets the same
token ids.

Engines, each alone in its own process (benchmarks/isolate.py) running every task once, taking
turns within each repeat (a change of the machine's load hits them alike):
  goinfer            ChatSession.chat(..., draft=None) on a fresh KV cache
  goinfer + draft    the same with draft="prompt_lookup", draft_tokens=K: the text must be
                     identical (checked: the script fails otherwise)
  llama.cpp          llama-cpp-python, one Llama (flash attention on), the same ids
  llama.cpp + PLD    a Llama with draft_model=LlamaPromptLookupDecoding(num_pred_tokens=K)
Decode tok/s: goinfer's result.timings.decode_tok_s (sampled tokens after the first / the
time after the prompt); llama.cpp's (streamed tokens - 1) / (time from the first streamed
token to the last).  Medians over repeats, per task; speed-up = with drafting / without.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import isolate
import regime

HERE = Path(__file__).resolve()
DATA = HERE.parent.parent / "tests" / "data" / "tokenizer_corpus.txt"
SEP = "\n\u241e\u241e\u241e goinfer-doc \u241e\u241e\u241e\n"
SKIP = {
    "return",
    "import",
    "class",
    "while",
    "raise",
    "yield",
    "False",
    "None",
    "True",
    "lambda",
    "assert",
    "except",
    "finally",
    "global",
    "continue",
    "break",
    "print",
    "isinstance",
    "string",
    "object",
    "float",
    "range",
    "append",
}


# ============================================================================ the task


def tasks(n: int, lines: int = 40) -> list[dict]:
    """n tasks: {"name", "excerpt", "old", "new", "messages"} from Python files of the corpus."""
    docs = [
        d
        for d in DATA.read_text(encoding="utf-8").split(SEP)
        if d.isascii() and ("def " in d or "class " in d)
    ]
    out = []
    for doc in docs:
        body = "\n".join(doc.strip("\n").splitlines()[:lines]) + "\n"
        words = Counter(w for w in re.findall(r"\b[a-z_][a-z0-9_]{4,}\b", body) if w not in SKIP)
        if not words:
            continue
        old = words.most_common(1)[0][0]
        new = old + "_new" if not old.endswith("_") else old + "new"
        msgs = [
            {
                "role": "system",
                "content": "You are a careful coding agent. When asked to "
                "edit a file, reply with the complete updated file in one code block.",
            },
            {
                "role": "user",
                "content": f"Here is the file module{len(out)}.py:\n\n```python\n"
                f"{body}```\n\nRename `{old}` to `{new}` everywhere in this file. Reply with "
                "the complete updated file and nothing else.",
            },
        ]
        out.append({"name": f"module{len(out)}.py", "old": old, "new": new, "messages": msgs})
        if len(out) == n:
            break
    return out


# ============================================================================ engines


def goinfer_run(model, ids, max_tokens, draft, k):
    from goinfer import KVCache

    s = model.session(KVCache(model, max_tokens=len(ids) + max_tokens + 64))
    r = s.generate(ids, max_tokens=max_tokens, draft=draft, draft_tokens=k)
    return {
        "text": r.text,
        "tokens": r.completion_tokens,
        "decode_tok_s": r.timings.decode_tok_s,
        "drafted": r.timings.draft_tokens,
        "accepted": r.timings.draft_accepted,
    }


def llama_run(llm, ids, max_tokens):
    llm.reset()
    text, n, t_first = [], 0, None
    for chunk in llm.create_completion(ids, max_tokens=max_tokens, temperature=0.0, stream=True):
        if t_first is None:
            t_first = time.perf_counter()
        text.append(chunk["choices"][0]["text"])
        n += 1
    dt = time.perf_counter() - t_first if t_first is not None else 0.0
    return {"text": "".join(text), "tokens": n, "decode_tok_s": (n - 1) / dt if dt > 0 else 0.0}


ENGINES = ("goinfer", "goinfer + draft", "llama.cpp", "llama.cpp + PLD")


def child() -> None:
    """One engine over every task once: {"runs": [per task]}; or the tasks' prompt ids."""
    spec = isolate.child_spec()
    kind, path, threads, k, n = (
        spec["engine"],
        spec["model"],
        spec["threads"],
        spec["draft_tokens"],
        spec["max_tokens"],
    )
    if kind == "prompts":
        import goinfer

        model = goinfer.Model.load(path, threads=1, progress=False)
        todo = tasks(spec["tasks"])
        for t in todo:
            t["ids"] = model.tokenize_chat(model.apply_chat_template(t.pop("messages")))
        return isolate.child_reply({"tasks": todo})
    ids_of = [t["ids"] for t in spec["todo"]]
    out: dict = {}
    if kind.startswith("goinfer"):
        import goinfer

        model = goinfer.Model.load(path, threads=threads, progress=False)
        goinfer_run(model, ids_of[0][:64], 2, None, k)  # warm-up
        draft = "prompt_lookup" if kind == "goinfer + draft" else None
        out["runs"] = [goinfer_run(model, ids, n, draft, k) for ids in ids_of]
    else:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        kw = {}
        if kind == "llama.cpp + PLD":  # a draft model needs logits_all=True (score buffer)
            kw = dict(draft_model=LlamaPromptLookupDecoding(num_pred_tokens=k), logits_all=True)
        llm = Llama(
            path,
            n_ctx=spec["n_ctx"],
            n_threads=threads,
            n_threads_batch=threads,
            flash_attn=True,
            verbose=False,
            **kw,
        )
        llama_run(llm, ids_of[0][:64], 2)  # warm-up
        out["runs"] = [llama_run(llm, ids, n) for ids in ids_of]
        out["system_info"] = regime.system_info()
    isolate.child_reply(out)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--draft-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="1 task, 64 tokens, 1 repeat (llama.cpp too when it is installed)",
    )
    regime.add_json_arg(ap)
    args = ap.parse_args(argv)
    if args.smoke:
        args.tasks, args.max_tokens, args.repeats = 1, 64, 1
    peer = regime.peer("llama.cpp")
    if args.no_llama_cpp:
        print("llama.cpp: skipped (--no-llama-cpp)", flush=True)
    elif not peer["installed"]:
        args.no_llama_cpp = True
        print("llama.cpp: skipped (llama-cpp-python is not installed)", flush=True)

    from goinfer import hub

    tmp = tempfile.TemporaryDirectory()
    if args.smoke and args.model is None:
        from shapes import smoke_model

        args.model = str(smoke_model(tmp.name))
    path = str(hub.resolve(args.model or "smollm2-135m", progress=False))
    spec = {
        "model": path,
        "threads": args.threads,
        "draft_tokens": args.draft_tokens,
        "max_tokens": args.max_tokens,
        "tasks": args.tasks,
    }
    todo = isolate.run_child(HERE, {**spec, "engine": "prompts"})["tasks"]
    spec.update(todo=todo, n_ctx=max(len(t["ids"]) for t in todo) + args.max_tokens + 64)
    names = [e for e in ENGINES if not (args.no_llama_cpp and e.startswith("llama"))]
    res = {
        "benchmark": "speculative",
        "regime": regime.header(args.threads, argv=argv, peer_name="llama.cpp"),
        "model": regime.model(path),
        "draft_tokens": args.draft_tokens,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "one_process_per_engine": True,
        "tasks": [],
    }
    # each engine alone in its own process, every task once, alternating engine by engine
    runs: dict[str, list] = {n: [] for n in names}
    for _ in range(args.repeats):
        for n in names:
            runs[n].append(isolate.run_child(HERE, {**spec, "engine": n}))
    res["processes"] = {
        "parent": os.getpid(),
        **{n: [r["pid"] for r in rs] for n, rs in runs.items()},
    }
    for n in names:
        if "system_info" in runs[n][0]:
            res["regime"]["peer"]["system_info"] = runs[n][0]["system_info"]
    for i, t in enumerate(todo):
        row = {
            "task": t["name"],
            "rename": f"{t['old']} -> {t['new']}",
            "prompt_tokens": len(t["ids"]),
        }
        texts = {}
        for n in names:
            rs = [r["runs"][i] for r in runs[n]]
            row[n] = {
                "decode_tok_s": statistics.median(r["decode_tok_s"] for r in rs),
                "runs_decode_tok_s": [r["decode_tok_s"] for r in rs],
                "tokens": rs[0]["tokens"],
                "same_text_every_repeat": len({r["text"] for r in rs}) == 1,
            }
            if "accepted" in rs[0]:
                row[n].update(drafted=rs[0]["drafted"], accepted=rs[0]["accepted"])
            texts[n] = rs[0]["text"]
        row["goinfer_identical"] = texts["goinfer + draft"] == texts["goinfer"]
        if "llama.cpp" in texts:
            row["llama_identical"] = texts["llama.cpp + PLD"] == texts["llama.cpp"]
        row["reply_excerpt"] = texts["goinfer"][:120]
        res["tasks"].append(row)
        print(json.dumps({k_: v for k_, v in row.items() if k_ != "reply_excerpt"}), flush=True)
    print(table(res))
    tmp.cleanup()
    regime.finish(res, args.json)
    if not all(r["goinfer_identical"] for r in res["tasks"]):
        print("ERROR: drafting changed goinfer's output", file=sys.stderr)
        raise SystemExit(1)
    return res


def table(res) -> str:
    names = [
        n
        for n in ("goinfer", "goinfer + draft", "llama.cpp", "llama.cpp + PLD")
        if n in res["tasks"][0]
    ]
    r0 = res["regime"]
    lines = [
        f"{res['model']['file']}, {r0['threads']} threads, K = {res['draft_tokens']}, "
        f"{r0['date']}, load {r0['load_avg_start'][0]:.1f}",
        "",
        "| task | prompt | tokens | "
        + " | ".join(f"{n} tok/s" for n in names)
        + " | accepted / drafted | speed-up goinfer | speed-up llama.cpp |",
        "|" + "---|" * (5 + len(names)),
    ]
    ups = []
    for r in res["tasks"]:
        up = r["goinfer + draft"]["decode_tok_s"] / r["goinfer"]["decode_tok_s"]
        ups.append(up)
        lup = (
            f"{r['llama.cpp + PLD']['decode_tok_s'] / r['llama.cpp']['decode_tok_s']:.2f}x"
            if "llama.cpp" in r
            else "-"
        )
        d = r["goinfer + draft"]
        lines.append(
            f"| {r['task']} ({r['rename']}) | {r['prompt_tokens']} | "
            f"{r['goinfer']['tokens']} | "
            + " | ".join(f"{r[n]['decode_tok_s']:.1f}" for n in names)
            + f" | {d['accepted']} / {d['drafted']} | {up:.2f}x | {lup} |"
        )
    gm = statistics.geometric_mean(ups) if ups else 0.0
    lines += [
        "",
        f"goinfer with drafting / without (geometric mean): {gm:.2f}x; identical text: "
        f"{all(r['goinfer_identical'] for r in res['tasks'])}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child()
    else:
        main()
