"""The examples run top to bottom: the quick-start script and the notebook."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.slow
def test_quickstart_script(smollm2_path):
    r = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), str(smollm2_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "prefill" in r.stdout and "from cache" in r.stdout


@pytest.mark.slow
def test_notebook_runs(smollm2_path, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(EXAMPLES / "goinfer.ipynb", as_version=4)
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert len(text.strip()) > 0


def _agent_checks(out: str) -> None:
    """Three user turns, each with a tool call and an answer; later steps reuse the cache."""
    assert out.count("tool call: ") >= 3, out
    assert out.count("assistant: ") == 3, out
    cached = [
        int(line.split(", ")[1].split()[0]) for line in out.splitlines() if "from cache]" in line
    ]
    assert len(cached) == 6 and all(c > 0 for c in cached[1:]), out


@pytest.mark.slow
def test_agent_example_with_the_library(smollm2_path):
    r = subprocess.run(
        [sys.executable, str(EXAMPLES / "agent.py"), str(smollm2_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    _agent_checks(r.stdout)


@pytest.mark.slow
def test_agent_example_against_a_server(smollm2_path):
    from test_server import Server

    from goinfer import KVCache, Model

    m = Model.load(str(smollm2_path), threads=1, progress=False)
    with Server(m, KVCache(m, max_tokens=4096)) as s:
        r = subprocess.run(
            [sys.executable, str(EXAMPLES / "agent.py"), "--server", s.url + "/v1"],
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert r.returncode == 0, r.stderr[-3000:]
    _agent_checks(r.stdout)
