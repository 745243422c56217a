"""The examples run top to bottom: the quick-start script and the notebook."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.slow
def test_quickstart_script(smollm2_path):
    r = subprocess.run([sys.executable, str(EXAMPLES / "quickstart.py"), str(smollm2_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "prefill" in r.stdout and "from cache" in r.stdout


@pytest.mark.slow
def test_notebook_runs(smollm2_path, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(EXAMPLES / "goinfer.ipynb", as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert len(text.strip()) > 0
