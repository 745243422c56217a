"""`goinfer serve`'s flags (goinfer/server/cli.py): each one, parsed by the CLI's own parser,
lands in the field of ServeOptions it names and in no other; every flag the parser has is in the
table below (a new flag without a field fails here); and the spec those fields make builds the
app they name (goinfer/server/spec.py's open_app, which the single process and every Ray
replica run), checked on the built objects themselves."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from goinfer.cli import build_parser
from goinfer.cli import main as cli_main
from goinfer.server import cli as server_cli
from goinfer.server.cli import serve_options
from goinfer.server.spec import ServeOptions

# flag -> (its argv values, {ServeOptions field (dotted into spec / policy): the value it holds})
FLAGS: dict[str, tuple[list[str], dict]] = {
    "--host": (["0.0.0.0"], {"host": "0.0.0.0"}),
    "--port": (["9123"], {"port": 9123}),
    "--api-key": (["k-123"], {"spec.api_key": "k-123"}),
    "--max-queue": (["5"], {"spec.max_queue": 5}),
    "--max-batch": (["3"], {"spec.max_batch": 3}),
    "--prefill-chunk": (["96"], {"spec.prefill_chunk": 96}),
    "--threads": (["3"], {"spec.threads": 3}),
    "--exact": ([], {"spec.exact": True}),
    "--ctx": (["192"], {"spec.ctx": 192}),
    "--draft": (["prompt_lookup"], {"spec.draft": "prompt_lookup"}),
    "--draft-tokens": (["5"], {"spec.draft_tokens": 5}),
    "--kv-tokens": (["320"], {"spec.kv_tokens": 320}),
    "--kv-dtype": (["f32"], {"spec.kv_dtype": "f32"}),
    "--max-body": (["4096"], {"spec.max_body": 4096}),
    "--anthropic-normalize": (["billing_header"], {"anthropic_normalize": "billing_header"}),
    "--anthropic-defaults": (['{"top_k": 5}'], {"anthropic_defaults": '{"top_k": 5}'}),
    "--log-level": (["debug"], {"log_level": "debug"}),
    "--replicas": (["3"], {"replicas": 3}),
    "--threads-per-replica": (["2"], {"threads_per_replica": 2}),
    "--ray-address": (["auto"], {"ray_address": "auto"}),
    "--route": (["random"], {"policy.name": "random"}),
    "--route-imbalance": (["7"], {"policy.imbalance": 7}),
}
ALIASES = {"--exact-prefill": "--exact"}  # another name of the same flag


def serve_parser():
    (sub,) = [a for a in build_parser()._actions if a.dest == "cmd"]
    return sub.choices["serve"]


def flat(o: ServeOptions) -> dict:
    """The options as {field: value}, spec's and policy's fields dotted."""
    out = {}
    for k, v in dataclasses.asdict(o).items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        else:
            out[k] = v
    return out


def options(*argv: str) -> ServeOptions:
    return serve_options(build_parser().parse_args(["serve", "m.gguf", *argv]))


def test_every_flag_is_in_the_table():
    strings = {
        s
        for a in serve_parser()._actions
        if a.option_strings and a.dest != "help"
        for s in a.option_strings
    }
    assert strings == set(FLAGS) | set(ALIASES)
    positionals = [a.dest for a in serve_parser()._actions if not a.option_strings]
    assert positionals == ["model", "url"]  # the model, or `check URL`


@pytest.mark.parametrize("flag", sorted(FLAGS) + sorted(ALIASES))
def test_flag_lands_in_its_field_and_no_other(flag):
    values, want = FLAGS[ALIASES.get(flag, flag)]
    default, got = flat(options()), flat(options(flag, *values))
    changed = {k: v for k, v in got.items() if v != default[k]}
    assert changed == want, (flag, changed)


def test_the_model_and_its_id():
    o = options()
    assert (o.spec.model, o.spec.resolved_model_id(), o.on_ray) == ("m.gguf", "m", False)
    o = serve_options(build_parser().parse_args(["serve", "smollm2-135m", "--replicas", "2"]))
    assert (o.spec.model, o.spec.resolved_model_id(), o.on_ray) == (
        "smollm2-135m",
        "smollm2-135m",
        True,
    )
    assert options("--ray-address", "auto").on_ray
    assert serve_options(build_parser().parse_args(["serve", "check", "http://h:1"])).spec.model


def test_single_process_serves_the_app_its_flags_name(tiny, monkeypatch):
    """`goinfer serve TINY <every per-process flag>`: the app handed to uvicorn holds a model,
    a KV cache, an engine and a runner with those values; uvicorn gets host, port, log level."""
    import uvicorn

    path = str(tiny("llama")[1])  # (the file test_cli.py uses)
    got = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: got.update(app=app, **kw))
    for env in ("GOINFER_ANTHROPIC_NORMALIZE", "GOINFER_ANTHROPIC_DEFAULTS"):
        monkeypatch.delenv(env, raising=False)  # run() sets them for the routes
    argv = ["serve", path, "--host", "127.0.0.2", "--port", "9123", "--log-level", "debug"]
    for flag in (
        "--api-key",
        "--max-queue",
        "--max-batch",
        "--prefill-chunk",
        "--threads",
        "--exact",
        "--ctx",
        "--draft",
        "--draft-tokens",
        "--kv-tokens",
        "--kv-dtype",
        "--max-body",
        "--anthropic-normalize",
        "--anthropic-defaults",
    ):
        argv += [flag, *FLAGS[flag][0]]
    assert cli_main(argv) == 0
    assert (got["host"], got["port"], got["log_level"]) == ("127.0.0.2", 9123, "debug")
    st = got["app"].state
    m, cache, engine, served = st.model, st.cache, st.engine, st.served
    assert (m.threads, m.exact, m.n_ctx, m.kv_dtype) == (3, True, 192, "f32")
    assert (cache.max_tokens, cache.dtype) == (320, "f32")
    assert (engine.max_batch, engine.max_queue, engine.prefill_chunk) == (3, 5, 96)
    assert (st.model_id, st.api_key, served.api_key, served.max_body) == (
        Path(path).stem,
        "k-123",
        "k-123",
        4096,
    )
    assert (served.runner.draft, served.runner.draft_tokens) == (True, 5)
    assert os.environ["GOINFER_ANTHROPIC_NORMALIZE"] == "billing_header"
    assert os.environ["GOINFER_ANTHROPIC_DEFAULTS"] == '{"top_k": 5}'


def test_bad_values_are_refused(capsys):
    assert server_cli.run(build_parser().parse_args(["serve", "m", "--route-imbalance", "-1"])) == 2
    assert "imbalance" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "m", "--log-level", "loud"])
