"""Split GGUF files (llama.cpp's gguf-split layout): the parts' format checked byte by byte
against the GGUF spec, a split SmolLM2 loads as the whole file does (same tensors, logits bit
for bit, its own layout cache key over all parts), and every missing or mismatched part is a
ModelFormatError naming it."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter

from fixtures.ggufsplit import split_gguf
from goinfer import gguf_split, layout
from goinfer.errors import ModelFormatError
from goinfer.gguf import GGUFFile

# GGUF value types (the spec's numbering)
_U16, _I32 = 2, 5


def _kv(key: str, vtype: int, value: int) -> bytes:
    """One key/value pair as the GGUF spec encodes it: u64 key length, key, u32 type, value."""
    k = key.encode()
    return (
        struct.pack("<Q", len(k))
        + k
        + struct.pack("<I", vtype)
        + struct.pack({_U16: "<H", _I32: "<i"}[vtype], value)
    )


def _split_kvs(no: int, count: int, n_tensors: int) -> bytes:
    return (
        _kv("split.no", _U16, no)
        + _kv("split.count", _U16, count)
        + _kv("split.tensors.count", _I32, n_tensors)
    )


def _kv_region(path: Path) -> tuple[bytes, int, int]:
    """(bytes of the key/value section, tensor count, key count) read straight from the file."""
    data = path.read_bytes()
    magic, version, n_t, n_kv = struct.unpack_from("<4sIQQ", data, 0)
    assert magic == b"GGUF" and version == 3
    r = GGUFReader(str(path))
    end = r.tensors[0].field.offset if r.tensors else r.data_offset
    return data[24:end], n_t, n_kv


# ============================================================================ the real model


@pytest.fixture(scope="module")
def split_smollm2(smollm2_path, tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("split")
    return split_gguf(smollm2_path, d / "SmolLM2-135M-Instruct.Q4_1.gguf", 100)


@pytest.mark.slow
def test_parts_have_the_gguf_split_layout(smollm2_path, split_smollm2):
    """What gguf-split writes: part 1 = every key of the source in order, then split.no /
    split.count / split.tensors.count; the other parts only those three keys; the tensors in
    order, 100 per part; each part's tensor data 32-byte aligned from its own data section."""
    assert [p.name for p in split_smollm2] == [
        f"SmolLM2-135M-Instruct.Q4_1-{i:05d}-of-00003.gguf" for i in (1, 2, 3)
    ]
    src_kv, src_nt, src_nkv = _kv_region(smollm2_path)
    assert src_nt == 272
    kv1, nt1, nkv1 = _kv_region(split_smollm2[0])
    assert (nt1, nkv1) == (100, src_nkv + 3)
    assert kv1 == src_kv + _split_kvs(0, 3, 272)
    for i, p in enumerate(split_smollm2[1:], start=1):
        kv, nt, nkv = _kv_region(p)
        assert (nt, nkv) == ((100, 72)[i - 1], 3) and kv == _split_kvs(i, 3, 272)
    src = GGUFReader(str(smollm2_path))
    names = []
    for p in split_smollm2:
        r = GGUFReader(str(p))
        assert r.data_offset % 32 == 0
        for t in r.tensors:
            rel = t.data_offset - r.data_offset
            assert rel % 32 == 0
            names.append(t.name)
    assert names == [t.name for t in src.tensors]


@pytest.mark.slow
def test_split_model_reads_as_the_whole_file(smollm2_path, split_smollm2):
    whole, split = GGUFFile(smollm2_path), GGUFFile(split_smollm2[0])
    assert split.parts == split_smollm2 and whole.parts == [smollm2_path]
    assert split.tensor_names == whole.tensor_names
    assert split.file_size == sum(p.stat().st_size for p in split_smollm2)
    meta = dict(whole.metadata, **{"split.no": 0, "split.count": 3, "split.tensors.count": 272})
    assert split.metadata.keys() == meta.keys()
    for k, v in meta.items():
        assert (
            np.array_equal(split.metadata[k], v)
            if isinstance(v, np.ndarray)
            else split.metadata[k] == v
        )
    for n in whole.tensor_names:
        assert split.tensor_info(n) == whole.tensor_info(n)
        assert np.array_equal(split._rows(n)[2], whole._rows(n)[2]), n
    assert "3 parts" in repr(split)
    assert gguf_split.model_stem(split_smollm2[1]) == "SmolLM2-135M-Instruct.Q4_1"


@pytest.mark.slow
def test_split_logits_bit_identical(smollm2_path, split_smollm2, tmp_path, monkeypatch):
    """The split model's logits equal the whole file's bit for bit: loaded from the GGUF parts,
    and again from the layout cache the first load builds (keyed over all parts: its own file)."""
    from goinfer.model import Model

    monkeypatch.setenv("GOINFER_LAYOUT_DIR", str(tmp_path / "layouts"))
    ids = [1, 504, 3458, 314, 253, 1345, 28, 2, 17, 900, 42, 5]
    ref = Model.load(smollm2_path, progress=False, layout_cache=False).logits(ids)
    got = Model.load(split_smollm2[0], progress=False, layout_cache=False).logits(ids)
    assert np.array_equal(ref.view(np.uint32), got.view(np.uint32))
    built = Model.load(split_smollm2[0], progress=False, layout_cache=True)
    assert built.load_info.source == "built"
    mapped = Model.load(split_smollm2[0], progress=False, layout_cache=True)
    assert mapped.load_info.source == "layout" and mapped.load_info.path == built.load_info.path
    assert np.array_equal(ref.view(np.uint32), mapped.logits(ids).view(np.uint32))
    whole_key = layout.cache_path(GGUFFile(smollm2_path).fingerprint)
    assert built.load_info.path != whole_key


@pytest.mark.slow
def test_fingerprint_covers_every_part(split_smollm2, tmp_path):
    """A change in the last part's tensor data changes the key; the single-file fingerprint is
    the documented formula (unchanged for files that are not split)."""
    d = tmp_path / "copy"
    d.mkdir()
    copies = [Path(shutil.copy(p, d / p.name)) for p in split_smollm2]
    fp = GGUFFile(copies[0]).fingerprint
    assert fp == GGUFFile(split_smollm2[0]).fingerprint
    off = GGUFReader(str(copies[2])).data_offset
    with open(copies[2], "r+b") as fh:  # the first sampled slice of the last part's data
        fh.seek(off)
        b = fh.read(1)
        fh.seek(off)
        fh.write(bytes([b[0] ^ 0xFF]))
    assert GGUFFile(copies[0]).fingerprint != fp


def test_single_file_fingerprint_formula(tmp_path):
    p = _write(tmp_path / "m.gguf", {f"t{i}": np.full(64, i, np.float32) for i in range(3)})
    import hashlib
    import os

    data = p.read_bytes()
    off = GGUFReader(str(p)).data_offset
    h = hashlib.sha256(b"goinfer-gguf-fingerprint-v2\0")
    h.update(len(data).to_bytes(8, "little"))
    h.update(data[:off])
    step = max(1, (len(data) - off) // 256)
    for o in range(off, len(data), step):
        h.update(data[o : o + 4096])
    assert GGUFFile(p).fingerprint == h.hexdigest()
    assert os.path.getsize(p) == len(data)


# ============================================================================ broken sets of parts


def _write(
    path: Path,
    tensors: dict[str, np.ndarray],
    kv: dict | None = None,
    *,
    arch: bool = True,
    split_max_tensors: int = 0,
) -> Path:
    """A small GGUF (float32 tensors) written with the gguf package; split when asked."""
    w = GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    if not arch:
        w.kv_data[0].clear()  # a later part has no general.architecture
    for k, (v, t) in (kv or {}).items():
        w.add_key_value(k, v, t)
    for name, a in tensors.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _tensors(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"blk.{i}.w": rng.standard_normal(32).astype(np.float32) for i in range(n)}


def _split(d: Path, name: str, n_tensors: int, per_part: int, seed: int = 0) -> list[Path]:
    d.mkdir(parents=True, exist_ok=True)
    w = _write(d / f"{name}.gguf", _tensors(n_tensors, seed), split_max_tensors=per_part)
    return sorted(d.glob(f"{w.stem}-*-of-*.gguf"))


def test_small_split_loads(tmp_path):
    parts = _split(tmp_path, "m", 5, 2)
    assert [p.name for p in parts] == [f"m-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    g = GGUFFile(parts[0])
    assert g.tensor_names == [f"blk.{i}.w" for i in range(5)] and g.parts == parts
    ref = _tensors(5)
    for n, a in ref.items():
        assert np.array_equal(g.load_f32(n), a)
    g.close()
    assert len(g.fingerprint) == 64  # kept after close


def test_missing_part_names_it(tmp_path):
    parts = _split(tmp_path, "m", 5, 2)
    parts[1].unlink()
    with pytest.raises(ModelFormatError, match=r"part 2 of 3 of this split model is missing") as ei:
        GGUFFile(parts[0])
    assert str(parts[1]) in str(ei.value)


def test_later_part_given_names_the_first(tmp_path):
    parts = _split(tmp_path, "m", 5, 2)
    with pytest.raises(ModelFormatError, match=r"is part 2 of a model split in 3 parts") as ei:
        GGUFFile(parts[1])
    assert str(parts[0]) in str(ei.value)


def test_part_of_another_split(tmp_path):
    parts = _split(tmp_path / "a", "m", 5, 2)
    other = _split(tmp_path / "b", "m", 7, 2, seed=1)  # 4 parts
    shutil.copy(other[1], parts[1])
    with pytest.raises(ModelFormatError, match=r"split in 4 parts, expected 3") as ei:
        GGUFFile(parts[0])
    assert str(parts[1]) in str(ei.value)


def test_parts_out_of_order(tmp_path):
    parts = _split(tmp_path, "m", 5, 2)
    shutil.copy(parts[2], parts[1])
    with pytest.raises(ModelFormatError, match=r"says it is part 3 of 3, expected part 2") as ei:
        GGUFFile(parts[0])
    assert str(parts[1]) in str(ei.value)


def test_part_with_another_tensor_total(tmp_path):
    parts = _split(tmp_path / "a", "m", 5, 2)
    other = _split(tmp_path / "b", "m", 6, 2, seed=1)  # also 3 parts, 6 tensors
    shutil.copy(other[1], parts[1])
    with pytest.raises(ModelFormatError, match=r"split.tensors.count is 6, the first part says 5"):
        GGUFFile(parts[0])


def test_not_a_part(tmp_path):
    parts = _split(tmp_path, "m", 5, 2)
    _write(parts[1], _tensors(2, 3))  # a whole model where part 2 should be
    with pytest.raises(ModelFormatError, match=r"not a part of a split model") as ei:
        GGUFFile(parts[0])
    assert str(parts[1]) in str(ei.value)


def test_first_part_without_the_part_name(tmp_path):
    parts = _split(tmp_path, "m", 5, 2)
    renamed = parts[0].rename(tmp_path / "model.gguf")
    with pytest.raises(ModelFormatError, match=r"does not say where the other parts are"):
        GGUFFile(renamed)


def _hand_part(path: Path, names: list[str], no: int, count: int, total: int) -> Path:
    """One part written by hand (its split keys given, not computed)."""
    from gguf import GGUFValueType as V

    kv = {
        "split.no": (no, V.UINT16),
        "split.count": (count, V.UINT16),
        "split.tensors.count": (total, V.INT32),
    }
    return _write(path, {n: np.zeros(32, np.float32) for n in names}, kv, arch=no == 0)


def test_duplicate_tensor_across_parts(tmp_path):
    first = _hand_part(tmp_path / "m-00001-of-00002.gguf", ["a", "b"], 0, 2, 4)
    _hand_part(tmp_path / "m-00002-of-00002.gguf", ["c", "a"], 1, 2, 4)
    with pytest.raises(ModelFormatError, match=r"tensor 'a' is also in an earlier part"):
        GGUFFile(first)


def test_tensor_total_checked(tmp_path):
    first = _hand_part(tmp_path / "m-00001-of-00002.gguf", ["a", "b"], 0, 2, 5)
    _hand_part(tmp_path / "m-00002-of-00002.gguf", ["c", "d"], 1, 2, 5)
    with pytest.raises(
        ModelFormatError, match=r"the 2 parts hold 4 tensors, split.tensors.count says 5"
    ):
        GGUFFile(first)


def test_part_names():
    assert gguf_split.parse_part_name("x-Q4_K_M-00002-of-00003.gguf") == ("x-Q4_K_M", 2, 3)
    assert gguf_split.parse_part_name("x-00004-of-00003.gguf") is None
    assert gguf_split.parse_part_name("x.gguf") is None
    assert gguf_split.part_name("x", 1, 12) == "x-00001-of-00012.gguf"
    assert gguf_split.model_stem("d/x.gguf") == "x"
