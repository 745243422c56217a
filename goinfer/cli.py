"""Command line: goinfer pull | list | run | chat | serve | bench | profile | perplexity | compare | config."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from goinfer.cli_options import exact_option, kv_dtype_option
from goinfer.errors import GoinferError

if TYPE_CHECKING:
    from goinfer.generation import GenerationResult


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        help="a model name (see `goinfer list`; hf.co/ORG/REPO[:QUANT], an "
        "Ollama name) or a path to a .gguf (a split one: its first part)",
    )
    p.add_argument(
        "--threads", type=int, default=None, help="kernel threads (default: physical cores)"
    )
    exact_option(p)
    p.add_argument("--ctx", type=int, default=None, help="context length (default: the model's)")
    kv_dtype_option(p)


def _sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=None, help="stop sequence (repeatable)")
    from goinfer.speculative import DEFAULT_DRAFT_TOKENS, DRAFTS

    p.add_argument(
        "--draft",
        choices=["none", *DRAFTS],
        default="none",
        help="speculative drafting (the same output; faster when the reply copies from the prompt)",
    )
    p.add_argument(
        "--draft-tokens",
        type=int,
        default=DEFAULT_DRAFT_TOKENS,
        help=f"the most tokens per draft (default {DEFAULT_DRAFT_TOKENS})",
    )


def _load(args):
    from goinfer.model import Model

    return Model.load(
        args.model,
        threads=args.threads,
        exact=args.exact,
        context_length=args.ctx,
        kv_dtype=args.kv_dtype,
    )


def _sampling(args) -> dict:
    return dict(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repeat_penalty=args.repeat_penalty,
        seed=args.seed,
        stop=args.stop,
        draft=None if args.draft == "none" else args.draft,
        draft_tokens=args.draft_tokens,
    )


def _stats(r, file=None) -> None:
    file = file or sys.stderr
    t = r.timings
    print(
        f"\n[prompt {r.prompt_tokens} tokens ({r.cached_tokens} cached): prefill "
        f"{t.prefill_tok_s:.1f} tok/s in {t.prefill_ms:.0f} ms | {r.completion_tokens} tokens: decode "
        f"{t.decode_tok_s:.1f} tok/s{_drafts(t)} | finish: {r.finish_reason}]",
        file=file,
    )


def _drafts(t) -> str:
    return f" (drafts: {t.draft_accepted} of {t.draft_tokens} accepted)" if t.draft_tokens else ""


def _stream(session, method, arg, sampling) -> GenerationResult:
    result = None
    for piece in getattr(session, method)(arg, stream=True, **sampling):
        if isinstance(piece, str):
            sys.stdout.write(piece)
            sys.stdout.flush()
        else:
            result = piece
    sys.stdout.write("\n")
    if result is None:
        raise RuntimeError("generation ended without a result")
    return result


# ============================================================================ commands


def cmd_pull(args) -> int:
    from goinfer import hub, layout

    path = hub.pull(args.name, force=args.force)
    print(path)
    if layout.enabled_by_env() and not args.no_layout:
        # the native layout the kernels read, so that the first Model.load maps it (goinfer/layout.py)
        print(layout.prepare(path, progress=True))
    return 0


def cmd_list(args) -> int:
    from goinfer import hub

    print(hub.format_models())
    return 0


def cmd_run(args) -> int:
    model = _load(args)
    s = model.session()
    r = _stream(s, "generate", args.prompt, _sampling(args))
    _stats(r)
    return 0


def cmd_chat(args) -> int:
    model = _load(args)
    s = model.session()
    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    if args.prompt is not None:
        messages.append({"role": "user", "content": args.prompt})
        r = _stream(s, "chat", messages, _sampling(args))
        _stats(r)
        return 0
    print(f"goinfer chat with {model.name}: empty line or Ctrl-D to quit.", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        messages.append({"role": "user", "content": line})
        r = _stream(s, "chat", messages, _sampling(args))
        messages.append({"role": "assistant", "content": r.text})
        _stats(r)
    return 0


def cmd_bench(args) -> int:
    from goinfer import bench

    model = _load(args)
    lengths = [int(x) for x in args.prompt_lengths.split(",") if x]
    decode_prompts = [int(x) for x in args.decode_prompts.split(",") if x]
    res = bench.run(
        model,
        lengths,
        decode_prompts,
        args.decode_tokens,
        args.repeats,
        log=lambda m: print(m, file=sys.stderr),
    )
    print(bench.table(res))
    if args.json:
        with open(args.json, "w") as f:
            f.write(bench.to_json(res))
        print(f"JSON written to {args.json}", file=sys.stderr)
    else:
        print(bench.to_json(res))
    return 0


def cmd_perplexity(args) -> int:
    from goinfer import fidelity
    from goinfer.model import Model

    model = Model.load(
        args.model,
        threads=args.threads,
        exact=args.exact,
        context_length=args.model_ctx,
        kv_dtype=args.kv_dtype,
    )
    ids = fidelity.read_ids(model, args.file, args.max_tokens, args.skip_tokens)
    r = fidelity.perplexity(model, ids, args.ctx, args.stride)
    print(r.summary())
    if args.json:
        _write_json(args.json, r.as_dict())
    return 0


def cmd_compare(args) -> int:
    from goinfer import fidelity

    try:
        a, b = fidelity.parse_settings(args.a), fidelity.parse_settings(args.b)
    except ValueError as e:
        print(f"goinfer: error: {e}", file=sys.stderr)
        return 2
    ma, mb = fidelity.load_pair(args.model, a, b, context_length=args.model_ctx)
    ids = fidelity.read_ids(ma, args.file, args.max_tokens, args.skip_tokens)
    r = fidelity.compare(ma, mb, ids, args.ctx, args.stride, settings_a=a, settings_b=b)
    print(r.summary())
    if args.json:
        _write_json(args.json, r.as_dict())
    return 0


def _write_json(path, d) -> None:
    import json

    with open(path, "w") as f:
        json.dump(d, f, indent=1)
    print(f"JSON written to {path}", file=sys.stderr)


def _fidelity_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ctx", type=int, default=1024, help="window length in tokens (default 1024)")
    p.add_argument("--stride", type=int, default=None, help="window step (default ctx/2)")
    p.add_argument("--max-tokens", type=int, default=None, help="use only the first N tokens")
    p.add_argument(
        "--skip-tokens", type=int, default=0, help="start at this token of the text (default 0)"
    )
    p.add_argument(
        "--model-ctx",
        type=int,
        default=None,
        help="the model's context length (default: the file's)",
    )
    p.add_argument("--json", default=None, help="also write the result as JSON here")


def cmd_profile(args) -> int:
    import json

    from goinfer import profile

    model = _load(args)
    res = profile.run(model, args.prompt_tokens, args.decode_tokens)
    print(profile.table(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def cmd_serve(args) -> int:
    from goinfer.server import cli as server_cli

    return server_cli.run(args)


def cmd_config(args) -> int:
    from goinfer import show_config

    show_config()
    return 0


# ============================================================================ main


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="goinfer", description="Fast CPU inference of open-weight LLMs."
    )
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser(
        "pull",
        help="download a model: a registered name (into GOINFER_HOME), "
        "hf.co/ORG/REPO[:QUANT] or ORG/REPO[:QUANT] (into the Hugging Face cache); "
        "a model pulled with Ollama is used where it is",
    )
    p.add_argument(
        "name",
        help="a registered name, hf.co/ORG/REPO[:QUANT], ORG/REPO[:QUANT], "
        "hf.co/ORG/REPO/FILE.gguf, an Ollama name (llama3.2, qwen3:4b) or a .gguf path",
    )
    p.add_argument("--force", action="store_true", help="download again even if present")
    p.add_argument(
        "--no-layout",
        action="store_true",
        help="do not build the layout cache (the converted weights) now",
    )
    p.set_defaults(fn=cmd_pull)

    p = sub.add_parser(
        "list",
        help="models goinfer loads by name: its registered ones (pulled "
        "or not), the Hugging Face cache's GGUFs, the Ollama store's",
    )
    p.set_defaults(fn=cmd_list)

    p = sub.add_parser("run", help="generate a continuation of a raw prompt")
    _model_args(p)
    p.add_argument("prompt")
    _sampling_args(p)
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("chat", help="chat (one --prompt, or interactive)")
    _model_args(p)
    p.add_argument("--prompt", default=None, help="one user message; omit for an interactive chat")
    p.add_argument("--system", default=None, help="system message")
    _sampling_args(p)
    p.set_defaults(fn=cmd_chat)

    p = sub.add_parser("serve", help="OpenAI-compatible server (`serve check URL` tests one)")
    from goinfer.server.cli import add_arguments as _serve_args

    _serve_args(p)
    p.set_defaults(fn=cmd_serve)

    p = sub.add_parser("bench", help="prefill and decode speed")
    _model_args(p)
    p.add_argument("--prompt-lengths", default="128,512,2048")
    p.add_argument(
        "--decode-prompts", default="64,2048", help="prompt lengths before the decode measurement"
    )
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None, help="write the JSON result here (default: stdout)")
    p.set_defaults(fn=cmd_bench)

    p = sub.add_parser("perplexity", help="perplexity over a text file (sliding windows)")
    p.add_argument("model", help="a registered model name or a path to a .gguf")
    p.add_argument("file", help="a UTF-8 text file")
    p.add_argument("--threads", type=int, default=None, help="kernel threads")
    exact_option(p)
    kv_dtype_option(p)
    _fidelity_args(p)
    p.set_defaults(fn=cmd_perplexity)

    p = sub.add_parser("compare", help="teacher-forced agreement of two settings over a text")
    p.add_argument("model", help="the model for settings without model=")
    p.add_argument("file", help="a UTF-8 text file")
    p.add_argument(
        "--a",
        required=True,
        help="settings A: key=value,... (model, exact, "
        "threads, kv_dtype), e.g. exact=true or kv_dtype=f32",
    )
    p.add_argument("--b", required=True, help="settings B, e.g. exact=false")
    _fidelity_args(p)
    p.set_defaults(fn=cmd_compare)

    p = sub.add_parser("profile", help="time per kernel family for a prefill and decode steps")
    _model_args(p)
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--decode-tokens", type=int, default=16)
    p.add_argument("--json", default=None)
    p.set_defaults(fn=cmd_profile)

    p = sub.add_parser("config", help="version, kernel variant, OpenMP, threads")
    p.set_defaults(fn=cmd_config)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except GoinferError as e:
        print(f"goinfer: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
