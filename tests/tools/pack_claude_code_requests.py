"""Pack recorded Claude Code requests into tests/data/claude_code_requests.json.xz.

    python tests/tools/pack_claude_code_requests.py CAPTURE_DIR

CAPTURE_DIR holds one directory per run (RUN/NNN-req.json: a logging server's record of one
request: method, path, headers, body).  The runs below were recorded from Claude Code 2.1.332
(the `claude` of claude-agent-sdk 0.2.189) against such a server, each in a fresh HOME, with
CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1; the server's replies were scripted (text, tool
calls, a thinking block), so the runs follow a known course.  Kept per request: its run, its
number, the body, and the session, agent, beta and user-agent headers.  The working and home
directories of the runs (under a temporary directory) are renamed to /home/user/cc_*.
"""

from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "data" / "claude_code_requests.json.xz"
# run -> the request numbers kept (None: all); what each run did:
RUNS = {
    "cc_text": None,  # claude -p "say hi", then -p --continue twice (text replies)
    "cc_tool": None,  # a Read and a Bash tool call, then text; a --continue turn
    "cc_sdk_ts": None,  # claude_agent_sdk.query(): ToolSearch loads a deferred MCP tool
    "cc_date": None,  # turns 2-3 a day later: a "the date has changed" system message
    "cc_xsess": ["001", "002"],  # two new sessions in one directory, other prompts
    "cc_inter": ["001", "002"],  # the interactive TUI (AskUserQuestion's schema)
    "cc_sub": None,  # an Explore subagent's requests between the main agent's
    "cc_think_sig": None,  # a reply with a thinking block and its signature, sent back
    "cc_websearch": None,  # ToolSearch loading WebSearch, WebFetch, NotebookEdit
}
HEADERS = ("x-claude-code-session-id", "x-claude-code-agent-id", "anthropic-beta", "user-agent")


def main(root: Path) -> None:
    out = []
    for run, keep in RUNS.items():
        for f in sorted((root / run).glob("[0-9][0-9][0-9]-req.json")):
            n = f.name[:3]
            r = json.loads(f.read_text())
            if (keep and n not in keep) or r["path"].rstrip("/") != "/v1/messages":
                continue
            headers = {k: v for k, v in r["headers"].items() if k in HEADERS}
            out.append({"run": run, "n": n, "headers": headers, "body": r["body"]})
    text = json.dumps(out, ensure_ascii=False).replace("/tmp/cc_", "/home/user/cc_")
    OUT.write_bytes(lzma.compress(text.encode(), preset=9 | lzma.PRESET_EXTREME))
    print(f"{len(out)} requests, {len(text)} bytes of JSON -> {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
