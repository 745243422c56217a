"""benchmarks/codex.py --smoke: the real Codex CLI against goinfer on the tiny model (Codex with a
short prompt), two turns of one session (`codex exec`, `codex exec resume --last`), and what the
JSON it writes holds: both turns exited 0, every request a 200 whose stream announced its item
before its deltas and ended with response.completed, the resumed turn's prompt read from the
prefix cache (all but the reply's last token, in whole blocks), the cold replays read nothing.
check_codex is the check test_benchmarks.py applies to the script's smoke run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import goinfer

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
BLOCK = 16  # the KV cache's default block size


def check_codex(res: dict) -> None:
    assert res["codex"].startswith("codex-cli ") and [t["exit"] for t in res["turns"]] == [0, 0]
    rows = [r for t in res["turns"] for r in t["requests"]]
    assert len(rows) >= 2
    for r in rows:
        assert r["http_status"] == 200 and r["status"] == "completed" and r["output"]
        ev = r["events"]
        # what Codex needs: the item announced before its deltas, each item done, completed
        assert ev[:2] == ["response.created", "response.in_progress"]
        assert ev.index("response.output_item.added") < ev.index("response.output_text.delta")
        assert ev.count("response.output_item.done") == len(r["output"])
        assert ev[-1] == "response.completed"
        assert r["cold"]["http_status"] == 200 and r["cold"]["cached_tokens"] == 0
        assert r["cold"]["prompt_tokens"] == r["prompt_tokens"] and r["ttft_s"] > 0
    first, resumed = rows[0], rows[-1]
    assert first["cached_tokens"] == 0
    # the resumed prompt holds the first one whole: at least its whole blocks came from cache
    assert resumed["prompt_tokens"] > first["prompt_tokens"]
    assert resumed["cached_tokens"] >= first["prompt_tokens"] // BLOCK * BLOCK
    assert res["summary"]["cached_fraction"][-1] == round(resumed["cached_fraction"], 4)


def test_codex_benchmark_smoke(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    out_json = tmp_path / "out.json"
    # the goinfer this test imports (PYTHONPATH may be relative to tests/)
    env = dict(os.environ, PYTHONPATH=str(Path(goinfer.__file__).resolve().parent.parent))
    out = subprocess.run([sys.executable, str(BENCH / "codex.py"), "--smoke", "--json",
                          str(out_json)], cwd=work, capture_output=True, text=True, timeout=900,
                         env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "| 2 | 1 | 200 | completed |" in out.stdout
    assert sorted(work.iterdir()) == []
    check_codex(json.loads(out_json.read_text()))
