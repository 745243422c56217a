"""The layout cache (goinfer/layout.py): built on the first load, memory-mapped after, the same
bits as loading from the GGUF, rebuilt when stale or corrupt, never left half-written, built
once when two processes load at once; the memory check before a load (goinfer/memory.py) and
the KV cache's default size."""

from __future__ import annotations

import dataclasses
import errno
import gc
import json
import os
import subprocess
import sys
import tempfile
import warnings
from functools import partial
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fixtures import compare, tinymodels
from goinfer import layout, memory
from goinfer.errors import InsufficientMemoryError
from goinfer.gguf import GGUFFile
from goinfer.kv_cache import DEFAULT_KV_DTYPE, KVCache


@pytest.fixture()
def layouts(tmp_path, monkeypatch):
    """A fresh layout cache directory for this test."""
    d = tmp_path / "layouts"
    monkeypatch.setenv("GOINFER_LAYOUT_DIR", str(d))
    return d


@pytest.fixture(scope="module")
def q4_path(tmp_path_factory):
    """A tiny llama with Q4_0 layers (tied embeddings, F32 embedding table)."""
    model = tinymodels.hf_model("llama", 21, tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("layout") / "tiny-q4.gguf"
    return tinymodels.write_gguf(model, "llama", path, qtype=gguf.GGMLQuantizationType.Q4_0)


_load = partial(compare.load, kv_dtype=DEFAULT_KV_DTYPE)  # the product's KV storage


IDS = np.random.default_rng(7).integers(0, 320, 40).tolist()


def _arrays(m):
    """Every weight array of a loaded model, in a fixed order."""
    out = []
    for w in m.impl.weights():
        out += [a for a in (w.qs, w.d, w.m) if a is not None]
    out += [L.attn_norm for L in m.impl.layers] + [m.impl.out_norm]
    return out


def _files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


# ============================================================================ build, map, same bits


@pytest.mark.parametrize("which", ["q4", "llama-f32", "qwen2-f32"])
def test_cached_load_is_mapped_and_bit_identical(which, q4_path, tiny, layouts):
    path = q4_path if which == "q4" else tiny(which.split("-")[0], 4)[1]
    plain = _load(path, layout_cache=False)
    assert plain.load_info.source == "gguf"
    built = _load(path)
    assert built.load_info.source == "built" and built.load_info.path.exists()
    mapped = _load(path)
    assert mapped.load_info.source == "layout"
    for m in (built, mapped):  # both run on read-only views of the mapped file
        for a in _arrays(m):
            assert not a.flags.writeable
    for a, b in zip(_arrays(plain), _arrays(mapped), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    ref = plain.logits(IDS)
    assert np.array_equal(built.logits(IDS), ref)
    assert np.array_equal(mapped.logits(IDS), ref)
    assert [vars(r) for r in mapped.conversions.rows] == [vars(r) for r in plain.conversions.rows]


def test_moe_and_gemma_families_are_cached(tmp_path, layouts):
    from fixtures import tinygemma, tinymoe

    _, moe_path = tinymoe.build_moe("qwen2moe", tmp_path, seed=3)
    gm = tinygemma.hf_model(seed=2)
    gemma_path = tinygemma.write_gguf(gm, tmp_path / "tiny-gemma.gguf")
    for path in (moe_path, gemma_path):
        ref = _load(path, layout_cache=False).logits(IDS[:24])
        assert _load(path).load_info.source == "built"
        m = _load(path)
        assert m.load_info.source == "layout"
        assert np.array_equal(m.logits(IDS[:24]), ref)


def _tree_arrays(obj, out=None) -> list[np.ndarray]:
    """Every array reachable from a weights tree (QWeights, layer dataclasses, lists), in order."""
    out = [] if out is None else out
    if isinstance(obj, np.ndarray):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _tree_arrays(v, out)
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            _tree_arrays(getattr(obj, f.name), out)
    return out


def _model_arrays(m) -> list[np.ndarray]:
    i = m.impl
    return _tree_arrays([i.tok_embd, i.layers, i.out_norm, i.lm_head])


# what each hybrid / sink / MXFP4 family must carry through the cache (a path into layer 0)
FAMILY_PARTS = {
    "qwen35": [
        ("lin", "conv_wT"),
        ("lin", "A"),
        ("lin", "dt_bias"),
        ("lin", "norm"),
        ("lin", "w_out", "qs"),
    ],
    "qwen35moe": [
        ("lin", "conv_wT"),
        ("lin", "A"),
        ("moe", "router", "qs"),
        ("moe", "shared_gate", "qs"),
    ],
    "gpt-oss": [("sinks",), ("bo",), ("bqkv",), ("moe", "router_bias")],
}


def _part(L, path):
    for name in path:
        L = getattr(L, name)
    return L


@pytest.mark.parametrize("family", sorted(FAMILY_PARTS))
def test_hybrid_sink_mxfp4_families_are_cached(family, layouts):
    """Qwen3.5 dense and MoE (Gated DeltaNet weights: conv taps, A, dt bias, norms) and gpt-oss
    (sinks, biases, MXFP4 experts): the build and the mapped load run every weight from the
    file, with the bits and logits of a load without the cache; a corrupt or stale file of
    these families is rebuilt with a warning."""
    from fixtures import hfconvert

    path = hfconvert.build(family)[1]
    ids = IDS[:24]
    plain = _load(path, layout_cache=False)
    assert plain.load_info.source == "gguf"
    ref = plain.logits(ids)
    built = _load(path)
    assert built.load_info.source == "built"
    mapped = _load(path)
    assert mapped.load_info.source == "layout" and mapped.load_info.path == built.load_info.path
    pa, ma = _model_arrays(plain), _model_arrays(mapped)
    assert len(pa) == len(ma) > 0
    for a, b in zip(pa, ma, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    for m in (built, mapped):  # every weight is a read-only view of the mapped file
        assert not any(a.flags.writeable for a in _model_arrays(m))
    L0 = mapped.impl.layers[0]
    for part in FAMILY_PARTS[family]:
        got, want = _part(L0, part), _part(plain.impl.layers[0], part)
        assert isinstance(got, np.ndarray) and not got.flags.writeable and np.array_equal(got, want)
    if family == "gpt-oss":
        assert all(
            X.w_gate_up.kind == "mxfp4" and X.w_down.kind == "mxfp4"
            for L in mapped.impl.layers
            for X in L.moe.experts
        )
    else:
        assert [L.lin_index for L in mapped.impl.layers] == [L.lin_index for L in plain.impl.layers]
        assert [L.kv_index for L in mapped.impl.layers] == [L.kv_index for L in plain.impl.layers]
    assert np.array_equal(built.logits(ids), ref)
    assert np.array_equal(mapped.logits(ids), ref)
    assert [vars(r) for r in mapped.conversions.rows] == [vars(r) for r in plain.conversions.rows]
    # corrupt: one byte of layer 0's family-specific weight
    lp = mapped.load_info.path
    del built, mapped
    header = layout.verify(lp)
    node = header["tree"]["d"]["layers"]["l"][0]
    for name in FAMILY_PARTS[family][0]:
        node = node["f"][name]
    off, nbytes = header["arrays"][node["a"]][:2]
    _flip(lp, off + nbytes // 2)
    assert np.array_equal(_rebuilt(path, "fails its checksum").logits(ids), ref)
    # stale: another layout version
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(layout, "LAYOUT_VERSION", layout.LAYOUT_VERSION + 1)
        assert np.array_equal(_rebuilt(path, "stale").logits(ids), ref)
    assert layout.verify(lp)["layout_version"] == layout.LAYOUT_VERSION + 1


def test_layout_holds_exactly_the_native_bytes(q4_path, layouts):
    """GGUFFile.native_bytes (from tensor infos, before loading: what the memory check uses) is
    the byte count of the arrays the model runs on."""
    m = _load(q4_path)
    header = layout.verify(m.load_info.path)
    assert sum(a[1] for a in header["arrays"]) == GGUFFile(q4_path).native_bytes()
    assert sum(a.nbytes for a in _arrays(m)) <= GGUFFile(q4_path).native_bytes()


class _Recorder:
    """Wraps the writer's file: records (offset, length) of every write that reaches it."""

    def __init__(self, f):
        self.f, self.calls, self.at = f, [], 0

    def write(self, b):
        n = self.f.write(b)
        self.calls.append((self.at, n))
        self.at += n
        return n

    def __getattr__(self, name):
        return getattr(self.f, name)


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 5 << 20), min_size=0, max_size=6),
    seed=st.integers(0, 2**32 - 1),
)
@example(sizes=[], seed=0)
@example(sizes=[(2 << 20) - 4096], seed=1)  # the first window exactly full after the preamble
@example(sizes=[(2 << 20) - 4096, 2 << 20, 1], seed=2)  # arrays ending on window boundaries
@example(sizes=[3, 5 << 20, 64, 7], seed=3)  # pads between arrays
def test_writer_writes_whole_2mb_windows(sizes, seed):
    """Every write reaches the file at a multiple of 2 MB with a multiple of 2 MB bytes (the
    last one excepted), and the file holds each array at its table offset: 64-byte aligned,
    after the 4096-byte preamble, the bytes it was given."""
    H = memory.HUGE_PAGE
    rng = np.random.default_rng(seed)
    arrays = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    with tempfile.TemporaryDirectory() as d:
        w = layout._Writer(Path(d) / "w.layout", {})
        rec = w.f = _Recorder(w.f)
        for a in arrays:
            w.put(a)
        w.finish({"t": "x"})
        w.commit()
        data = (Path(d) / "w.layout").read_bytes()
    assert sum(n for _, n in rec.calls) == len(data) == w.pos
    for off, n in rec.calls[:-1]:
        assert off % H == 0 and n % H == 0 and n > 0
    assert rec.calls[-1][0] % H == 0
    end = 4096
    for a, (off, nbytes, *_rest) in zip(arrays, w.table):
        assert off == end + (-end % 64)
        assert nbytes == a.size and data[off : off + nbytes] == a.tobytes()
        end = off + nbytes
    assert data[:16] == layout.MAGIC


def test_pages_are_shared_between_processes(q4_path, layouts):
    m = _load(q4_path)
    lp = str(m.load_info.path)
    code = (
        "import sys; from goinfer.gguf import GGUFFile; from goinfer.model import Model; "
        "m = Model(GGUFFile(sys.argv[1]), threads=1, progress=False); "
        "assert m.load_info.source == 'layout'; print('ready', flush=True); sys.stdin.read()"
    )
    # the child imports goinfer as this process does (never the source tree: CI installs it)
    p = subprocess.Popen(
        [sys.executable, "-c", code, str(q4_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "ready"
        shared = rss = 0
        inside = False
        for line in open("/proc/self/smaps"):
            if not line[0].isupper() or ":" not in line.split()[0]:  # a mapping's first line
                inside = line.rstrip().endswith(lp)
            elif inside and line.startswith("Shared_Clean:"):
                shared += int(line.split()[1]) * 1024
            elif inside and line.startswith("Rss:"):
                rss += int(line.split()[1]) * 1024
        size = os.path.getsize(lp)
        assert rss >= 0.9 * size  # mapped and populated ...
        assert shared >= 0.9 * size  # ... and the same physical pages as the other process'
    finally:
        p.communicate("", timeout=60)
    assert p.returncode == 0


def test_prepare_builds_and_verifies(q4_path, layouts):
    lp = layout.prepare(q4_path, progress=False)
    assert lp.exists() and layout.verify(lp)["fingerprint"] == GGUFFile(q4_path).fingerprint
    assert layout.prepare(q4_path, progress=False) == lp  # already there: verified, same file
    assert _load(q4_path).load_info.source == "layout"


def test_goinfer_pull_builds_the_layout(q4_path, layouts, monkeypatch, capsys):
    from goinfer import cli, hub

    monkeypatch.setattr(hub, "pull", lambda name, force=False: Path(q4_path))
    assert cli.main(["pull", "some-model"]) == 0
    out = capsys.readouterr().out.split()
    assert out[0] == str(q4_path) and Path(out[1]) == layout.cache_path(
        GGUFFile(q4_path).fingerprint
    )
    layout.verify(out[1])
    assert _load(q4_path).load_info.source == "layout"


# ============================================================================ stale, corrupt


def _rebuilt(path, match: str):
    with pytest.warns(layout.LayoutWarning, match=match):
        m = _load(path)
    assert m.load_info.source == "built"
    return m


def _flip(p: Path, offset: int) -> None:
    with open(p, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def test_corrupt_data_is_detected_and_rebuilt(q4_path, layouts):
    ref = _load(q4_path, layout_cache=False).logits(IDS)
    lp = _load(q4_path).load_info.path
    header = layout.verify(lp)
    off, nbytes = header["arrays"][len(header["arrays"]) // 2][:2]
    _flip(
        lp, off + nbytes // 2
    )  # a weight byte: the file's mtime moves, the stamp no longer matches
    with pytest.raises(layout.LayoutError, match="checksum"):
        layout.verify(lp)
    m = _rebuilt(q4_path, "fails its checksum")
    assert np.array_equal(m.logits(IDS), ref)
    layout.verify(lp)  # the rebuilt file is whole


@pytest.mark.parametrize("damage", ["header", "truncate", "garbage", "empty"])
def test_damaged_file_is_rebuilt(damage, q4_path, layouts):
    ref = _load(q4_path, layout_cache=False).logits(IDS)
    lp = _load(q4_path).load_info.path
    size = lp.stat().st_size
    if damage == "header":
        foot = lp.read_bytes()[-72:]
        h_off = int.from_bytes(foot[20:28], "little")
        _flip(lp, h_off + 10)
        match = "header checksum"
    elif damage == "truncate":
        os.truncate(lp, size - 4096)
        match = "footer|bytes"
    elif damage == "garbage":
        lp.write_bytes(os.urandom(size))
        match = "not a goinfer layout"
    else:
        lp.write_bytes(b"")
        match = "too short"
    m = _rebuilt(q4_path, match)
    assert np.array_equal(m.logits(IDS), ref)


def test_stale_layout_version_is_rebuilt(q4_path, layouts, monkeypatch):
    lp = _load(q4_path).load_info.path
    monkeypatch.setattr(layout, "LAYOUT_VERSION", layout.LAYOUT_VERSION + 1)
    _rebuilt(q4_path, "stale")
    assert layout.verify(lp)["layout_version"] == layout.LAYOUT_VERSION


def test_copied_file_is_checked_in_full_once(q4_path, layouts):
    """A file whose stamp does not match (copied, touched) is checked array by array, then
    restamped: the next load trusts it again."""
    lp = _load(q4_path).load_info.path
    stamp = lp.with_name(lp.name + ".ok")
    os.utime(lp, ns=(1, 1))
    assert not layout._stamp_ok(lp, lp.stat())
    calls = []
    real = layout._check_arrays
    layout._check_arrays = lambda lay: (calls.append(1), real(lay))
    try:
        assert _load(q4_path).load_info.source == "layout"
        assert _load(q4_path).load_info.source == "layout"
    finally:
        layout._check_arrays = real
    assert calls == [1] and json.loads(stamp.read_text())["mtime_ns"] == 1


def test_another_models_layout_under_the_name_is_stale(q4_path, tiny, layouts):
    """A file whose header names another GGUF (e.g. copied by hand under this name) is stale."""
    other = tiny("llama", 4)[1]
    lo = _load(other).load_info.path
    lp = layout.cache_path(GGUFFile(q4_path).fingerprint)
    lp.write_bytes(lo.read_bytes())
    _rebuilt(q4_path, "stale.*fingerprint")


# ============================================================================ writing fails


class _FullDisk:
    """A file object whose writes fail with ENOSPC once `budget` bytes are written."""

    def __init__(self, f, budget: int):
        self.f, self.left = f, budget

    def write(self, b):
        self.left -= len(b)
        if self.left < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.f.write(b)

    def __getattr__(self, name):
        return getattr(self.f, name)


def _enospc_after(monkeypatch, budget: int):
    real = os.fdopen
    monkeypatch.setattr(layout.os, "fdopen", lambda *a, **k: _FullDisk(real(*a, **k), budget))


@pytest.mark.parametrize("budget", [0, 20_000, 10**9])
def test_full_disk_loads_from_gguf_and_leaves_nothing(budget, q4_path, layouts, monkeypatch):
    """A write that fails (ENOSPC at the start, in the middle, or at fsync) leaves no partial
    file and no stamp; the model loads from the GGUF with a warning and the same bits."""
    ref = _load(q4_path, layout_cache=False).logits(IDS)
    with pytest.MonkeyPatch.context() as mp:
        if budget < 10**9:
            _enospc_after(mp, budget)
        else:

            def fsync(fd):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            mp.setattr(layout.os, "fsync", fsync)
        with pytest.warns(layout.LayoutWarning, match="No space left"):
            m = _load(q4_path)
    assert m.load_info.source == "gguf" and "write failed" in m.load_info.reason
    assert [f for f in _files(layouts) if not f.endswith(".lock")] == []
    assert np.array_equal(m.logits(IDS), ref)
    assert sum(r.count for r in m.conversions.rows) == sum(
        r.count for r in _load(q4_path, layout_cache=False).conversions.rows
    )
    assert _load(q4_path).load_info.source == "built"  # space again: the next load builds it


def test_unwritable_directory_loads_from_gguf(q4_path, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("GOINFER_LAYOUT_DIR", str(blocker / "layouts"))
    with pytest.warns(layout.LayoutWarning, match="could not write"):
        m = _load(q4_path)
    assert m.load_info.source == "gguf"


def test_cache_off(q4_path, layouts, monkeypatch):
    monkeypatch.setenv("GOINFER_LAYOUT_CACHE", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _load(q4_path).load_info.source == "gguf"
    assert _files(layouts) == []


# ============================================================================ pages


def _mapped_rss(path: Path) -> int:
    """Resident bytes of this process's mappings of path (/proc/self/smaps)."""
    rss, inside = 0, False
    for line in open("/proc/self/smaps"):
        if not line[0].isupper() or ":" not in line.split()[0]:  # a mapping's first line
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            rss += int(line.split()[1]) * 1024
    return rss


def _opened(path: Path) -> layout.Layout:
    header = layout.verify(path)
    keys = ("format", "layout_version", "fingerprint", "variant", "family")
    return layout.open_layout(path, {k: header[k] for k in keys})


def test_copied_weights_are_the_same_bits(q4_path, layouts, monkeypatch):
    mapped = _load(q4_path)
    assert mapped.load_info.pages in ("huge", "small")  # a tiny layout stays mapped
    monkeypatch.setenv("GOINFER_LAYOUT_PAGES", "copy")
    m = _load(q4_path)
    assert m.load_info.source == "layout" and m.load_info.pages == "copied"
    assert m.load_info.huge_share is not None
    for a, b in zip(_arrays(mapped), _arrays(m), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
        assert not b.flags.writeable
        assert not np.shares_memory(a, b)
    assert np.array_equal(m.logits(IDS), mapped.logits(IDS))
    monkeypatch.setenv("GOINFER_LAYOUT_PAGES", "sometimes")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # fails before anything is read (no rebuild)
        with pytest.raises(ValueError, match="LAYOUT_PAGES must be one of auto, map, copy"):
            _load(q4_path)


def test_copy_lets_the_files_pages_go(q4_path, layouts):
    lp = _load(q4_path).load_info.path
    lay = _opened(lp)
    before = _mapped_rss(lp)
    assert before >= 0.9 * os.path.getsize(lp)  # populated
    layout.place_weights(lay, "copy")
    assert lay.pages == "copied" and lay.copy is not None
    assert lay.shift == -layout._address(lay.copy) % memory.HUGE_PAGE
    # what stays resident of the file: the preamble's page and the header after the arrays
    arrays_end = max(off + n for off, n, *_ in lay.header["arrays"])
    assert _mapped_rss(lp) <= before - (arrays_end - 4096) // 4096 * 4096 + 4096


@pytest.mark.parametrize("pages", ["map", "copy"])
def test_untied_embedding_is_read_by_row(pages, tmp_path, layouts, monkeypatch):
    """An embedding table that only lookups read (not tied to the LM head) is neither faulted in
    at load nor copied, and no step maps it: steps read their tokens' row blocks from the file
    into a staging weight (row_table.py).  Logits (prefill, decode steps replayed by a graph,
    a batch longer than the staging holds) keep the bits of a load without the cache."""
    monkeypatch.setenv("GOINFER_LAYOUT_PAGES", pages)
    # tok_embd f32: 16 MB, untied
    model = tinymodels.hf_model(
        "llama", 5, vocab_size=16384, hidden_size=256, intermediate_size=256
    )
    path = tinymodels.write_gguf(model, "llama", tmp_path / "untied.gguf")
    ids = np.random.default_rng(3).integers(0, 16384, 300).tolist()
    plain = _load(path, layout_cache=False)
    ref = plain.logits(ids)
    ref_gen = plain.session().generate(ids[:8], max_tokens=6).tokens
    assert _load(path).load_info.source == "built"
    gc.collect()  # that model's mapping goes
    m = _load(path)
    info = m.load_info
    assert info.source == "layout" and list(info.row_tables) == ["tok_embd"]
    table = info.row_tables["tok_embd"]
    assert m.impl.row_tables is info.row_tables
    emb = m.impl.tok_embd.qs  # the table's view of the mapping, which no kernel reads
    assert emb.nbytes == 16384 * 256 * 4 and not emb.flags.writeable
    lp = info.path
    size = os.path.getsize(lp)
    resident = _mapped_rss(lp)
    # the rest is populated or copied (a mapping with 2 MB entries: to the 2 MB around it)
    assert resident <= size - emb.nbytes + 2 * memory.HUGE_PAGE + 8 * 4096
    assert np.array_equal(m.logits(ids), ref)  # 300 rows: staged in two pieces
    assert len(ids) > table.capacity
    assert m.session().generate(ids[:8], max_tokens=6).tokens == ref_gen
    assert m.graph is not None and m.graph.replays > 0  # decode steps replayed
    assert _mapped_rss(lp) <= resident + 2 * 4096  # nothing of the table came in (its edges)
    staged = table.weight.qs
    assert staged.shape == (table.capacity,) + emb.shape[1:]
    # the staging holds whole row blocks of the table: the rows of the last tokens staged
    toks = np.array(ids[-4:])
    rows = table.stage(toks)
    for t, r in zip(toks.tolist(), rows.tolist(), strict=True):
        assert np.array_equal(staged[r // 16, :, r % 16], emb[t // 16, :, t % 16])
    k = len(np.unique(toks // 16))  # the slots this stage filled
    before = staged[:k].copy()
    staged[:k] = 0
    monkeypatch.delattr(os, "preadv")  # a system without it: os.pread and a copy
    assert np.array_equal(table.stage(toks), rows) and np.array_equal(staged[:k], before)
    with pytest.raises(ValueError, match="out of range"):
        table.stage(np.array([16384]))
    with pytest.raises(ValueError, match="holds 256"):
        table.stage(np.zeros(257, np.int64))


@pytest.mark.parametrize("family, tables", [("gemma4", ["ple_embd"]), ("gpt-oss", ["tok_embd"])])
def test_row_tables_of_families(family, tables, layouts):
    """Gemma 4's per-layer embedding (its tok_embd is tied to the head) and gpt-oss's untied
    tok_embd are read by row: the same logits and greedy tokens as a load without the cache."""
    from fixtures import hfconvert

    path = hfconvert.build(family)[1]
    plain = _load(path, layout_cache=False)
    assert plain.impl.row_tables == {}
    _load(path)
    m = _load(path)
    assert m.load_info.source == "layout" and sorted(m.load_info.row_tables) == tables
    assert np.array_equal(m.logits(IDS[:24]), plain.logits(IDS[:24]))
    want = plain.session().generate(IDS[:5], max_tokens=5).tokens
    assert m.session().generate(IDS[:5], max_tokens=5).tokens == want


def test_tied_embedding_stays_with_the_weights(q4_path, layouts):
    """Tied to the LM head, the table is read whole every step: no row table."""
    _load(q4_path)
    m = _load(q4_path)
    assert m.load_info.source == "layout" and m.load_info.row_tables == {}
    assert m.impl.lm_head is m.impl.tok_embd


@pytest.mark.parametrize(
    "mode, size, share, thp, copied",
    [
        ("auto", "large", 0.1, True, True),  # mostly 4 KB pages: copied
        ("auto", "large", 0.9, True, False),  # mostly 2 MB pages already
        ("auto", "large", None, True, False),  # not known (no /proc): left alone
        ("auto", "large", 0.1, False, False),  # the system gives no huge pages
        ("auto", "small", 0.1, True, False),  # under 32 MB
        ("map", "large", 0.1, True, False),
        ("copy", "small", 0.9, False, True),
    ],
)
def test_auto_copies_a_large_layout_on_small_pages(
    mode, size, share, thp, copied, q4_path, layouts, monkeypatch
):
    lay = _opened(_load(q4_path).load_info.path)
    if size == "large":
        monkeypatch.setattr(layout, "_COPY_MIN", 0)
    monkeypatch.setattr(memory, "huge_share", lambda address: share)
    monkeypatch.setattr(memory, "huge_pages_available", lambda: thp)
    layout.place_weights(lay, mode)
    assert (lay.copy is not None) == copied
    want = "copied" if copied else "huge" if share is not None and share >= 0.5 else "small"
    assert lay.pages == want


def test_no_memory_for_a_copy_keeps_the_mapping(q4_path, layouts, monkeypatch):
    """A copy that cannot be allocated leaves the weights mapped: no rebuild of a sound layout,
    the same logits; a forced copy says so."""
    ref = _load(q4_path)
    stamp = os.stat(ref.load_info.path).st_mtime_ns

    def no_memory(n):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(layout, "_anonymous", no_memory)
    monkeypatch.setattr(layout, "_COPY_MIN", 0)
    monkeypatch.setattr(memory, "huge_share", lambda address: 0.0)
    monkeypatch.setattr(memory, "huge_pages_available", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # auto: quietly mapped
        m = _load(q4_path)
    assert m.load_info.source == "layout" and m.load_info.pages == "small"
    assert np.array_equal(m.logits(IDS), ref.logits(IDS))
    monkeypatch.setenv("GOINFER_LAYOUT_PAGES", "copy")
    with pytest.warns(layout.LayoutWarning, match="no memory for a copy.*stay mapped"):
        m = _load(q4_path)
    assert m.load_info.source == "layout" and m.load_info.pages == "small"
    assert os.stat(ref.load_info.path).st_mtime_ns == stamp  # never rebuilt


def test_huge_share_reads_the_mapping():
    import mmap

    n = 8 * memory.HUGE_PAGE
    buf = mmap.mmap(-1, n)
    addr = layout._address(buf)
    assert memory.huge_share(addr) is None  # nothing resident yet
    memory.want_huge_pages([(addr, n)])
    np.frombuffer(buf, np.uint8)[::4096] = 1  # touch every page
    share = memory.huge_share(addr)
    assert share is not None and 0.0 <= share <= 1.0
    if not memory.huge_pages_available():
        assert share == 0.0
    assert memory.huge_share(addr + 4096) is None  # not the start of a mapping


# ============================================================================ memory


def test_model_too_large_fails_before_loading(q4_path, layouts, monkeypatch):
    need = GGUFFile(q4_path).native_bytes()
    monkeypatch.setattr(memory, "available_bytes", lambda: need - 1)
    loaded = []
    real = GGUFFile.load_weight
    monkeypatch.setattr(
        GGUFFile, "load_weight", lambda self, n: (loaded.append(n), real(self, n))[1]
    )
    with pytest.raises(InsufficientMemoryError) as e:
        _load(q4_path)
    assert e.value.needed == need and e.value.available == need - 1
    assert str(need) in str(e.value) and str(need - 1) in str(e.value)
    assert loaded == [] and _files(layouts) == []  # nothing read, nothing written
    monkeypatch.setattr(memory, "available_bytes", lambda: need)
    assert _load(q4_path).load_info.source == "built"
    monkeypatch.setenv("GOINFER_SKIP_MEMORY_CHECK", "1")
    monkeypatch.setattr(memory, "available_bytes", lambda: 1)
    assert _load(q4_path).load_info.source == "layout"


def test_available_bytes_reads_the_machine():
    avail, total = memory.available_bytes(), memory.total_bytes()
    assert avail is not None and total is not None and 0 < avail <= total


def test_kv_cache_default_is_bounded_by_memory(tiny, monkeypatch):
    """2 x context by default, but never more than half of the memory available: a 128k-context
    model does not reserve 2 x 131072 tokens."""
    m = _load(tiny("llama", 3)[1], layout_cache=False, context_length=131072)
    per_token = KVCache(m, max_tokens=16).bytes_per_block // 16
    monkeypatch.setattr(memory, "available_bytes", lambda: None)
    assert KVCache(m).max_tokens == 2 * 131072
    monkeypatch.setattr(memory, "available_bytes", lambda: 1000 * per_token)
    c = KVCache(m)
    assert c.max_tokens == 512  # 500 tokens, rounded up to whole blocks of 16
    monkeypatch.setattr(memory, "available_bytes", lambda: 10**15)
    assert KVCache(m).max_tokens == 2 * 131072


# ============================================================================ two processes at once

_RACER = r"""
import contextlib, json, sys, time
from pathlib import Path
import numpy as np
from goinfer import layout
from goinfer.gguf import GGUFFile
from goinfer.model import Model

gguf_path, me, other, sig, out = sys.argv[1:6]
sig = Path(sig)
ids = json.loads(sys.argv[6])
real_lock, real_build = layout._lock, layout._build
builds = []


def seen(name, timeout):
    end = time.monotonic() + timeout
    while not (sig / name).exists():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


@contextlib.contextmanager
def lock(path):
    (sig / f"{me}.at-lock").touch()  # about to take the lock
    with real_lock(path):
        yield


def build(*a, **kw):
    # the first to get the lock holds its build until the other process is at the lock, then
    # gives it a second to start a build of its own (it must not: it waits for the lock)
    builds.append(me)
    (sig / f"{me}.building").touch()
    assert seen(f"{other}.at-lock", 120), "the other process never reached the lock"
    seen(f"{other}.building", 1.0)
    return real_build(*a, **kw)


layout._lock, layout._build = lock, build
print("ready", flush=True)
sys.stdin.readline()  # the barrier: both go at once
m = Model(GGUFFile(gguf_path), threads=1, progress=False)
np.save(out, m.logits(ids))
print(json.dumps({"source": m.load_info.source, "builds": len(builds)}), flush=True)
"""


def test_two_processes_building_one_layout(q4_path, layouts, tmp_path):
    """Two processes load a model with no layout cache at once (released together, the first
    builder held until the other is at the lock): one builds, the other waits and maps the
    finished file; both compute the logits of the GGUF bit for bit; one whole file is left
    (verify: every array's crc32), no temporary file."""
    ref = _load(q4_path, layout_cache=False).logits(IDS)  # (40, vocab)
    sig = tmp_path / "signals"
    sig.mkdir()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _RACER,
                str(q4_path),
                me,
                other,
                str(sig),
                str(tmp_path / f"{me}.npy"),
                json.dumps(IDS),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for me, other in (("a", "b"), ("b", "a"))
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for p in procs:  # both past their imports: release them together
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [json.loads(p.stdout.readline()) for p in procs]
    finally:
        for p in procs:
            p.communicate("", timeout=300)
    assert [p.returncode for p in procs] == [0, 0]
    assert sorted(r["source"] for r in results) == ["built", "layout"], results
    assert sorted(r["builds"] for r in results) == [0, 1], results
    for me in "ab":
        assert np.array_equal(np.load(tmp_path / f"{me}.npy"), ref), me
    (lp,) = [layouts / f for f in _files(layouts) if f.endswith(".layout")]
    assert lp == layout.cache_path(GGUFFile(q4_path).fingerprint)
    layout.verify(lp)
    assert not [f for f in _files(layouts) if f.endswith(".tmp")], _files(layouts)
    assert _load(q4_path).load_info.source == "layout"
