"""Smoke runs of benchmark scripts (tiny shapes / a tiny model): they run end to end, print
their table and check what they claim (speed is measured by the lead, never asserted here)."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _script(name):
    """benchmarks/<name>.py imported as a module (in this process: the goinfer the tests use)"""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny_path(tiny):
    return str(tiny("llama", 3, max_position_embeddings=4096)[1])


def test_kernels_attention_decode_smoke(capsys):
    _script("kernels_attention").main(["--decode", "--lengths", "600", "--shapes", "4x2x64x2",
                                       "--threads", "1", "2", "--reps", "1"])
    out = capsys.readouterr().out
    for dt in ("f32", "f16", "q8_0"):
        assert re.search(rf"^4x2x64x2\s+600\s+{dt}\s+2\s+[\d.]+\s+[\d.]+\s+[\d.]+", out, re.M), out


def test_speculative_smoke(tiny_path, capsys):
    """goinfer with and without drafting on the copy task: the same text, drafts made."""
    res = _script("speculative").main([tiny_path, "--smoke", "--threads", "1"])
    row = res["tasks"][0]
    assert row["goinfer_identical"] and row["goinfer + draft"]["tokens"] > 0
    out = capsys.readouterr().out
    assert "speed-up goinfer" in out and "llama.cpp: skipped" in out


@pytest.mark.parametrize("transcript", ["default", "long"])
def test_agent_loop_smoke(tiny_path, transcript, capsys):
    res = _script("agent_loop").main([tiny_path, "--smoke", "--threads", "1",
                                      "--transcript", transcript])
    g = res["engines"]["goinfer (reuse)"]
    assert len(g) == 2 and g[1]["cached_tokens"] > 0  # the second turn reused the first
    assert res["save_load"]["cached_after_load"] > 0
    out = capsys.readouterr().out
    assert "TTFT" in out and "llama.cpp: skipped" in out
