"""Each engine alone in its own process: a benchmark script runs itself as a child
(`python SCRIPT --child`), hands it a JSON spec on stdin, and reads the child's results from
the last line of its stdout.  Only one engine's process exists at a time, so neither engine's
weights, threads or caches disturb the other's timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_child(
    script: str | Path, spec: dict, timeout: float = 7200, env: dict | None = None
) -> dict:
    """Run `python script --child` with spec as JSON on stdin -> the JSON its last line prints."""
    out = subprocess.run(
        [sys.executable, str(script), "--child"],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"{Path(script).name} child ({spec.get('engine')}) failed with exit "
            f"code {out.returncode}:\n{out.stderr[-4000:]}"
        )
    lines = out.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(
            f"{Path(script).name} child ({spec.get('engine')}) printed nothing:\n"
            f"{out.stderr[-4000:]}"
        )
    return json.loads(lines[-1])


def child_spec() -> dict:
    """In the child: the spec the parent sent."""
    return json.loads(sys.stdin.read())


def child_reply(res: dict) -> None:
    """In the child: hand res (with the child's process id) to the parent (one JSON line, the
    last of stdout)."""
    print(json.dumps({**res, "pid": os.getpid()}), flush=True)
