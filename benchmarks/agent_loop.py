"""An agent transcript, turn by turn: how much of each prompt comes from cache and how long the
first token takes.  goinfer with prefix reuse, goinfer cold, and llama-cpp-python (one live
`Llama` continuing the conversation, and with its `LlamaRAMCache`).

    python benchmarks/agent_loop.py [MODEL.gguf] [--turns 12] [--reply-tokens 30] [--repeats 1]
        [--json out.json]
    python benchmarks/agent_loop.py gemma3-270m --transcript long [--max-context 12288]
    python benchmarks/agent_loop.py [TINY.gguf] --smoke  # tiny model, 2 short turns (the test suite)

The transcript is scripted so every engine sees the same messages: a system prompt with tool
definitions (about 1,500 tokens), then per turn a tool result or file excerpt of 150-400 tokens
and the assistant's previous reply (scripted, about 30 tokens).  ``--transcript long``: tool
results of about 600-1,500 tokens per turn (whole files, long test logs), for as many turns as
fit --max-context tokens (default 12,288) and the model's context (SmolLM2: 8,192; Gemma 3
270M: 32,768), so the last turns run on a 12k-token cached context.  Each engine renders the whole
conversation with the model's chat template every turn (as an agent resends its context) and
generates up to --reply-tokens tokens; time to first token (TTFT) is measured from the call to the
first streamed piece.  Each engine runs alone in its own process (benchmarks/isolate.py) over
the whole transcript, the engines alternating (goinfer reuse, goinfer cold, llama.cpp live,
llama.cpp RAM cache, then again for --repeats); per turn the median over repeats.  After the
last turn the goinfer cache is saved and loaded, and the last prompt is timed from the loaded
cache against a cold prefill of the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import isolate
import regime

HERE = Path(__file__).resolve()
DATA = HERE.parent.parent / "tests" / "data" / "tokenizer_corpus.txt"
SEP = "\n\u241e\u241e\u241e goinfer-doc \u241e\u241e\u241e\n"

TOOLS = [
    (
        "read_file",
        "Read a UTF-8 text file from the workspace and return its contents with line "
        "numbers. Use it before editing a file. Large files are returned in pages.",
        {
            "path": ("string", "Path relative to the workspace root."),
            "start_line": ("integer", "First line to return (1-based)."),
            "max_lines": ("integer", "How many lines to return, at most 400."),
        },
    ),
    (
        "write_file",
        "Create or overwrite a file in the workspace with the given contents. Parent "
        "directories are created. Returns the number of bytes written.",
        {
            "path": ("string", "Path relative to the workspace root."),
            "contents": ("string", "The complete new contents of the file."),
        },
    ),
    (
        "edit_file",
        "Replace an exact snippet of a file with new text. The old text must occur "
        "exactly once; include enough surrounding lines to make it unique.",
        {
            "path": ("string", "Path relative to the workspace root."),
            "old_text": ("string", "The exact text to replace."),
            "new_text": ("string", "The replacement text."),
        },
    ),
    (
        "list_directory",
        "List the entries of a directory, with sizes and modification times, directories first.",
        {
            "path": ("string", "Directory relative to the workspace root."),
            "recursive": ("boolean", "Descend into subdirectories."),
        },
    ),
    (
        "search_code",
        "Search the workspace for a regular expression and return matching lines "
        "with their file names and line numbers, at most 50 matches.",
        {
            "pattern": ("string", "A Python regular expression."),
            "glob": ("string", "Only search files matching this glob, e.g. '*.py'."),
        },
    ),
    (
        "run_tests",
        "Run the project's test suite, or a subset of it, and return the summary and "
        "the output of failing tests.",
        {
            "selector": ("string", "A pytest node id or -k expression."),
            "timeout_s": ("integer", "Give up after this many seconds."),
        },
    ),
    (
        "run_command",
        "Run a shell command in the workspace and return its exit code, standard "
        "output and standard error, truncated to 20,000 characters.",
        {"command": ("string", "The command line."), "cwd": ("string", "Working directory.")},
    ),
    (
        "git_diff",
        "Show the uncommitted changes of the workspace as a unified diff.",
        {"paths": ("array", "Limit the diff to these paths.")},
    ),
    (
        "http_get",
        "Fetch a URL and return the response status, headers and the first 50,000 "
        "characters of the body as text.",
        {"url": ("string", "An http or https URL.")},
    ),
    (
        "ask_user",
        "Ask the user a question and wait for the answer. Use it only when the task is "
        "ambiguous and no tool can resolve it.",
        {"question": ("string", "The question.")},
    ),
]


def system_prompt() -> str:
    specs = []
    for name, desc, params in TOOLS:
        specs.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": desc,
                    "parameters": {
                        "type": "object",
                        "required": list(params)[:1],
                        "properties": {
                            k: {"type": t, "description": d} for k, (t, d) in params.items()
                        },
                    },
                },
            }
        )
    rules = (
        "You are a careful software engineering agent working in a Python repository. You solve "
        "the user's task by calling tools, one call per turn, and you explain briefly what you "
        "will do before each call. Never invent file contents: read files before you change "
        "them. Keep changes minimal and run the tests after every edit. When a tool fails, read "
        "its error and try a different approach instead of repeating the same call. When the "
        "task is done, summarise what changed and why in a few sentences.\n\n"
        'To call a tool, answer with a JSON object {"tool": NAME, "arguments": {...}} on a '
        "line of its own. The available tools are:\n"
    )
    return rules + json.dumps(specs, indent=1)


def transcript(turns: int, long: bool = False, short: bool = False):
    """(system, [(tool_result_text, scripted_reply)] * turns).  long: tool results of
    2,500-6,000 characters; short (smoke runs): a short system prompt and results."""
    docs = [d for d in DATA.read_text(encoding="utf-8").split(SEP) if d.isascii()]
    replies = [
        "I will read the module that defines the parser to see how options are handled.",
        "The function builds the help text itself; next I will search for its callers.",
        "The tests cover the happy path only. I will look at the test file for this module.",
        "I see the bug: the width is computed before tabs are expanded. Let me check git.",
        "Now I will edit the wrapper so that tabs are expanded before measuring the width.",
        "The edit is in place. I will run the focused tests for the wrapper module now.",
        "Two tests fail because they pinned the old behaviour. I will read them carefully.",
        "They assert the buggy output. I will update the expectations to the fixed output.",
        "Next I will search the code base for other places that measure text width.",
        "The JSON decoder has a similar helper but it handles tabs correctly already.",
        "I will run the whole test suite to make sure nothing else depends on this.",
        "All tests pass. I will show the final diff and summarise the change for you.",
    ]
    out = []
    for i in range(turns):
        doc = docs[(3 * i) % len(docs)]
        n_chars = 700 + (i * 377) % 900  # 150-400 tokens of code/prose
        if long:
            doc = "\n".join(docs[(3 * i + j) % len(docs)] for j in range(4))
            n_chars = 2500 + (i * 1231) % 3500  # about 600-1,500 tokens
        if short:
            n_chars = 120
        body = doc[:n_chars]
        kind = ["read_file", "search_code", "run_tests", "git_diff"][i % 4]
        result = json.dumps({"tool": kind, "status": "ok", "output": body})
        out.append((result, replies[i % len(replies)]))
    return (system_prompt()[:300] if short else system_prompt()), out


def conversation(system, turns, upto: int):
    msgs = [
        {"role": "system", "content": system},
        {
            "role": "user",
            "content": "Fix the bug where text wrapping miscounts tabs, and add a test.",
        },
    ]
    for i in range(upto):
        result, reply = turns[i]
        if i > 0:
            msgs.append({"role": "assistant", "content": turns[i - 1][1]})
        msgs.append({"role": "user", "content": f"Tool result:\n{result}"})
    return msgs


# ============================================================================ engines


def goinfer_turns(model, cache, prompts, reply_tokens, reuse: bool):
    """Yields one row per prompt: the conversation continued in one session (reuse) or every
    prompt prefilled from an empty cache (cold)."""
    s = model.session(cache)
    for p in prompts:
        if not reuse:
            s.reset()
            cache.clear()
        t0 = time.perf_counter()
        ttft = None
        for piece in s.generate(p, max_tokens=reply_tokens, stream=True):
            if ttft is None:
                ttft = time.perf_counter() - t0
            if not isinstance(piece, str):
                r = piece
        total = time.perf_counter() - t0
        yield {
            "prompt_tokens": r.prompt_tokens,
            "cached_tokens": r.cached_tokens,
            "ttft_s": ttft,
            "total_s": total,
            "completion_tokens": r.completion_tokens,
        }


def llama_turns(llm, prompts, reply_tokens, cold: bool):
    """Yields one row per prompt (cached_tokens: the prefix the Llama object held)."""
    for p in prompts:
        if cold:
            llm.reset()
        n_before = llm.n_tokens
        common = 0
        for a, b in zip(llm._input_ids[:n_before].tolist(), p):
            if a != b:
                break
            common += 1
        t0 = time.perf_counter()
        ttft = None
        n = 0
        for _ in llm.create_completion(p, max_tokens=reply_tokens, temperature=0.0, stream=True):
            if ttft is None:
                ttft = time.perf_counter() - t0
            n += 1
        total = time.perf_counter() - t0
        yield {
            "prompt_tokens": len(p),
            "cached_tokens": min(common, len(p) - 1),
            "ttft_s": ttft,
            "total_s": total,
            "completion_tokens": n,
        }


def child() -> None:
    """One engine over the whole transcript: {"rows": [per turn], ...}; or the prompts."""
    spec = isolate.child_spec()
    kind, path, threads = spec["engine"], spec["model"], spec["threads"]
    if kind == "prompts":
        return isolate.child_reply(prompts_of(spec))
    prompts, reply, n_ctx = spec["prompts"], spec["reply_tokens"], spec["n_ctx"]
    out: dict = {}
    if kind.startswith("goinfer"):
        import goinfer

        model = goinfer.Model.load(path, threads=threads, progress=False)
        list(
            goinfer_turns(
                model, goinfer.KVCache(model, max_tokens=128), [prompts[0][:64]], 1, False
            )
        )
        reuse = kind == "goinfer (reuse)"
        cache = goinfer.KVCache(model, max_tokens=max(16384, 2 * n_ctx) if reuse else n_ctx)
        out["rows"] = list(goinfer_turns(model, cache, prompts, reply, reuse))
        if reuse:
            out["save_load"] = save_load(goinfer, model, cache, prompts[-1])
    else:
        from llama_cpp import Llama, LlamaRAMCache

        llm = Llama(
            path,
            n_ctx=n_ctx,
            n_batch=512,
            n_threads=threads,
            n_threads_batch=threads,
            flash_attn=True,
            verbose=False,
        )
        if kind == "llama.cpp (LlamaRAMCache)":
            llm.set_cache(LlamaRAMCache(capacity_bytes=8 << 30))
        llm.create_completion(prompts[0][:64], max_tokens=1)  # warm-up
        llm.reset()
        out["rows"] = list(llama_turns(llm, prompts, reply, cold=False))
        out["system_info"] = regime.system_info()
    isolate.child_reply(out)


def prompts_of(spec: dict) -> dict:
    """The transcript's prompts as token ids (the model's chat template), as many turns as fit."""
    import goinfer

    model = goinfer.Model.load(spec["model"], threads=1, progress=False)
    system, turns = transcript(spec["turns"], long=spec["long"], short=spec["short"])
    limit = (
        min(model.n_ctx, spec["max_context"] if spec["long"] else model.n_ctx)
        - spec["reply_tokens"]
        - 16
    )
    prompts = []
    for i in range(1, spec["turns"] + 1):
        text = model.apply_chat_template(conversation(system, turns, i), add_generation_prompt=True)
        ids = model.tokenize_chat(text)
        if len(ids) > limit:
            if not prompts:
                raise SystemExit(f"the first turn ({len(ids)} tokens) does not fit {limit}")
            break
        prompts.append(ids)
    return {"prompts": prompts}


def save_load(goinfer, model, cache, last: list[int]) -> dict:
    """Save and load the cache after the last turn; the last prompt from the loaded cache
    against a cold prefill of the same tokens."""
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "kv.bin"
        t0 = time.perf_counter()
        n_blocks = cache.save(f)
        t_save = time.perf_counter() - t0
        size = f.stat().st_size
        t0 = time.perf_counter()
        loaded = goinfer.KVCache.load(model, f)
        t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    r2 = model.session(loaded).generate(last, max_tokens=1)
    t_after_load = time.perf_counter() - t0
    cold = goinfer.KVCache(model, max_tokens=len(last) + 64)
    t0 = time.perf_counter()
    r3 = model.session(cold).generate(last, max_tokens=1)
    t_cold = time.perf_counter() - t0
    return {
        "blocks": n_blocks,
        "bytes": size,
        "save_s": t_save,
        "load_s": t_load,
        "ttft_after_load_s": t_after_load,
        "cached_after_load": r2.cached_tokens,
        "cold_prefill_s": t_cold,
        "cached_cold": r3.cached_tokens,
        "prompt_tokens": len(last),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--reply-tokens", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--repeats", type=int, default=1, help="whole transcripts per engine (medians per turn)"
    )
    ap.add_argument("--no-llama-cpp", action="store_true")
    ap.add_argument("--transcript", choices=["default", "long"], default="default")
    ap.add_argument(
        "--max-context",
        type=int,
        default=12288,
        help="long transcript: stop adding turns beyond this many tokens",
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="2 short turns, 4 reply tokens (llama.cpp too when it is installed)",
    )
    regime.add_json_arg(ap)
    args = ap.parse_args(argv)
    if args.smoke:
        args.turns, args.reply_tokens, args.repeats = 2, 4, 1
    peer = regime.peer("llama.cpp")
    if args.no_llama_cpp:
        print("llama.cpp: skipped (--no-llama-cpp)", flush=True)
    elif not peer["installed"]:
        args.no_llama_cpp = True
        print("llama.cpp: skipped (llama-cpp-python is not installed)", flush=True)
    long = args.transcript == "long"
    if long and args.turns == 12:
        args.turns = 24  # as many as fit --max-context

    from goinfer import hub

    tmp = tempfile.TemporaryDirectory()
    if args.smoke and args.model is None:
        from shapes import smoke_model

        args.model = str(smoke_model(tmp.name))
    path = str(hub.resolve(args.model or "smollm2-135m", progress=False))
    spec = {
        "model": path,
        "threads": args.threads,
        "turns": args.turns,
        "long": long,
        "short": args.smoke,
        "max_context": args.max_context,
        "reply_tokens": args.reply_tokens,
    }
    prompts = isolate.run_child(HERE, {**spec, "engine": "prompts"})["prompts"]
    args.turns = len(prompts)
    spec.update(prompts=prompts, n_ctx=max(len(p) for p in prompts) + args.reply_tokens + 64)
    names = ["goinfer (reuse)", "goinfer (cold)"]
    if not args.no_llama_cpp:
        names += ["llama.cpp (live Llama)", "llama.cpp (LlamaRAMCache)"]
    res = {
        "benchmark": "agent_loop",
        "regime": regime.header(args.threads, argv=argv, peer_name="llama.cpp"),
        "model": regime.model(path),
        "turns": args.turns,
        "reply_tokens": args.reply_tokens,
        "transcript": args.transcript,
        "repeats": args.repeats,
        "one_process_per_engine": True,
        "engines": {},
    }
    # each engine alone in its own process, whole transcripts, alternating engine by engine
    runs: dict[str, list] = {n: [] for n in names}
    for _ in range(args.repeats):
        for n in names:
            runs[n].append(
                isolate.run_child(HERE, {k: v for k, v in {**spec, "engine": n}.items()})
            )
    res["processes"] = {
        "parent": os.getpid(),
        **{n: [r["pid"] for r in rs] for n, rs in runs.items()},
    }
    for n, rs in runs.items():
        rows = []
        for i in range(args.turns):
            per = [r["rows"][i] for r in rs]
            rows.append(
                {
                    **per[0],
                    "ttft_s": statistics.median(p["ttft_s"] for p in per),
                    "total_s": statistics.median(p["total_s"] for p in per),
                    "runs_ttft_s": [p["ttft_s"] for p in per],
                }
            )
        res["engines"][n] = rows
        if "system_info" in rs[0]:
            res["regime"]["peer"]["system_info"] = rs[0]["system_info"]
    sl = [r["save_load"] for r in runs["goinfer (reuse)"]]
    res["save_load"] = {
        **sl[0],
        **{
            k: statistics.median(x[k] for x in sl)
            for k in ("save_s", "load_s", "ttft_after_load_s", "cold_prefill_s")
        },
    }
    print(table(res))
    tmp.cleanup()
    return regime.finish(res, args.json)


def table(res) -> str:
    names = list(res["engines"])
    peers = [n for n in names if n.startswith("llama.cpp")]
    head = (
        "| turn | prompt tokens | "
        + " | ".join(f"{n}: cached / TTFT ms" for n in names)
        + (" | llama.cpp best / goinfer (reuse) |" if peers else " |")
    )
    r0 = res["regime"]
    lines = [
        f"{res['model']['file']}, {r0['threads']} threads, {res['transcript']} transcript, "
        f"{r0['date']}, load {r0['load_avg_start'][0]:.1f}, medians of {res['repeats']} "
        f"transcript(s) per engine, each engine in its own process",
        "",
        head,
        "|" + "---|" * (2 + len(names) + bool(peers)),
    ]
    for i in range(res["turns"]):
        cells = []
        for n in names:
            r = res["engines"][n][i]
            cells.append(f"{r['cached_tokens']} / {r['ttft_s'] * 1e3:.0f}")
        if peers:
            best = min(res["engines"][n][i]["ttft_s"] for n in peers)
            cells.append(f"{best / res['engines']['goinfer (reuse)'][i]['ttft_s']:.2f}x")
        lines.append(
            f"| {i + 1} | {res['engines'][names[0]][i]['prompt_tokens']} | "
            + " | ".join(cells)
            + " |"
        )
    g = res["engines"]["goinfer (reuse)"]
    c = res["engines"]["goinfer (cold)"]
    lines += [
        "",
        f"goinfer turn {len(g)} / turn 2 TTFT: {g[-1]['ttft_s'] / g[1]['ttft_s']:.2f}x; "
        f"cold / reuse on the last turn: {c[-1]['ttft_s'] / g[-1]['ttft_s']:.1f}x",
    ]
    sl = res["save_load"]
    lines.append(
        f"save {sl['blocks']} blocks ({sl['bytes'] / 2**20:.0f} MiB) in {sl['save_s'] * 1e3:.0f} ms, "
        f"load in {sl['load_s'] * 1e3:.0f} ms; last prompt ({sl['prompt_tokens']} tokens) from the "
        f"loaded cache: {sl['ttft_after_load_s'] * 1e3:.0f} ms ({sl['cached_after_load']} cached) vs "
        f"cold prefill {sl['cold_prefill_s'] * 1e3:.0f} ms"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child()
    else:
        main()
