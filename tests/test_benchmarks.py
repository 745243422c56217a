"""Every script in benchmarks/ runs: its --smoke mode (the tiny shape of benchmarks/shapes.py,
one short iteration) in a fresh process.  Scripts that compare with llama.cpp must still run
their goinfer side without llama-cpp-python and say the peer was skipped."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py"))
# scripts with a llama.cpp side: without llama-cpp-python they must say it was skipped
PEERS = {"agent_loop.py", "agreement.py", "memory.py", "peers.py", "perplexity_llamacpp.py"}
HAVE_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None


def test_every_script_is_covered():
    """A new benchmark script is run here automatically; this pins that the list is not empty
    and that each script offers --smoke."""
    assert len(SCRIPTS) >= 15
    for name in SCRIPTS:
        assert "--smoke" in (BENCH / name).read_text(), f"{name} has no --smoke mode"


@pytest.mark.parametrize("name", SCRIPTS)
def test_smoke(name, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               GOINFER_LAYOUT_DIR=str(tmp_path / "layouts"))
    out = subprocess.run([sys.executable, str(BENCH / name), "--smoke"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{name} --smoke failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    assert out.stdout.strip(), f"{name} --smoke printed nothing"
    if name in PEERS and not HAVE_LLAMA_CPP:
        assert "skipped" in out.stdout, f"{name} did not say that llama.cpp was skipped"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "layouts") == [], \
        f"{name} --smoke left files in the working directory"
