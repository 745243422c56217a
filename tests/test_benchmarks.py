"""Smoke runs of benchmark scripts (tiny shapes): they run and print their table."""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_kernels_attention_decode_smoke(capsys):
    import kernels_attention

    kernels_attention.main(["--decode", "--lengths", "600", "--shapes", "4x2x64x2",
                            "--threads", "1", "2", "--reps", "1"])
    out = capsys.readouterr().out
    for dt in ("f32", "f16", "q8_0"):
        assert re.search(rf"^4x2x64x2\s+600\s+{dt}\s+2\s+[\d.]+\s+[\d.]+\s+[\d.]+", out, re.M), out
