"""Every script in benchmarks/ runs: its --smoke mode (the tiny shape of benchmarks/shapes.py,
one short iteration) in a fresh process, started as `python benchmarks/x.py --smoke --json F`,
and what it wrote to F is checked: finite positive rates, the expected rows, and the counters
that show it timed what it claims to (graph replays, fast-attention queries, the layout a load
mapped, cold prefills with nothing cached, drafts made, each engine in its own process...).
Scripts that compare with llama.cpp must still run their goinfer side without llama-cpp-python
and say the peer was skipped; with it installed they must run its side too
(GOINFER_REQUIRE_PEER=1, `make bench-peers-smoke`, fails when it is not installed).

goinfer must be the one the environment provides (the installed package in CI, whose source
tree has no compiled .so; PYTHONPATH's in development), never the source tree put on sys.path by
the script: each run sees goinfer only through a link in a fresh directory, and an import hook
(sitecustomize, inherited by the script's child processes) fails any import of goinfer that
would come from elsewhere."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import goinfer

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
HELPERS = {"regime.py", "isolate.py", "report.py"}  # modules the scripts share, not benchmarks
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name not in HELPERS)
# scripts with a llama.cpp side: without llama-cpp-python they must say it was skipped
PEERS = {
    "agent_loop.py",
    "agreement.py",
    "memory.py",
    "peers.py",
    "perplexity_llamacpp.py",
    "shapes.py",
    "speculative.py",
    "claude_code.py",
    "codex.py",
}
HAVE_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
REQUIRE_PEER = os.environ.get("GOINFER_REQUIRE_PEER") == "1"
if str(BENCH) not in sys.path:  # the scripts import their helpers (regime, isolate, shapes)
    sys.path.insert(0, str(BENCH))

GUARD = '''\
import importlib.machinery, os, sys
_SITE = os.environ["GOINFER_TEST_SITE"]


class _OnlyThisGoinfer:
    """fails an import of goinfer that sys.path would resolve outside GOINFER_TEST_SITE"""

    def find_spec(self, name, path=None, target=None):
        if name != "goinfer":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, sys.path)
        origin = getattr(spec, "origin", None) or ""
        if not origin.startswith(_SITE + os.sep):
            raise ImportError(f"goinfer would be imported from {origin}, not the environment's "
                              f"package (sys.path: {sys.path})")
        return None


sys.meta_path.insert(0, _OnlyThisGoinfer())
'''


def _env(tmp_path: Path) -> dict:
    """PYTHONPATH: a directory holding only a link to the goinfer package this test imports,
    and the import guard; inherited entries that hold a goinfer package are dropped."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "goinfer").symlink_to(Path(goinfer.__file__).resolve().parent)
    (site / "sitecustomize.py").write_text(GUARD)
    keep = [
        p
        for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if p and not (Path(p) / "goinfer").is_dir()
    ]
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(site)] + keep),
        OMP_NUM_THREADS="1",
        GOINFER_TEST_SITE=str(site),
        GOINFER_LAYOUT_DIR=str(tmp_path / "layouts"),
    )


def test_guard_catches_the_source_tree(tmp_path):
    """The guard fails a script that puts the repository root on sys.path before importing
    goinfer (what CI's non-editable install cannot survive)."""
    work = tmp_path / "work"
    work.mkdir()
    env = _env(tmp_path)
    good = tmp_path / "good.py"
    good.write_text("import goinfer\nprint(goinfer.__file__)\n")
    out = subprocess.run(
        [sys.executable, str(good)], cwd=work, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(str(tmp_path / "site")), out.stdout
    bad = tmp_path / "bad.py"
    bad.write_text(f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nimport goinfer\n")
    out = subprocess.run(
        [sys.executable, str(bad)], cwd=work, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode != 0 and "not the environment's package" in out.stderr, out.stderr


def test_no_benchmark_reaches_into_tests_or_tools():
    """Benchmarks build what they need (benchmarks/shapes.py) or run a tool as its command
    line; none puts tests/ or tools/ on sys.path."""
    for path in sorted(BENCH.glob("*.py")):
        text, name = path.read_text(), path.name
        assert "sys.path.insert" not in text and "sys.path.append" not in text, name


# ============================================================================ what each smoke run checks


def _pos(x) -> bool:
    """a finite positive number"""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _peer_ran(res: dict) -> bool:
    """the llama.cpp side was installed (and so must have run)"""
    return bool(res["regime"]["peer"] and res["regime"]["peer"]["installed"])


def _alone(res: dict) -> None:
    """every engine run was a process of its own, none the parent"""
    procs = dict(res["processes"])
    parent = procs.pop("parent")
    pids = [p for v in procs.values() for p in v]
    assert pids and parent not in pids and len(set(pids)) == len(pids), res["processes"]


def check_agent_loop(res):
    g, c = res["engines"]["goinfer (reuse)"], res["engines"]["goinfer (cold)"]
    assert len(g) == len(c) == res["turns"] == 2
    assert g[0]["cached_tokens"] == 0 and g[1]["cached_tokens"] > 0  # turn 2 reused turn 1
    assert all(r["cached_tokens"] == 0 for r in c)  # cold: nothing reused, ever
    assert all(_pos(r["ttft_s"]) for e in res["engines"].values() for r in e)
    sl = res["save_load"]
    assert sl["cached_after_load"] > 0 and sl["cached_cold"] == 0 and _pos(sl["cold_prefill_s"])
    _alone(res)
    if _peer_ran(res):
        assert res["engines"]["llama.cpp (live Llama)"][1]["cached_tokens"] > 0


def check_agreement(res):
    g = res["goinfer"]
    assert res["positions"] >= 40 and 0 <= g["top1_agreement_with_transformers"] <= 1
    assert g["mean_logit_cosine"] > 0.99  # Q8_0 weights against transformers' float32 of them
    if _peer_ran(res):
        assert res["llama.cpp"]["mean_logit_cosine"] > 0.99 and "goinfer_vs_llama.cpp_top1" in res


def check_builds(res):
    # the smoke run measures this goinfer against itself: both sides ran, on both decode paths
    assert set(res["builds"]) == {"A", "B"}
    for side in ("A", "B"):
        for graph in (1, 0):
            assert _pos(res["medians"][f"{side}/graph={graph} ms/token"])
    assert res["variant"] == goinfer.config()["kernel_variant"]


def check_constrained(res):
    assert set(res["median_tok_s"]) == {"plain", "schema", "schema-sync"}
    assert all(_pos(v) for v in res["median_tok_s"].values())
    assert all(n == res["tokens"] for n in res["tokens_decoded"].values())
    assert res["schema_output_start"].lstrip().startswith("{") and _pos(res["mask_ms_per_token"])


def check_decode_fixed_cost(res):
    (r,) = res["rows"]
    assert _pos(r["python_ms_per_token"]) and _pos(r["graph_ms_per_token"])
    assert r["graph_replays"] >= res["tokens"] * res["reps"]  # the graph ran every timed step
    assert r["python_path_has_graph"] is False


def check_decode_prefetch(res):
    """each setting decoded its own bursts, under the distances it names, timed per kernel"""
    rows = res["rows"]
    assert [r["setting"] for r in rows] == ["default", "0", "q4_0=8/streams=2/far=0/warm=0"]
    from goinfer._kernels import _config
    from goinfer.quant import INT_KINDS

    assert all(set(r["distances"]) == set(INT_KINDS) for r in rows)
    if res["variant"] == "portable":  # its plain-C GEMV issues no prefetches
        assert all(set(r["distances"].values()) == {0} for r in rows)
    else:
        assert rows[0]["distances"] == _config.gemv_prefetch()
        assert set(rows[1]["distances"].values()) == {0}
        assert rows[2]["distances"] == {**rows[0]["distances"], "q4_0": 8}
        assert (
            rows[0]["streams"] == _config.gemv_streams()
            and rows[1]["streams"] == rows[0]["streams"]
        )
        assert rows[0]["far"] == _config.gemv_prefetch_far() and rows[1]["far"] == rows[0]["far"]
        assert (rows[2]["streams"], rows[2]["far"]) == (2, 0)
    assert rows[0]["warm_kb"] == rows[1]["warm_kb"] == _config.gemv_warm() > 0
    assert rows[2]["warm_kb"] == 0
    assert res["decoded_tokens"] == res["rounds"] * res["steps"] * len(rows)
    assert rows[0]["speed_vs_first"] == 1.0 and rows[0]["rounds_faster_than_first"] == 0
    for r in rows:
        assert len(r["round_ms"]) == res["rounds"] and all(_pos(t) for t in r["round_ms"])
        assert _pos(r["ms_per_token"]) and _pos(r["tok_s"]) and _pos(r["speed_vs_first"])
        # the same steps per setting: the same kernel calls, matmuls among them
        assert r["kernel_calls"] == rows[0]["kernel_calls"] and r["kernel_calls"]["matmul"] > 0
        assert _pos(r["family_ms_per_token"]["matmul"])


def check_float_copy(res):
    assert [c["values"] for c in res["copies"]] == ["original", "native"]
    for c in res["copies"]:
        assert c["tensor_types"] == ["F32"] and c["logit_cosine_with_source"] > 0.99


def check_kernels_attention(res):
    kinds = [(r["table"], r.get("kv_dtype")) for r in res["rows"]]
    assert kinds == [
        ("prefill", "f32"),
        ("decode", "f32"),
        ("decode", "f16"),
        ("decode", "q8_0"),
        ("exact", None),
        ("exact", None),
    ]
    for r in res["rows"]:
        assert all(_pos(r[k]) for k in r if k.endswith("_ms")), r
    _check_fma_share(res)


def _check_fma_share(res):
    """decode rows: the graph's share of the float32 FMA peak measured on its threads (none on
    portable, whose probe states no peak); well above 1 would mean miscounted operations or a
    probe slower than the kernels (the softmax's work is not counted, so a real share is lower);
    f16 rows also against the f16 mix's rate (kernels_matmul.f16_fma_peak)"""
    portable = res["regime"]["goinfer"]["kernel_variant"] == "portable"
    for r in res["rows"]:
        if r["table"] != "decode":
            continue
        if portable:
            assert r["fma_peak_GFLOPs"] == 0.0 and r["graph_fma_share"] is None, r
            assert r["f16_fma_peak_GFLOPs"] in (None, 0.0) and r["graph_f16_floor_share"] is None
        else:
            assert _pos(r["fma_peak_GFLOPs"]) and 0.0 < r["graph_fma_share"] < 1.25, r
            if r["kv_dtype"] != "f16":
                assert r["f16_fma_peak_GFLOPs"] is None and r["graph_f16_floor_share"] is None
                continue
            # the f16 mix: the FMA loop with conversions on top, so not above the FMA peak
            # (a conversion off the FMA ports may cost nothing; 1.5 for two probes timed apart
            # on a busy machine: well above would mean miscounted operations)
            assert _pos(r["f16_fma_peak_GFLOPs"]) and 0.0 < r["graph_f16_floor_share"] < 1.25, r
            assert r["f16_fma_peak_GFLOPs"] < 1.5 * r["fma_peak_GFLOPs"], r


def check_kernels_matmul(res):
    got = {(r["kind"], r["M"]) for r in res["rows"]}
    assert got == {(k, m) for k in ("q4_0", "q8_0", "q6_k", "q4_k") for m in (1, 16)}
    assert all(_pos(r["us"]) and _pos(r["GOPs"]) for r in res["rows"])
    assert all(_pos(r["cold_GBs"]) for r in res["rows"] if r["M"] == 1)
    # the GEMM rows' peak: the int8 peak measured on the threads used (none on portable)
    simd = res["regime"]["goinfer"]["kernel_variant"] != "portable"
    assert set(res["peak_GOPs"]) == {"1"} and (res["peak_GOPs"]["1"] > 0) == simd
    for r in (r for r in res["rows"] if r["M"] > 1):
        assert r["peak_GOPs"] == res["peak_GOPs"][str(r["threads_used"])]
    assert len(res["quantize_act"]) == 3 and all(_pos(q["GBs"]) for q in res["quantize_act"])
    # --peaks (2 rounds in the smoke run): the f16 mix converts on top of the FMA loop, so it
    # is not above the FMA peak (1.5 for probes timed apart, as _check_fma_share); none on
    # portable
    (fp,) = res["float_peaks"]
    assert fp["threads"] == 1 and fp["rounds"] == 2
    if simd:
        assert _pos(fp["fma_GFLOPs"]) and _pos(fp["f16_mix_GFLOPs"])
        assert 0.0 < fp["mix_over_fma"] < 1.5
    else:
        assert fp["fma_GFLOPs"] == fp["f16_mix_GFLOPs"] == 0.0 and fp["mix_over_fma"] is None
    # the prefetch sweep (2 rounds of q4_0 at 0 and 16 groups): every setting timed each round
    # beside two bandwidth samples, at the distance the kernels read (the portable GEMV: none)
    sw = res["prefetch_sweep"]
    assert sw["threads"] == 1 and len(sw["rounds"]) == 2
    for r in sw["rounds"]:
        assert len(r["bandwidth_GBs"]) == 2 and all(_pos(b) for b in r["bandwidth_GBs"])
        got = {k: v["groups"] for k, v in r["gemv"].items()}
        n = 16 if simd else 0
        assert got == {"attn k/v 576->192 q4_0 @ 0": 0, "attn k/v 576->192 q4_0 @ 16": n}
        assert all(_pos(v["GBs"]) for v in r["gemv"].values())
    m = sw["medians"]
    assert m["all"]["rounds"] == 2 and m["upper"]["rounds"] + m["lower"]["rounds"] <= 2
    assert all(_pos(v) for v in m["all"]["GBs"].values())


def check_kernels_ssm(res):
    from goinfer._kernels import _config

    assert [r["variant"] for r in res["rows"]] == list(_config.supported_variants())
    assert all(_pos(r["gated_delta_ms"][0]) and _pos(r["ssm_conv_ms"][0]) for r in res["rows"])


def check_limits(res):
    """A read bandwidth, one decode row and one prefill row with finite positive rates, and
    bytes per token: what goinfer's decode reads equals the file's own bytes of those tensors,
    Q4_0 as it is (gguf-py's count in test_limits_bytes_equal_the_files)."""
    assert _pos(res["bandwidth"]["one_core"]["GBs"]) and _pos(res["bandwidth"]["threads"]["GBs"])
    assert res["model"]["tensor_bytes"]["Q4_0"] > 0
    (d,) = res["decode"]
    assert d["context"] == 64 and _pos(d["tok_s"]) and _pos(d["fraction_of_bandwidth"])
    b = d["bytes_per_token"]
    assert b["kv"] > 0 and b["weights"] > 0 and b["total"] == b["weights"] + b["kv"]
    assert d["GBs"] == pytest.approx(b["total"] * d["tok_s"] / 1e9)
    around = d["bandwidth_around_GBs"]  # swept just before and after the row: their mean
    assert len(around) == 2 and all(_pos(x) for x in around)
    assert d["fraction_of_bandwidth"] == pytest.approx(d["GBs"] / (sum(around) / 2))
    # the weights are mapped from the layout cache: those pages' bandwidth too
    assert res["weight_pages"]["pages"] in ("huge", "small"), res["weight_pages"]
    assert _pos(d["weight_pages_GBs"])
    assert d["fraction_of_weight_pages"] == pytest.approx(d["GBs"] / d["weight_pages_GBs"])
    (p,) = res["prefill"]
    assert p["tokens"] == 64 and _pos(p["tok_s"]) and _pos(p["int8_GOPs"])
    assert 0 < p["matmul_share"] <= 1
    simd = res["regime"]["goinfer"]["kernel_variant"] != "portable"
    assert p["peak_measured"] and (p["peak_GOPs"] > 0) == simd
    (t,) = res["bytes_per_token"]
    assert t["goinfer_bytes"] == b["weights"] == t["file_bytes"], t
    assert t["file_by_type"] == {"Q4_0": t["file_bytes"]} and t["goinfer_over_file"] == 1.0
    _check_pages(res["weight_pages"])


PAGES = ("huge", "copied", "small", "process")


def check_weight_pages(res):
    """One map and one copy run, each its own process, both from the layout cache: the map run
    on the file's own pages (a tiny layout: 4 KB ones), the copy run on the copy."""
    (m,), (c,) = res["runs"]["map"], res["runs"]["copy"]
    assert m["pages"] == "small" and m["huge_share"] == 0.0, m
    assert c["pages"] == "copied" and c["huge_share"] is not None, c
    for r in (m, c):
        assert r["load_source"] == "layout" and _pos(r["tok_s"]) and _pos(r["load_s"])
        assert _pos(r["bandwidth_GBs"]) and len(r["runs_s_per_token"]) == 1
        _check_pages(r)
    assert res["copy_over_map"] == pytest.approx(c["tok_s"] / m["tok_s"])
    assert res["round_ratios"] == [pytest.approx(c["tok_s"] / m["tok_s"])]
    assert res["round_ratio_median"] == pytest.approx(res["copy_over_map"])
    assert len({m["pid"], c["pid"], os.getpid()}) == 3


def _check_pages(p):
    """How a run's weights were backed (goinfer.bench.weight_pages)."""
    assert p["pages"] in PAGES, p
    assert p["huge_share"] is None or 0.0 <= p["huge_share"] <= 1.0, p


def _file_decode_bytes(path) -> int:
    """gguf-py's count of the file's bytes a decode step reads (every tensor of 2 or more
    dimensions; of the token embedding one row, the whole table when there is no output)."""
    from gguf import GGUFReader

    ts = {t.name: t for t in GGUFReader(path).tensors}
    tied = "output.weight" not in ts
    n = 0
    for name, t in ts.items():
        if len(t.shape) >= 2:  # GGUF order: (n_in, n_out[, experts]); token_embd (d, vocab)
            b = int(t.n_bytes)
            n += b if name != "token_embd.weight" or tied else b // int(t.shape[-1])
    return n


def test_limits_bytes_equal_the_files(tiny, tmp_path, capsys):
    """limits.py --bytes on files of several types (no timing): goinfer's decode reads exactly
    the file's bytes of those tensors, counted independently by gguf-py."""
    import gguf
    import limits

    from fixtures import tinymodels

    files = []
    T = gguf.GGMLQuantizationType
    for qt in (T.Q4_0, T.Q8_0, T.Q5_0, T.Q5_1):
        model, _ = tiny("llama", 0)
        files.append(
            str(tinymodels.write_gguf(model, "llama", tmp_path / f"{qt.name}.gguf", qtype=qt))
        )
    res = limits.main(["--bytes", *files, "--threads", "1"])
    assert [r["file"] for r in res["bytes_per_token"]] == [
        "Q4_0.gguf",
        "Q8_0.gguf",
        "Q5_0.gguf",
        "Q5_1.gguf",
    ]
    for f, r in zip(files, res["bytes_per_token"]):
        assert r["file_bytes"] == _file_decode_bytes(f) and r["goinfer_bytes"] == r["file_bytes"], r
    assert "decode" not in res and "bandwidth" not in res
    out = capsys.readouterr().out
    assert "Q4_0.gguf" in out and "Q8_0.gguf" in out


def test_concurrent_read_bandwidth_counts_only_the_overlap():
    """limits.concurrent_rates: the processes' bytes over the span from the first start to the
    last end, so processes that happened to read one after the other count once, not twice."""
    import limits

    n = [10, 10]
    assert limits.concurrent_rates([[(0.0, 1.0)], [(0.0, 1.0)]], n) == [20.0]  # at once
    assert limits.concurrent_rates([[(0.0, 1.0)], [(1.0, 2.0)]], n) == [10.0]  # in turn
    assert limits.concurrent_rates([[(0.0, 1.0), (5.0, 6.0)], [(0.5, 1.5), (5.0, 5.5)]], n) == [
        pytest.approx(20 / 1.5),
        20.0,
    ]
    assert limits.concurrent_rates([[(0.0, 1.0)], [(0.0, 2.0)]], [10, 30]) == [20.0]  # shares


def test_read_bandwidth_processes_read_at_once():
    """Two sweeping processes started at a barrier.  Each rep's span covers both processes'
    sweeps, so the rate of the pair can never exceed twice the slower one's own rate (a sum of
    rates, as of processes that read in turn, can); reported with how it was synchronized."""
    import limits

    r = limits.read_bandwidth(2, 4 << 20, 5)
    assert r["processes"] == 2 and len(r["per_process_GBs"]) == 2 and r["reps"] == 5
    assert _pos(r["GBs"]) and "barrier" in r["sync"]
    assert r["GBs"] <= 2 * min(r["per_process_GBs"]) * (1 + 1e-9)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 5000)), min_size=1, max_size=6),
    n=st.integers(1, 4),
)
@example(sizes=[(0, 1600)], n=2)  # one range, cut at a 64-byte boundary
@example(sizes=[(0, 10)], n=3)  # fewer bytes than 64 per share: all in the last
def test_shares_cut_the_ranges_in_order(sizes, n):
    """limits.shares: the n shares, laid end to end, are the ranges themselves in order; each
    cut falls on a 64-byte boundary of the ranges laid end to end; the shares differ by less
    than 64 bytes plus the rounding of total / n."""
    import limits

    pieces, pos = [], 0
    for gap, size in sizes:  # disjoint [lo, hi) ranges in order, some empty
        pos += gap
        pieces.append((pos, pos + size))
        pos += size
    out = limits.shares(pieces, n)
    assert len(out) == n
    flat = [r for share in out for r in share]
    assert all(lo < hi for lo, hi in flat)
    # the same bytes in the same order: merged, the pieces again (empty ones dropped)
    merged: list[list[int]] = []
    for lo, hi in flat:
        if merged and merged[-1][1] == lo:
            merged[-1][1] = hi
        else:
            merged.append([lo, hi])
    want: list[list[int]] = []
    for lo, hi in pieces:
        if hi > lo:
            if want and want[-1][1] == lo:
                want[-1][1] = hi
            else:
                want.append([lo, hi])
    assert merged == want
    total = sum(hi - lo for lo, hi in pieces)
    got = [sum(hi - lo for lo, hi in share) for share in out]
    ends = np.cumsum(got)[:-1]
    assert all(e % 64 == 0 for e in ends)
    assert all(e == total * (k + 1) // n // 64 * 64 for k, e in enumerate(ends))


def test_read_bandwidth_of_a_files_pages(tmp_path):
    """read_bandwidth(pages=(path, ranges)): the processes sweep their shares of those ranges
    of the file (its page-cache pages), every byte of them once, with the same barrier."""
    import limits

    f = tmp_path / "w.bin"
    f.write_bytes(np.arange(3 << 20, dtype=np.uint8).tobytes())
    ranges = [(4096, 1 << 20), ((1 << 20) + 8192, 3 << 20)]
    r = limits.read_bandwidth(2, reps=3, pages=(str(f), ranges))
    assert r["pages_of"] == str(f) and r["processes"] == 2 and _pos(r["GBs"])
    assert r["bytes"] == sum((hi - lo) // 4 * 4 for lo, hi in ranges)
    assert r["GBs"] <= 2 * min(r["per_process_GBs"]) * (1 + 1e-9)
    one = limits.read_bandwidth(1, reps=3, pages=(str(f), ranges))
    assert one["processes"] == 1 and one["bytes"] == r["bytes"] and _pos(one["GBs"])
    with pytest.raises(ValueError, match="too few"):
        limits.read_bandwidth(2, pages=(str(f), [(0, 8)]))


def check_memory(res):
    assert res["goinfer_first_load"]["source"] == "built"  # a fresh layout directory
    assert [r["source"] for r in res["runs"]["goinfer"]] == ["layout"]  # then mapped
    for k, v in res["median"].items():
        assert _pos(v["load_s"]) and _pos(v["peak_rss"]) and _pos(v["prefill_tok_s"]), k
    assert "goinfer" in res["runs"]
    assert any(k.startswith("llama.cpp") for k in res["runs"]) == _peer_ran(res)
    if _peer_ran(res):  # the smoke loads llama.cpp's GGUF mapped and read into memory
        assert {r["source"] for k, v in res["runs"].items() if k != "goinfer" for r in v} == {
            "mmap",
            "read",
        }


def check_moe(res):
    pre = {r["mode"]: r for r in res["rows"] if r["what"] == "prefill"}
    assert set(pre) == {"expert-major", "token-by-token", "dense"}
    assert all(_pos(r["tok_s"]) for r in res["rows"])
    dec = {r["mode"]: r["weight_bytes_per_token"] for r in res["rows"] if r["what"] == "decode"}
    # top-2 of 4 copies of the dense FFN: the MoE step reads two FFNs and the routers
    assert dec["MoE (top-2 of 4)"] > dec["dense"] > 0


def check_numerics_fast_vs_exact(res):
    (r,) = res["rows"]
    assert r["fast_queries"] > 0 and r["fast_queries_of_exact"] == 0  # the fast path ran, once
    assert r["cos_last"] > 0.99 and 0 <= r["top1_agreement"] <= 1
    assert len(res["noise_floor"]) == 1 and res["noise_floor"][0]["cos_min"] > 0.99


def check_peers(res):
    (p,), (d,) = res["prefill"], res["decode"]
    assert _pos(p["tok_s"]["goinfer"]) and p["cached_tokens"]["goinfer"] == [0]  # cold prefill
    assert _pos(d["tok_s"]["goinfer"]) and _pos(d["weight_bytes_per_token"])
    assert _pos(d["kv_bytes_per_token"]) and d["GBs"]["goinfer"] > d["weight_GBs"]["goinfer"]
    assert _pos(res["bandwidth"]["GBs"]) and _pos(d["fraction_of_bandwidth"]["goinfer"])
    # sampled before every engine's run and after the last; each run against its two samples
    bw, n_runs = res["bandwidth"], sum(len(v) for v in d["runs_s_per_token"].values())
    assert bw["per_run"] and len(bw["samples_GBs"]) == n_runs + 1
    g = bw["samples_GBs"][:2]
    assert bw["runs_GBs"]["goinfer"][0] == pytest.approx(sum(g) / 2)  # goinfer runs first
    (f0,) = d["runs_fraction_of_bandwidth"]["goinfer"]
    assert f0 == pytest.approx(d["GBs"]["goinfer"] / (sum(g) / 2))  # one run: its own tok/s
    # and the pages its weights were mapped from (its layout file), swept right after the run
    (pg,) = bw["weight_pages_GBs"]["goinfer"]
    assert _pos(pg) and d["runs_fraction_of_weight_pages"]["goinfer"] == [
        pytest.approx(d["GBs"]["goinfer"] / pg)
    ]
    assert d["fraction_of_weight_pages"]["goinfer"] == pytest.approx(d["GBs"]["goinfer"] / pg)
    assert res["settings"]["one_process_per_engine"] is True
    assert len(res["goinfer_pages"]) == len(d["runs_s_per_token"]["goinfer"])
    for pages in res["goinfer_pages"]:
        _check_pages(pages)
    _alone(res)
    if _peer_ran(res):
        assert p["best_peer"] == "llama.cpp" and _pos(p["ratio"]["goinfer"])
        assert (
            _pos(d["fraction_of_bandwidth"]["llama.cpp"]) and res["regime"]["peer"]["system_info"]
        )
    else:
        assert list(p["tok_s"]) == ["goinfer"] and p["ratio"] == {}


def check_perplexity_llamacpp(res):
    assert res["windows"] > 0 and res["text_tokens"] > 0
    if _peer_ran(res):
        assert _pos(res["perplexity"]) and res["n_scored"] > 0


def check_q6k(res):
    assert res["bytes"][-1]["type"] == "total" and res["bytes"][-1]["file"] > 0
    # the tiny file has no Q6_K tensor: both loads are the same weights and must agree
    assert "Q6_K" not in {r["type"] for r in res["bytes"]}
    a6, a8 = res["agreement"]
    assert a6["positions"] > 0 and a6["top1"] == a8["top1"] and a6["cos_mean"] == a8["cos_mean"]
    assert res["paired"]["median_err"]["q6_k"] == res["paired"]["median_err"]["q8_0"]
    assert all(_pos(v) for s in res["speed"].values() for v in s.values())


def check_ray_load(res):
    assert [r["config"] for r in res["rows"]] == [
        "1 replica",
        "2 replicas, prefix",
        "2 replicas, random",
    ]
    for r in res["rows"]:
        assert r["requests"] == r["agents"] * r["turns"] and _pos(r["tok_s"])


def check_sampling(res):
    assert len(res["rows"]) == 10 and all(
        _pos(r["goinfer_ms"]) and _pos(r["full_sort_ms"]) for r in res["rows"]
    )


def check_server_load(res):
    assert set(res["results"]) == {"batched", "one at a time"}
    for levels in res["results"].values():
        (lvl,) = levels
        assert _pos(lvl["tok_s"]) and lvl["requests"]
        assert all(r["completion_tokens"] == res["settings"]["max_tokens"] for r in lvl["requests"])


def check_shapes(res):
    assert len(res["files"]) == 4 and all(f["goinfer_finite"] for f in res["files"])
    assert len(res["checks"]) == 2
    for c in res["checks"].values():
        assert c["goinfer"]["finite"] and len(c["goinfer"]["generated"]) == 8
        if _peer_ran(res):
            assert c["llama.cpp"]["ids"] == c["goinfer"]["ids"]


def check_speculative(res):
    (t,) = res["tasks"]
    assert t["goinfer_identical"] and t["goinfer + draft"]["drafted"] > 0  # drafts were made
    assert _pos(t["goinfer"]["decode_tok_s"]) and _pos(t["goinfer + draft"]["decode_tok_s"])
    _alone(res)
    if _peer_ran(res):
        assert _pos(t["llama.cpp"]["decode_tok_s"]) and "llama_identical" in t


def check_tool_defaults(res):
    (m,) = res["models"].values()
    n = res["questions"] * (1 + res["seeds"])
    for choice, x in m.items():
        assert sum(x["replies"].values()) == n, (choice, x)
    assert "0" not in m["required"]["calls_per_reply"]  # "required": every reply holds a call


def check_claude_code(res: dict) -> None:
    """What benchmarks/claude_code.py --smoke wrote: its regime; two turns of Claude Code
    (each 200 reply cut at the 8-token cap, which Claude Code reports and retries); every
    request after the first reads from the cache at least all of the request before it, to the
    cache's block size (Claude Code only appends, so the whole previous prompt is a prefix; the
    reply it echoes may add more)."""
    r0 = res["regime"]
    assert r0["machine"]["vendor"] and r0["goinfer"]["kernel_variant"] and r0["date"]
    assert res["claude_code"] and res["model"]["file"] and res["context"] == 8192
    assert len(res["turns"]) == 2
    reqs = [r for t in res["turns"] for r in t["requests"]]
    assert reqs and all(r["status"] == 200 and r["stop_reason"] == "max_tokens" for r in reqs)
    assert reqs[0]["cached_tokens"] == 0
    block = res["kv_cache"]["block_size"]
    for a, b in zip(reqs, reqs[1:]):
        assert b["prompt_tokens"] > a["prompt_tokens"]
        assert a["prompt_tokens"] // block * block <= b["cached_tokens"] < b["prompt_tokens"], (
            a,
            b,
        )
    s = res["summary"]
    assert s["complete"] and s["requests"] == len(reqs)
    assert len(s["warm_over_cold_ttft"]) == len(reqs) - 1
    assert all(0 < x < 1 for x in s["warm_cached_fraction"])


CODEX_BLOCK = 16  # the KV cache's default block size


def check_codex(res: dict) -> None:
    """The real Codex CLI on the tiny model, two turns of one session (`codex exec`, `codex exec
    resume --last`): both exited 0, every request a 200 whose stream announced its item before
    its deltas and ended with response.completed, the resumed turn's prompt read from the prefix
    cache (all but the reply's last token, in whole blocks), the cold replays read nothing."""
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
    assert resumed["cached_tokens"] >= first["prompt_tokens"] // CODEX_BLOCK * CODEX_BLOCK
    assert res["summary"]["cached_fraction"][-1] == round(resumed["cached_fraction"], 4)


def check_tools(res):
    assert res["tokens_decoded"] == {"plain": res["tokens"], "auto": res["tokens"]}
    assert _pos(res["plain_tok_s"]) and _pos(res["auto_tok_s"]) and _pos(res["mask_ms_per_token"])
    assert res["format"] == "generic" and _pos(res["setup_ms_first"])


def check_decode_profile(res):
    """every op of the replayed steps timed: the matmul rows stream the model's matrices once
    a step, and the graph's time lies within the wall time of the steps"""
    assert res["steps"] == 8 and res["threads"] in (1, 2)
    rows = {r["kernel"]: r for r in res["rows"]}
    mm = [r for k, r in rows.items() if k.startswith("matmul ")]
    assert mm and {"rmsnorm", "attention"} <= set(rows)
    assert all(_pos(r["weight_bytes_per_step"]) and _pos(r["read_GBs"]) for r in mm)
    assert sum(r["weight_bytes_per_step"] for r in mm) == res["matmul_bytes_per_step"]
    assert res["matmul_bytes_per_step"] == res["model_matrix_bytes"]
    assert all(
        r["run_ms"] >= 0 and r["wait_ms"] >= 0 and r["ops_per_step"] > 0 for r in rows.values()
    )
    assert math.isclose(sum(r["run_ms"] for r in rows.values()), res["run_ms"], rel_tol=1e-9)
    assert math.isclose(res["graph_ms"], res["run_ms"] + res["wait_ms"], rel_tol=1e-9)
    assert _pos(res["run_ms"]) and res["graph_ms"] <= res["wall_ms"]
    assert res["outside_ms"] == pytest.approx(res["wall_ms"] - res["graph_ms"])
    assert len(res["read_bandwidth_GBs"]) == 2 and all(map(_pos, res["read_bandwidth_GBs"]))


def check_wait_policy(res):
    (r,) = res["rows"]
    assert r["setting"] == "goinfer" and _pos(r["prefill_ms"]) and _pos(r["decode_ms"])


CHECKS = {
    name[len("check_") :] + ".py": fn
    for name, fn in dict(globals()).items()
    if name.startswith("check_")
}


def test_every_script_is_covered():
    """A new benchmark script is run here automatically; each offers --smoke and --json and
    has a check of what its smoke run wrote."""
    assert len(SCRIPTS) >= 20
    for name in SCRIPTS:
        text = (BENCH / name).read_text()
        assert "--smoke" in text and "regime.add_json_arg" in text, name
    assert sorted(CHECKS) == SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_smoke(name, tmp_path):
    if REQUIRE_PEER and not HAVE_LLAMA_CPP:
        pytest.fail("GOINFER_REQUIRE_PEER=1 but llama-cpp-python is not installed")
    work = tmp_path / "work"
    work.mkdir()
    out_json = tmp_path / "out.json"
    out = subprocess.run(
        [sys.executable, str(BENCH / name), "--smoke", "--json", str(out_json)],
        cwd=work,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, (
        f"{name} --smoke failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    )
    assert out.stdout.strip(), f"{name} --smoke printed nothing"
    if name in PEERS and not HAVE_LLAMA_CPP:
        assert "skipped" in out.stdout, f"{name} did not say that llama.cpp was skipped"
    assert sorted(p.name for p in work.iterdir()) == [], (
        f"{name} --smoke left files in the working directory"
    )
    res = json.loads(out_json.read_text())
    r0 = res["regime"]
    assert r0["machine"]["vendor"] and r0["goinfer"]["kernel_variant"] and r0["date"]
    assert r0["command"].startswith(f"python benchmarks/{name} --smoke")
    if name in PEERS:
        assert r0["peer"]["installed"] is HAVE_LLAMA_CPP
    CHECKS[name](res)


def test_kernels_attention_decode_table():
    """kernels_attention --decode gives one row per storage type and thread count (block
    table in order here; the smoke run covers the random one)."""
    import kernels_attention

    res = kernels_attention.main(
        [
            "--decode",
            "--lengths",
            "600",
            "--shapes",
            "4x2x64x2",
            "--threads",
            "1",
            "2",
            "--reps",
            "1",
            "--blocks-in-order",
            "--capacity",
            "40000",
        ]
    )
    got = {(r["kv_dtype"], r["threads"]) for r in res["rows"]}
    assert got == {(dt, t) for dt in ("f32", "f16", "q8_0") for t in (1, 2)}
    assert all(r["n"] == 600 and _pos(r["fast_GBs"]) and _pos(r["graph_GBs"]) for r in res["rows"])
    assert all(r["capacity"] == 40000 for r in res["rows"])
    _check_fma_share(res)


# ============================================================================ goinfer bench


@pytest.fixture(scope="module")
def smoke_path(tmp_path_factory):
    import shapes

    return str(shapes.smoke_model(tmp_path_factory.mktemp("smoke")))


def test_bench_prompts_are_ordinary_tokens(smoke_path):
    """`goinfer bench` prompts hold no control, user-defined, unknown or unused token (the tiny
    vocabulary: 261 ordinary tokens, <s> and </s>, 249 [PAD] rows)."""
    from goinfer import Model
    from goinfer.bench import prompt_ids
    from goinfer.tokenizer import TOKEN_TYPE

    m = Model.load(smoke_path, threads=1, progress=False)
    tok = m.tokenizer
    for seed in (0, 1):
        ids = prompt_ids(m, 600, seed=seed)
        assert len(ids) == 600
        kinds = {tok.token_type(i) for i in ids}
        assert kinds <= {TOKEN_TYPE.NORMAL, TOKEN_TYPE.BYTE}, kinds
    assert prompt_ids(m, 600) == prompt_ids(m, 600)  # seeded


@pytest.mark.slow
def test_bench_prompts_skip_smollm2_control_tokens(smollm2_path):
    """SmolLM2's 17 control tokens (<|im_start|>, <|endoftext|>, <repo_name>, ...) never appear
    in bench prompts (seed 0 at 2,048 tokens drew three of them before)."""
    from goinfer import Model
    from goinfer.bench import prompt_ids

    m = Model.load(str(smollm2_path), threads=1, progress=False)
    controls = {i for i in range(m.tokenizer.vocab_size) if m.tokenizer.is_control(i)}
    assert len(controls) == 17
    for n in (512, 2048, 8000):
        assert not controls & set(prompt_ids(m, n)), n


def test_bench_run_cold_prefills(smoke_path):
    """`goinfer bench`'s rows: every prefill found nothing cached; finite positive rates; the
    machine in the regime."""
    from goinfer import Model, bench

    m = Model.load(smoke_path, threads=1, progress=False)
    res = bench.run(
        m, prompt_lengths=(64, 128), decode_prompts=(16,), decode_tokens=2, repeats=2, log=None
    )
    assert [r["prompt_tokens"] for r in res["prefill"]] == [64, 128]
    for r in res["prefill"]:
        assert r["cached_tokens"] == [0, 0] and _pos(r["tok_s"]) and len(r["runs_s"]) == 2
    (d,) = res["decode"]
    assert _pos(d["tok_s"]) and d["tokens"] == 2
    assert res["machine"]["vendor"] and isinstance(res["machine"]["isa"], list)
    assert res["weight_pages"] == {"pages": m.load_info.pages, "huge_share": m.load_info.huge_share}
    _check_pages(res["weight_pages"])
    json.loads(bench.to_json(res))


# ============================================================================ peers.py


def test_peers_weight_bytes_per_decode_step(smoke_path):
    """peers.py's bytes per decode step against gguf-py's own tensor sizes: every tensor but
    the embedding, plus one embedding row (the tiny shape has its own output matrix)."""
    import peers
    from gguf import GGUFReader

    r = GGUFReader(smoke_path)
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    assert "output.weight" in sizes
    emb = sizes.pop("token_embd.weight")
    rows = next(int(t.shape[1]) for t in r.tensors if t.name == "token_embd.weight")
    assert peers.decode_weight_bytes(smoke_path) == int(sum(sizes.values()) + emb / rows)


def test_peers_kv_bytes_per_decode_step(smoke_path):
    """peers.py's KV bytes per decode step from the file's metadata (gguf-py): every layer's
    keys and values in f16 at every position a step attends, averaged over the steps."""
    import peers
    from gguf import GGUFReader

    r = GGUFReader(smoke_path)
    arch = str(r.fields["general.architecture"].contents())
    meta = {k.removeprefix(arch + "."): f.contents() for k, f in r.fields.items()}
    assert "attention.sliding_window" not in meta  # every layer attends every position
    head_dim = (
        meta.get("attention.key_length") or meta["embedding_length"] // meta["attention.head_count"]
    )
    per_pos = meta["block_count"] * 2 * meta["attention.head_count_kv"] * head_dim * 2
    for prompt, tokens in ((64, 1), (64, 32), (300, 7)):
        steps = [per_pos * (prompt + t + 1) for t in range(tokens)]
        assert peers.decode_kv_bytes(smoke_path, prompt, tokens) == sum(steps) // tokens


def test_peers_kv_bytes_stop_at_the_window(tmp_path):
    """A sliding-window layer reads its window at most: a tiny Gemma 3 file (window 8, every
    6th of its 7 layers global) after 4,096 tokens."""
    import peers
    from gguf import GGUFReader

    from fixtures.tinygemma import hf_model, write_gguf

    path = write_gguf(hf_model(num_hidden_layers=7, sliding_window=8), tmp_path / "g3.gguf")

    r = GGUFReader(str(path))
    meta = {k.removeprefix("gemma3."): f.contents() for k, f in r.fields.items()}
    window, n_layers = meta["attention.sliding_window"], meta["block_count"]
    per_layer = 2 * meta["attention.head_count_kv"] * meta["attention.key_length"] * 2
    n_global = sum(1 for li in range(n_layers) if (li + 1) % 6 == 0)
    want = per_layer * (n_global * 4097 + (n_layers - n_global) * min(window, 4097))
    assert peers.decode_kv_bytes(str(path), 4096, 1) == want


def test_peers_llama_cpp_only(tmp_path, capsys):
    """peers.py --no-goinfer runs llama.cpp alone; its rows hold llama.cpp's engine only."""
    pytest.importorskip(
        "llama_cpp", reason="llama-cpp-python is not installed (benchmark env only)"
    )
    import peers
    import shapes

    path = str(shapes.smoke_model(tmp_path))
    res = peers.main(
        [
            path,
            "--no-goinfer",
            "--threads",
            "1",
            "--prompt-lengths",
            "64",
            "--decode-prompts",
            "16",
            "--decode-tokens",
            "2",
            "--repeats",
            "1",
            "--flash-attn",
            "off",
        ]
    )
    assert list(res["prefill"][0]["tok_s"]) == ["llama.cpp"]
    assert list(res["decode"][0]["tok_s"]) == ["llama.cpp"] and res["goinfer_load"] == "not run"


@pytest.mark.parametrize("side", ["--no-llama-cpp", "--no-goinfer"])
def test_peers_rows_longer_than_the_context_fail_before_any_run(
    tmp_path, capsys, monkeypatch, side
):
    """A decode row past the model's context is refused at the start, before any engine
    process starts, naming both lengths."""
    import peers
    import shapes

    path = str(shapes.smoke_model(tmp_path))
    from goinfer import Model

    ctx = Model.load(path, progress=False).config.context_length
    monkeypatch.setattr(peers.isolate, "run_child", lambda *a, **k: pytest.fail("an engine ran"))
    with pytest.raises(SystemExit):
        peers.main(
            [
                path,
                side,
                "--threads",
                "1",
                "--prompt-lengths",
                "16",
                "--decode-prompts",
                str(ctx),
                "--decode-tokens",
                "2",
                "--repeats",
                "1",
            ]
        )
    err = capsys.readouterr().err
    assert f"need {ctx + 2} tokens" in err and f"has {ctx}" in err


# ============================================================================ agent_loop, speculative


@pytest.fixture(scope="module")
def tiny_path(tiny):
    return str(tiny("llama", 3, max_position_embeddings=4096)[1])


def test_speculative_same_text_with_drafts(tiny_path, capsys):
    """goinfer with and without drafting on the copy task: the same text, drafts made."""
    import speculative

    res = speculative.main([tiny_path, "--smoke", "--threads", "1", "--no-llama-cpp"])
    row = res["tasks"][0]
    assert row["goinfer_identical"] and row["goinfer + draft"]["tokens"] > 0
    assert "speed-up goinfer" in capsys.readouterr().out


@pytest.mark.parametrize("transcript", ["default", "long"])
def test_agent_loop_turns_reuse_the_prefix(tiny_path, transcript, capsys):
    import agent_loop

    res = agent_loop.main(
        [tiny_path, "--smoke", "--threads", "1", "--no-llama-cpp", "--transcript", transcript]
    )
    g = res["engines"]["goinfer (reuse)"]
    assert len(g) == 2 and g[1]["cached_tokens"] > 0  # the second turn reused the first
    assert res["save_load"]["cached_after_load"] > 0
    out = capsys.readouterr().out
    assert "TTFT" in out and "llama.cpp: skipped" in out


# ============================================================================ families_reference


def test_families_reference_smoke():
    """The reference-distance tool (beside the fixtures it uses): goinfer within float32
    rounding of transformers on the Qwen3.5 fixture."""
    spec = importlib.util.spec_from_file_location(
        "families_reference", ROOT / "tests" / "tools" / "families_reference.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    (row,) = mod.main(["--smoke", "--no-llama"])
    assert row["family"] == "qwen35" and row["goinfer"][0] < 1e-2 and row["goinfer"][1] == 1.0


# ============================================================================ shapes.py's families
# The Qwen3.5 and gpt-oss shapes must be what llama.cpp's converter writes for those models: the
# tiny shapes of both families against convert_hf_to_gguf.py's output on a transformers model of
# the same config (tests/fixtures/hfconvert.py, --outtype q8_0; gpt-oss with MXFP4 experts).


def _hf_config(shape) -> dict:
    """fixtures/hfconvert.py overrides that give the transformers config of a shapes.py shape."""
    kw = dict(
        vocab_size=shape.vocab,
        hidden_size=shape.d_model,
        num_hidden_layers=shape.n_layers,
        num_attention_heads=shape.n_heads,
        num_key_value_heads=shape.n_kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.context,
        rms_norm_eps=shape.norm_eps,
        tie_word_embeddings=shape.tied,
    )
    if shape.arch == "qwen35":
        kw.update(
            intermediate_size=shape.d_ff,
            linear_num_key_heads=shape.lin_k_heads,
            linear_num_value_heads=shape.lin_v_heads,
            linear_key_head_dim=shape.lin_head_dim,
            linear_value_head_dim=shape.lin_head_dim,
            linear_conv_kernel_dim=shape.conv_kernel,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": shape.rope_base,
                "partial_rotary_factor": shape.rope_dims / shape.head_dim,
                "mrope_section": list(shape.rope_sections[:3]),
                "mrope_interleaved": True,
            },
        )
    else:
        factor, orig, fast, slow = shape.yarn
        kw.update(
            intermediate_size=shape.d_ff,
            num_local_experts=shape.n_expert,
            num_experts_per_tok=shape.n_expert_used,
            sliding_window=shape.sliding_window,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": shape.rope_base,
                "factor": factor,
                "beta_fast": fast,
                "beta_slow": slow,
                "truncate": False,
                "original_max_position_embeddings": orig,
            },
        )
    return kw


def _layout(path) -> tuple[dict, dict]:
    """(<arch>.* and general.architecture keys -> (value types, value), tensor -> (shape, type))"""
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    arch = r.fields["general.architecture"].contents()
    keys = {
        k: (tuple(int(t) for t in f.types), f.contents())
        for k, f in r.fields.items()
        if k.startswith(arch + ".") or k == "general.architecture"
    }
    tensors = {t.name: (tuple(int(n) for n in t.shape), t.tensor_type.name) for t in r.tensors}
    return keys, tensors


@pytest.mark.parametrize(
    "name,family,qtype",
    [("qwen3.5-tiny", "qwen35", "Q8_0"), ("gpt-oss-tiny", "gpt-oss", "MXFP4_MOE")],
)
def test_family_shape_is_the_converters(name, family, qtype, tmp_path):
    """Every <arch>.* key (type and value), tensor name, shape and type of the shape's file is
    what llama.cpp's converter writes for the same config (Q8_0 for what it quantizes, F32 for
    the rest, MXFP4 gpt-oss experts); and goinfer runs the file."""
    import shapes

    from fixtures import hfconvert

    shape = shapes.SHAPES[name]
    _, ref = hfconvert.build(family, outtype="q8_0", **_hf_config(shape))
    ours = shapes.make(shape, qtype, tmp_path, pure=True, vocab="bytes", log=None)
    (rk, rt), (ok, ot) = _layout(ref), _layout(ours)
    assert ok == rk
    assert ot == rt
    assert np.isfinite(shapes.goinfer_logits(ours, [1, 2, 3, 4, 5])).all()


@pytest.mark.parametrize("name,qtype", [("qwen3.5-tiny", "Q4_0"), ("gpt-oss-tiny", "MXFP4_MOE")])
def test_family_shape_loads_in_llama_cpp(name, qtype, tmp_path):
    """llama.cpp (llama-cpp-python, the benchmark environment) loads and runs the shape's file."""
    pytest.importorskip(
        "llama_cpp", reason="llama-cpp-python is not installed (benchmark env only)"
    )
    import shapes

    path = shapes.make(shapes.SHAPES[name], qtype, tmp_path, pure=True, vocab="bytes", log=None)
    lc = shapes.llama_cpp_logits(path, [1, 2, 3, 4, 5])
    assert lc.shape == (5, shapes.SHAPES[name].vocab) and np.isfinite(lc).all()


# ============================================================================ results and the report


def _results():
    import report

    return report.load_results()


def test_report_is_up_to_date_with_the_results():
    """docs/benchmarks.md is what benchmarks/results renders to (python benchmarks/report.py),
    and every plot it shows is there."""
    import report

    docs = report.load_results()
    names = report.plot_names(docs)
    assert report.DOC.read_text() == report.render(docs, names), (
        "docs/benchmarks.md is out of date: run python benchmarks/report.py"
    )
    for n in (n for ns in names.values() for n in ns):
        assert (report.IMG / n).is_file() and (report.IMG / n).stat().st_size < 64 << 10, n


def test_results_carry_their_regime_and_provenance():
    """Every results file names its machine class, regime and machine; every run its date and
    command (a script's regime, the provenance of a figure transcribed from the run log, or of a
    table a script printed)."""
    docs = _results()
    assert len(docs) >= 4
    for d in docs:
        assert d["schema"] == 1 and d["machine_class"] and d["regime"], d["_name"]
        for run in d["runs"]:
            p = run.get("provenance") or run["regime"]
            assert p["date"].startswith("20") and p["command"], p
            if run.get("provenance"):
                assert p["transcribed"] is True or p["source"].startswith("benchmarks/"), p


def test_transcribed_ratios_match_their_rates():
    """Each logged ratio agrees with its logged rates (the ratios were computed from unrounded
    medians, the rates rounded to 2-4 digits): a transcription slip shows here."""
    for d in _results():
        for run in d["runs"]:
            if run.get("benchmark") == "peers":
                for row in run["prefill"] + run["decode"]:
                    best = row["tok_s"][row["best_peer"]]
                    for k, r in row["ratio"].items():
                        if r is not None:
                            assert abs(row["tok_s"][k] / best / r - 1) < 0.05, (
                                d["_name"],
                                run["model"],
                                row,
                            )
            if run.get("benchmark") == "memory":
                med, rat = run["median"], run.get("ratio") or {}
                peers = [v for k, v in med.items() if k != "goinfer"]
                for key in ("peak_rss", "load_s"):
                    if rat.get(key):
                        best = min(v[key] for v in peers if v.get(key))
                        assert abs(med["goinfer"][key] / best / rat[key] - 1) < 0.1, (
                            run["model"],
                            key,
                        )
            if run.get("benchmark") == "agent_loop" and run.get("ratio_per_turn"):
                eng = run["engines"]
                peers = [k for k in eng if k.startswith("llama.cpp")]
                for i, r in enumerate(run["ratio_per_turn"]):
                    g = eng.get("goinfer (reuse)", [{}] * run["turns"])[i].get("ttft_s")
                    if g and peers:
                        best = min(eng[k][i]["ttft_s"] for k in peers)
                        assert abs(best / g / r - 1) < 0.05, (run["model"], i, best / g, r)
