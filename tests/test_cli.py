"""Command line and package-level facts: show_config, threads, CLI commands on a tiny model,
typed errors for bad model files."""

from __future__ import annotations

import io
import json

import gguf
import numpy as np
import pytest

import goinfer
from goinfer import _threads
from goinfer.cli import main
from goinfer.errors import ModelFormatError, UnsupportedArchitectureError


def test_show_config_reports_variant_openmp_threads():
    buf = io.StringIO()
    c = goinfer.show_config(file=buf)
    out = buf.getvalue()
    assert c["openmp"] is True and "OpenMP         : on" in out
    assert c["kernel_variant"] in c["supported_variants"] and c["kernel_variant"] in out
    assert c["version"] == goinfer.__version__ and f"threads        : {c['threads']}" in out
    assert f"wait policy    : {c['wait_policy']}" in out


def test_prefetch_text_groups_kinds_by_distance():
    """`goinfer config`'s GEMV prefetch line: one distance for every kind names no kind; else
    the kinds of each distance, the most common first."""
    from goinfer import _prefetch_text

    assert _prefetch_text({"q4_0": 8, "q4_k": 8}) == "8 groups"
    assert _prefetch_text({"q4_0": 0, "q8_0": 0}) == "none"
    mixed = {"q4_0": 16, "q8_0": 0, "q6_k": 16, "q4_k": 0, "q5_k": 16}
    assert _prefetch_text(mixed) == "16 groups for q4_0, q6_k, q5_k, none for q8_0, q4_k"
    buf = io.StringIO()
    c = goinfer.show_config(file=buf)
    assert f"GEMV prefetch  : near (prefetcht0) {_prefetch_text(c['gemv_prefetch'])}; far" in (
        buf.getvalue()
    )
    assert f"GEMV streams   : {c['gemv_streams']} row block" in buf.getvalue()
    assert f"GEMV warm      : {c['gemv_warm_kb']} KB per matmul" in buf.getvalue()


def test_python_m_goinfer_is_the_command():
    """``python -m goinfer`` runs the same CLI as the ``goinfer`` script: its help, its exit
    status on a bad command."""
    import subprocess
    import sys

    ok = subprocess.run(
        [sys.executable, "-m", "goinfer", "--help"], capture_output=True, text=True, timeout=120
    )
    assert ok.returncode == 0 and "serve" in ok.stdout and "pull" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "goinfer", "no-such-command"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "no-such-command" in bad.stderr


def _config_in_fresh_process(**env):
    """goinfer.config() of a new interpreter with env (only goinfer imported, so libgomp
    loads with goinfer's kernels)."""
    import os
    import subprocess
    import sys

    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "GOINFER_WAIT_POLICY")
    }
    code = "import json, os, goinfer; print(json.dumps([goinfer.config()['wait_policy'], os.environ.get('GOMP_SPINCOUNT')]))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout)


def test_wait_policy_defaults_and_overrides():
    policy, spin = _config_in_fresh_process()
    assert spin == str(_threads.SPIN_COUNT) and policy == f"goinfer: GOMP_SPINCOUNT={spin}"
    policy, spin = _config_in_fresh_process(GOMP_SPINCOUNT="7")
    assert spin == "7" and policy == "user: GOMP_SPINCOUNT=7"
    policy, spin = _config_in_fresh_process(OMP_WAIT_POLICY="active")
    assert spin is None and policy == "user: OMP_WAIT_POLICY=active"
    policy, spin = _config_in_fresh_process(GOINFER_WAIT_POLICY="libgomp")
    assert spin is None and policy.startswith("libgomp default")


def test_threads_resolution(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert _threads.default_threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "junk")
    assert _threads.default_threads() >= 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(_threads, "_physical_cores", lambda: 8)
    monkeypatch.setattr(_threads, "_cgroup_cpu_limit", lambda: 3)
    assert _threads.default_threads() == 3
    assert _threads.resolve_threads(5) == 5
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError):
            _threads.resolve_threads(bad)


def test_threads_override_per_model(tiny):
    m = goinfer.Model.load(str(tiny("llama")[1]), threads=1, progress=False)
    assert m.threads == 1


def test_cli_run_chat_bench(tiny, capsys, tmp_path):
    path = str(tiny("llama")[1])
    assert main(["run", path, "hello", "--max-tokens", "4", "--threads", "1"]) == 0
    out = capsys.readouterr()
    assert "prefill" in out.err and "decode" in out.err
    assert main(["chat", path, "--prompt", "hi", "--system", "be brief", "--max-tokens", "3"]) == 0
    assert "finish" in capsys.readouterr().err
    js = tmp_path / "b.json"
    assert (
        main(
            [
                "bench",
                path,
                "--prompt-lengths",
                "16,32",
                "--decode-prompts",
                "8",
                "--decode-tokens",
                "4",
                "--repeats",
                "1",
                "--json",
                str(js),
            ]
        )
        == 0
    )
    res = json.loads(js.read_text())
    assert [r["prompt_tokens"] for r in res["prefill"]] == [16, 32] and res["decode"][0][
        "tok_s"
    ] > 0
    pj = tmp_path / "p.json"
    assert (
        main(["profile", path, "--prompt-tokens", "40", "--decode-tokens", "2", "--json", str(pj)])
        == 0
    )
    assert "| prefill |" in capsys.readouterr().out
    prof = json.loads(pj.read_text())
    for ph in ("prefill", "decode"):  # the attention kernels' time split into its phases
        split = prof[ph]["attention_phases"]
        kernels = prof[ph]["kernels"]
        wall = sum(kernels[k]["seconds"] for k in ("attention", "attention_fast") if k in kernels)
        assert abs(sum(p["seconds"] for p in split.values()) - wall) <= 1e-9 + 1e-6 * wall
        assert split["qk"]["seconds"] > 0 and split["av"]["seconds"] > 0


def test_cli_run_prints_session_generate(tiny, capsys):
    """`goinfer run` prints exactly the text Session.generate returns for the same prompt and
    sampling flags (greedy, and seeded sampling with top-k / top-p / min-p / repeat penalty)."""
    path = str(tiny("llama")[1])
    m = goinfer.Model.load(path, threads=1, progress=False)
    cases = [
        ([], {}),
        (
            [
                "--temperature",
                "0.9",
                "--seed",
                "5",
                "--top-k",
                "40",
                "--top-p",
                "0.9",
                "--min-p",
                "0.02",
                "--repeat-penalty",
                "1.3",
            ],
            dict(temperature=0.9, seed=5, top_k=40, top_p=0.9, min_p=0.02, repeat_penalty=1.3),
        ),
    ]
    for flags, kw in cases:
        assert main(["run", path, "ab cd ef", "--max-tokens", "24", "--threads", "1", *flags]) == 0
        ref = m.session().generate("ab cd ef", max_tokens=24, **kw)
        assert capsys.readouterr().out == ref.text + "\n" and ref.completion_tokens > 0


def test_cli_draft_gives_the_same_text(tiny, capsys):
    """--draft prompt_lookup: the same output as without, and the drafts are reported."""
    path = str(tiny("llama")[1])
    args = [
        "run",
        path,
        "ab ab ab ab ab ab ab",
        "--max-tokens",
        "48",
        "--threads",
        "1",
        "--temperature",
        "0",
    ]
    assert main(args) == 0
    plain = capsys.readouterr()
    assert main(args + ["--draft", "prompt_lookup", "--draft-tokens", "4"]) == 0
    spec = capsys.readouterr()
    assert spec.out == plain.out and plain.out
    assert "drafts:" in spec.err and "drafts:" not in plain.err


def test_exact_flag_and_its_old_name():
    from goinfer.cli import build_parser
    from goinfer.server.cli import add_arguments

    for cmd in ("run", "chat", "bench", "profile", "perplexity"):
        extra = ["f.txt"] if cmd == "perplexity" else (["hi"] if cmd == "run" else [])
        for flag in ("--exact", "--exact-prefill"):
            assert build_parser().parse_args([cmd, "m", *extra, flag]).exact is True
        assert build_parser().parse_args([cmd, "m", *extra]).exact is False
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args(["m", "--exact-prefill"]).exact and not p.parse_args(["m"]).exact


def test_cli_reports_typed_errors(tmp_path, capsys):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf at all")
    assert main(["run", str(bad), "x"]) == 2
    assert "error" in capsys.readouterr().err
    assert main(["run", "no-such-model-name", "x"]) == 2


def test_unknown_architecture_and_corrupt_file(tmp_path, tiny):
    p = tmp_path / "weird.gguf"
    w = gguf.GGUFWriter(str(p), "weirdnet")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedArchitectureError, match="weirdnet"):
        goinfer.Model.load(str(p), progress=False)
    data = open(tiny("llama")[1], "rb").read()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFormatError):
        goinfer.Model.load(str(cut), progress=False)
