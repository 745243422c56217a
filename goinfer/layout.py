"""The layout cache: a model's weights in goinfer's native layout, written once, memory-mapped on
every later load.

    weights, info = load(gguf, family, config, progress=True)   # what Model does
    path = prepare("model.gguf")                                # `goinfer pull`: build + verify
    verify(path)                                                # full check, raises LayoutError

Converting a GGUF's tensors to the kernels' layout (goinfer/quant.py, goinfer/gguf.py) reads and
rewrites every weight: seconds per GB.  The first load of a model writes the result to
``$GOINFER_HOME/layouts/<fingerprint>-<variant>.layout`` (``GOINFER_LAYOUT_DIR`` overrides the
directory, ``GOINFER_LAYOUT_CACHE=0`` turns the cache off), 2 MB at a time, so that a file system
that caches files in large folios holds it in 2 MB ones; later loads map that file read-only
and shared, asking for 2 MB pages, and fault it all in, so a load costs about what mapping the
file costs, and every process that loads the model shares the same physical pages.  The
exception is a table that steps read a row at a time (an embedding not tied to the LM head:
Family.row_table_names): it is not faulted in, and row_table.py reads the rows a step needs
from the file.  Where the system maps less than half of a large layout with 2 MB pages (a
file system that caches files in 4 KB pages, or pages that came in piecemeal), the weights
are copied into anonymous huge pages instead: decode reads every weight once per token, and
from 4 KB pages it ran up to 14% slower (place_weights; ``GOINFER_LAYOUT_PAGES=map`` keeps the
mapping, ``=copy`` always copies).

The file is keyed by the GGUF's fingerprint (header, size and sampled data, of every part of a
split model: gguf.py) and the kernel variant in its name; its header also carries LAYOUT_VERSION
and the family name, and a header that does not match them (another goinfer version, a
hand-copied file) is stale.

File format (little-endian):

    [0, 64)            preamble: MAGIC, u32 FORMAT
    [4096, H)          arrays, each at a multiple of 64 bytes
    [H, H + n)         header: JSON (arrays table, weights tree, conversions, key fields)
    [end - 72, end)    footer: MAGIC, u32 FORMAT, u64 H, u64 n, sha256 of the header (32 bytes)

What is verified when:

* every load: preamble and footer, the header's sha256, the key fields (fingerprint, variant,
  layout version, family), that the file has exactly the size the header says and that every
  array lies inside it;
* every load, cheaply: the file's (size, mtime, inode, device) against the stamp
  ``<file>.ok`` written right after the file was built or last verified.  If they differ (the
  file was modified, replaced or copied since), the load also checks every array's crc32
  against the header (reads the whole file, once) and rewrites the stamp;
* at build, and by ``goinfer pull`` / ``verify()``: every array's crc32.

A stale or corrupt file is never used: it is rebuilt from the GGUF, with a warning.  Writing
goes to a temporary file in the same directory, fsynced and renamed into place; if it fails
(a full disk, a read-only directory), the temporary file is removed, a warning says why, and
the model loads from the GGUF into process memory as if the cache were off.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import mmap
import os
import struct
import tempfile
import time
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from goinfer import memory
from goinfer.errors import GoinferError
from goinfer.paths import goinfer_home
from goinfer.quant import QWeight

LAYOUT_VERSION = 4  # bump whenever the native layout or the weights tree of a family changes (2: q6_k, 3: q4_k, q5_k, 4: q5_0, q5_1)
MAGIC = b"GOINFER-LAYOUT\0\0"  # 16 bytes
FORMAT = 1
_FOOTER = struct.Struct("<16sIQQ32s")  # magic, format, header offset, header length, sha256
_FOOTER_SIZE = 72  # _FOOTER (68 bytes) padded to 8
_DATA0 = 4096
_ALIGN = 64
_CHUNK = 1 << 24  # bytes per crc32 / write step
_WINDOW = memory.HUGE_PAGE  # the writer's unit (see _Writer._write)
_COPY_MIN = 32 << 20  # place_weights: smaller layouts stay mapped in "auto" mode
_DTYPES = {"|u1", "|i1", "<f2", "<f4", "<u2", "<i4", "<i8", "<f8"}


class LayoutError(GoinferError):
    """A layout cache file is stale or corrupt (internal: the load rebuilds it with a warning)."""


class LayoutWarning(UserWarning):
    """The layout cache was rebuilt, or could not be written (the model still loads)."""


class _WriteFailed(Exception):
    """Writing the cache failed (a full disk, a read-only directory): load without it."""


# ============================================================================ where and whether


def enabled_by_env() -> bool:
    """GOINFER_LAYOUT_CACHE=0 turns the layout cache off (default on)."""
    return os.environ.get("GOINFER_LAYOUT_CACHE", "1").strip().lower() not in (
        "0",
        "false",
        "off",
        "no",
    )


PAGES_MODES = ("auto", "map", "copy")


def pages_mode() -> str:
    """GOINFER_LAYOUT_PAGES: how the mapped weights are backed (see place_weights).  "auto"
    (default): the file mapping where the system maps most of it with 2 MB pages, else a copy
    in anonymous huge pages; "map": always the file mapping; "copy": always the copy."""
    mode = os.environ.get("GOINFER_LAYOUT_PAGES", "auto").strip().lower() or "auto"
    if mode not in PAGES_MODES:
        raise ValueError(
            f"GOINFER_LAYOUT_PAGES must be one of {', '.join(PAGES_MODES)}, got {mode!r}"
        )
    return mode


def cache_dir() -> Path:
    """$GOINFER_LAYOUT_DIR, default $GOINFER_HOME/layouts."""
    d = os.environ.get("GOINFER_LAYOUT_DIR")
    if d:
        return Path(d).expanduser()
    return goinfer_home() / "layouts"


def kernel_variant() -> str:
    from goinfer._kernels import _config

    return str(_config.variant())


def cache_path(fingerprint: str, variant: str | None = None) -> Path:
    return cache_dir() / f"{fingerprint[:32]}-{variant or kernel_variant()}.layout"


def weight_classes(family) -> dict[str, type] | None:
    """The classes a family's weights tree holds, by name (the family's own ``weight_types``,
    models/family.py, and QWeight), or None when the family is not layout-cached."""
    types = family.declared("weight_types")
    if not types:
        return None
    by_name = {c.__name__: c for c in (QWeight, *types)}
    assert len(by_name) == len(types) + 1, "layout cache: two weight classes share a name"
    return by_name


# ============================================================================ writing


class _Ref:
    """An array already written to the file (index into its table)."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i


class _Writer:
    """Writes arrays to a temporary file next to dest; finish() adds header and footer,
    commit() renames it into place.  Every OSError becomes _WriteFailed."""

    def __init__(self, dest: Path, classes: dict[str, type]):
        self.dest = dest
        self.table: list[list] = []  # [offset, nbytes, dtype, shape, crc32]
        self._classes = classes  # the dataclasses it stores (weight_classes)
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=dest.name + ".", suffix=".tmp", dir=dest.parent)
            self.tmp = Path(tmp)
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o644 & ~umask)  # readable like any cache file (mkstemp makes 0600)
            self.f = os.fdopen(fd, "wb", buffering=0)
        except OSError as e:
            self.discard()
            raise _WriteFailed(e) from e
        self.pos = 0  # bytes written so far, staged ones included
        self.stage = bytearray()  # the bytes after the last whole window written
        head = MAGIC + struct.pack("<I", FORMAT)
        self._write(head + b"\0" * (_DATA0 - len(head)))

    # Writes go out in whole 2 MB windows of the file (offsets k * 2 MB): a file system that
    # caches files in large folios (ext4 from Linux 6.16, XFS) then holds every window in one
    # 2 MB folio, which the mapping of a later load maps with one 2 MB page.  A write that
    # covers part of a window fills it with smaller folios: writing each array as it came cut
    # one window per array boundary, a third of a 3B model's layout on 4 KB pages.
    def _write(self, b) -> None:
        H = _WINDOW
        b = memoryview(b).cast("B")
        self.pos += len(b)
        try:
            if self.stage:
                take = min(len(b), H - len(self.stage))
                self.stage += b[:take]
                b = b[take:]
                if len(self.stage) == H:
                    self._out(self.stage)
                    self.stage = bytearray()
            whole = len(b) // H * H
            if whole:  # the stage is empty here: b starts at a window boundary
                self._out(b[:whole])
            self.stage += b[whole:]
        except OSError as e:
            raise _WriteFailed(e) from e

    def _out(self, b) -> None:
        """Write all of b at the file's position (a regular file may take it in parts)."""
        b = memoryview(b)
        while b:
            n = self.f.write(b)
            b = b[n:]

    def put(self, a: np.ndarray) -> int:
        """Write one array (C order, little-endian) -> its index in the table."""
        a = np.ascontiguousarray(a)
        if a.dtype.str not in _DTYPES:
            raise TypeError(f"layout cache: unsupported array dtype {a.dtype}")
        pad = -self.pos % _ALIGN
        if pad:
            self._write(b"\0" * pad)
        off = self.pos
        flat = a.reshape(-1).view(np.uint8)
        crc = 0
        for i in range(0, flat.size, _CHUNK):
            chunk = flat[i : i + _CHUNK]
            crc = zlib.crc32(chunk, crc)
            self._write(memoryview(chunk))
        self.table.append([off, int(a.nbytes), a.dtype.str, list(a.shape), crc])
        return len(self.table) - 1

    def spill(self, obj):
        """Write every array of obj (a QWeight, a layer, a list...) and put references to them
        in their place (in place where obj is mutable); returns obj.  The caller drops the
        arrays, so memory holds about one layer at a time during a build."""
        if isinstance(obj, np.ndarray):
            return _Ref(self.put(obj))
        if isinstance(obj, list):
            for i, v in enumerate(obj):
                obj[i] = self.spill(v)
            return obj
        if isinstance(obj, dict):
            for k, v in obj.items():
                obj[k] = self.spill(v)
            return obj
        if type(obj).__name__ in self._classes and dataclasses.is_dataclass(obj):
            for f in dataclasses.fields(obj):
                setattr(obj, f.name, self.spill(getattr(obj, f.name)))
            return obj
        return obj

    def encode(self, obj):
        """The weights tree as JSON-able data (arrays not yet written are written now)."""
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, (int, np.integer)):
            return int(obj)
        if isinstance(obj, (float, np.floating)):
            return float(obj)
        if isinstance(obj, _Ref):
            return {"a": obj.i}
        if isinstance(obj, np.ndarray):
            return {"a": self.put(obj)}
        if isinstance(obj, (list, tuple)):
            return {"l": [self.encode(v) for v in obj]}
        if isinstance(obj, dict):
            return {"d": {str(k): self.encode(v) for k, v in obj.items()}}
        name = type(obj).__name__
        if name in self._classes and dataclasses.is_dataclass(obj):
            return {
                "c": name,
                "f": {
                    f.name: self.encode(getattr(obj, f.name))
                    for f in dataclasses.fields(obj)
                    if f.init
                },
            }
        raise TypeError(f"layout cache: cannot store a {name}")

    def finish(self, header: dict) -> None:
        header["arrays"] = self.table
        pad = -self.pos % _ALIGN
        if pad:
            self._write(b"\0" * pad)
        h_off = self.pos
        # the header states the file's final size, which depends on the header's own length
        header["file_size"] = 0
        while True:  # a fixed point within a few steps (the size's digits settle)
            hb = json.dumps(header, separators=(",", ":")).encode()
            size = h_off + len(hb) + (-(h_off + len(hb)) % 8) + _FOOTER_SIZE
            if header["file_size"] == size:
                break
            header["file_size"] = size
        self._write(hb)
        self._write(b"\0" * (-(h_off + len(hb)) % 8))
        foot = _FOOTER.pack(MAGIC, FORMAT, h_off, len(hb), hashlib.sha256(hb).digest())
        self._write(foot + b"\0" * (_FOOTER_SIZE - len(foot)))
        if self.pos != header["file_size"]:
            raise AssertionError("layout cache: header size did not converge")
        try:
            self._out(self.stage)  # the last, partial window
            self.stage = bytearray()
            os.fsync(self.f.fileno())
            self.f.close()
        except OSError as e:
            raise _WriteFailed(e) from e

    def commit(self) -> None:
        try:
            os.replace(self.tmp, self.dest)
        except OSError as e:
            raise _WriteFailed(e) from e
        self.tmp = None

    def discard(self) -> None:
        f = getattr(self, "f", None)
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()
        tmp = getattr(self, "tmp", None)
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            self.tmp = None


# ============================================================================ reading


@dataclass
class Layout:
    """A mapped layout file: its header and read-only views of its arrays (in the mapping, or
    in the anonymous copy place_weights made: file offset o at copy[o + shift]; the arrays of
    row tables always in the mapping, where nothing populated them: row_table.py)."""

    path: Path
    header: dict
    mm: mmap.mmap
    copy: mmap.mmap | None = None
    shift: int = 0
    pages: str = "small"  # "huge" (the mapping, 2 MB entries), "copied", "small"
    huge_share: float | None = None  # the share of the arrays' pages mapped 2 MB at a time
    # the row tables: {name: [(file offset, bytes) of each of its arrays]}
    row_tables: dict[str, list[tuple[int, int]]] = dataclasses.field(default_factory=dict)

    @property
    def dense(self) -> list[tuple[int, int]]:
        """[lo, hi) file ranges of the arrays outside row tables (what is populated and
        copied), in order."""
        return _dense(self.header, self.row_tables)

    def array(self, i: int) -> np.ndarray:
        off, nbytes, dt, shape, _ = self.header["arrays"][i]
        dtype = np.dtype(dt)
        if any(lo == off for lo, _ in _spans(self.row_tables)):
            buf, base = self.mm, 0
        else:
            buf, base = (self.mm, 0) if self.copy is None else (self.copy, self.shift)
        a = np.frombuffer(buf, dtype=dtype, count=nbytes // dtype.itemsize, offset=off + base)
        a.flags.writeable = False
        return a.reshape(shape)

    def weights(self, classes: dict[str, type]):
        """The weights tree, its dataclasses rebuilt from classes (weight_classes)."""
        return _decode(self.header["tree"], self, classes)


def _decode(node, lay: Layout, classes: dict):
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if not isinstance(node, dict) or len(node) not in (1, 2):
        raise LayoutError(f"{lay.path}: malformed weights tree")
    if "a" in node:
        i = node["a"]
        if not isinstance(i, int) or not 0 <= i < len(lay.header["arrays"]):
            raise LayoutError(f"{lay.path}: array index {i!r} out of range")
        return lay.array(i)
    if "l" in node:
        return [_decode(v, lay, classes) for v in node["l"]]
    if "d" in node:
        return {k: _decode(v, lay, classes) for k, v in node["d"].items()}
    if "c" in node:
        cls = classes.get(node["c"])
        if cls is None:
            raise LayoutError(f"{lay.path}: unknown class {node['c']!r} in the weights tree")
        try:
            return cls(**{k: _decode(v, lay, classes) for k, v in node["f"].items()})
        except TypeError as e:
            raise LayoutError(f"{lay.path}: fields of {node['c']} do not match ({e})") from None
    raise LayoutError(f"{lay.path}: malformed weights tree node {sorted(node)}")


def _read_header(path: Path, fh) -> dict:
    """Preamble, footer, header checksum and array bounds; raises LayoutError."""
    size = os.fstat(fh.fileno()).st_size
    if size < _DATA0 + _FOOTER_SIZE:
        raise LayoutError(f"{path}: {size} bytes, too short for a layout file")
    head = fh.read(len(MAGIC) + 4)
    fh.seek(size - _FOOTER_SIZE)
    foot = fh.read(_FOOTER_SIZE)
    if head != MAGIC + struct.pack("<I", FORMAT):
        raise LayoutError(f"{path}: not a goinfer layout file of format {FORMAT}")
    magic, fmt, h_off, h_len, digest = _FOOTER.unpack_from(foot)
    if magic != MAGIC or fmt != FORMAT or h_off < _DATA0 or h_off + h_len > size - _FOOTER_SIZE:
        raise LayoutError(f"{path}: bad footer (truncated or corrupt file)")
    fh.seek(h_off)
    hb = fh.read(h_len)
    if hashlib.sha256(hb).digest() != digest:
        raise LayoutError(f"{path}: header checksum mismatch (corrupt file)")
    try:
        header = json.loads(hb)
        arrays = header["arrays"]
        if header["file_size"] != size:
            raise LayoutError(f"{path}: {size} bytes, the header says {header['file_size']}")
        for off, nbytes, dt, shape, _crc in arrays:
            if dt not in _DTYPES:
                raise LayoutError(f"{path}: unsupported dtype {dt!r}")
            n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
            if n != nbytes or off % _ALIGN or off < _DATA0 or off + nbytes > h_off:
                raise LayoutError(f"{path}: array at {off} ({nbytes} bytes) out of bounds")
    except (ValueError, KeyError, TypeError) as e:
        raise LayoutError(f"{path}: malformed header ({e})") from None
    return header


def _check_key(path: Path, header: dict, expect: dict) -> None:
    for k, v in expect.items():
        if header.get(k) != v:
            raise LayoutError(f"{path}: stale ({k} is {header.get(k)!r}, this load needs {v!r})")


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".ok")


def _stamp_of(st: os.stat_result) -> dict:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "dev": st.st_dev}


def _write_stamp(path: Path, st: os.stat_result) -> None:
    sp = _stamp_path(path)
    with contextlib.suppress(OSError):  # no stamp: the next load verifies in full again
        fd, tmp = tempfile.mkstemp(prefix=sp.name + ".", suffix=".tmp", dir=path.parent)
        try:
            os.fchmod(fd, os.stat(path).st_mode & 0o666)
            with os.fdopen(fd, "w") as f:
                json.dump(_stamp_of(st), f)
            os.replace(tmp, sp)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def _stamp_ok(path: Path, st: os.stat_result) -> bool:
    try:
        return json.loads(_stamp_path(path).read_text()) == _stamp_of(st)
    except (OSError, ValueError):
        return False


def _check_arrays(lay: Layout) -> None:
    """crc32 of every array against the header (reads the whole file)."""
    for i, (off, nbytes, _dt, _shape, crc) in enumerate(lay.header["arrays"]):
        got = 0
        for p in range(off, off + nbytes, _CHUNK):
            got = zlib.crc32(memoryview(lay.mm)[p : min(p + _CHUNK, off + nbytes)], got)
        if got != crc:
            raise LayoutError(
                f"{lay.path}: array {i} (at byte {off}) fails its checksum (corrupt file)"
            )


def _address(buf) -> int:
    a = np.frombuffer(buf, np.uint8, count=1)
    return int(a.ctypes.data)


def _array_ids(node, out: list[int]) -> list[int]:
    """Indices of the arrays in an encoded weights-tree node (see _decode)."""
    if isinstance(node, dict):
        if "a" in node:
            out.append(node["a"])
        for v in node.get("l") or [*node.get("d", {}).values(), *node.get("f", {}).values()]:
            _array_ids(v, out)
    return out


def _row_tables(header: dict, names) -> dict[str, list[tuple[int, int]]]:
    """{name: [(file offset, bytes) of its arrays]} of the top-level weights that names(top)
    gives (Family.row_table_names; None: none)."""
    tree = header["tree"]
    top = tree.get("d") if isinstance(tree, dict) else None
    if names is None or not isinstance(top, dict):
        return {}
    arrays = header["arrays"]
    out = {}
    for name in names(top):
        ids = _array_ids(top.get(name), [])
        if ids:
            out[name] = [(arrays[i][0], arrays[i][1]) for i in sorted(ids)]
    return out


def _spans(row_tables: dict) -> list[tuple[int, int]]:
    """(file offset, bytes) of every array of the row tables ({name: spans})."""
    return [x for v in row_tables.values() for x in v]


def _dense(header: dict, row_tables: dict) -> list[tuple[int, int]]:
    """[lo, hi) file ranges of the arrays outside the row tables ({name: spans}), in order."""
    holes = sorted((lo, lo + n) for lo, n in _spans(row_tables))
    end = max((off + n for off, n, *_ in header["arrays"]), default=_DATA0)
    out, lo = [], _DATA0
    for a, b in holes:
        if a > lo:
            out.append((lo, a))
        lo = max(lo, b)
    if end > lo:
        out.append((lo, end))
    return out


def _let_go(mm: mmap.mmap, lo: int, hi: int) -> None:
    """madvise(MADV_DONTNEED) on the whole pages of mm inside [lo, hi).  They leave the
    process; a shared file mapping reads them back from the page cache when touched again."""
    P = mmap.PAGESIZE
    a, b = -(-lo // P) * P, min(len(mm), hi) // P * P
    if b > a:
        with contextlib.suppress(AttributeError, OSError):  # no madvise: the pages stay mapped
            mm.madvise(mmap.MADV_DONTNEED, a, b - a)


def _map(fd: int, populate: bool, dense: list[tuple[int, int]] | None = None) -> mmap.mmap:
    """The file, mapped read-only and shared.  populate: asks for 2 MB pages first (a file
    system that caches files in large folios then reads it 2 MB at a time), then faults in the
    dense [lo, hi) file ranges (None: all of it) without the GIL; before Linux 5.14,
    MAP_POPULATE (all of it) instead."""
    if not populate:
        return mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    mm = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    base = _address(mm)
    whole = [(base, len(mm))]
    memory.want_huge_pages(whole)
    ranges = whole if dense is None else [(base + lo, hi - lo) for lo, hi in dense]
    if not memory.populate_read(ranges):
        mm.close()
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mm = mmap.mmap(fd, 0, flags=flags, prot=mmap.PROT_READ)
    return mm


def _anonymous(n: int) -> mmap.mmap:
    """n bytes of private anonymous memory (place_weights' copy)."""
    return mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def place_weights(lay: Layout, mode: str | None = None, progress: bool = False, name: str = ""):
    """Back the arrays of a mapped layout with 2 MB pages where the system allows.

    Decode streams every weight once per token: on 4 KB pages each 4 KB costs a TLB miss (two
    levels of page walk in a virtual machine) and restarts the hardware prefetcher.  Decode of
    the Llama-3.2-1B Q4_K_M shape ran 9-14% faster from the copy than from a mapping on 4 KB
    pages on a 2-core AMD EPYC Zen 4 guest, 2-3% on a Zen 5 one (docs/benchmarks.md, "Weight
    pages").  Whether the page cache holds the file in 2 MB folios depends on the file system
    and on how the pages came in, so measure: in "auto" mode, a mapping less than half of it mapped 2 MB at a time is copied
    into anonymous memory that asks for huge pages, and the file's pages are let go as the
    copy proceeds (the process's resident memory stays about one copy).  A copy is the
    process's own: processes that load the model each hold one.  Layouts under 32 MB always
    stay mapped, and so does any layout when there is no memory for the copy (with a warning
    when "copy" asked for one).  Sets lay.pages and lay.huge_share."""
    mode = mode or pages_mode()
    arrays = lay.header["arrays"]
    end = max((off + n for off, n, *_ in arrays), default=_DATA0)
    share = memory.huge_share(_address(lay.mm))
    lay.huge_share = share
    if mode == "map" or (
        mode == "auto"
        and (end < _COPY_MIN or share is None or share >= 0.5 or not memory.huge_pages_available())
    ):
        lay.pages = "huge" if share is not None and share >= 0.5 else "small"
        return
    H = memory.HUGE_PAGE
    try:
        copy = _anonymous(end + H)
    except OSError as e:  # no memory for a copy: the mapping serves, as it is
        lay.pages = "huge" if share is not None and share >= 0.5 else "small"
        if mode == "copy":
            warnings.warn(
                f"goinfer: GOINFER_LAYOUT_PAGES=copy: no memory for a copy of {name or lay.path}"
                f" ({e}); the weights stay mapped",
                LayoutWarning,
                stacklevel=3,
            )
        return
    base = _address(copy)
    shift = -base % H  # file offset 0 at a 2 MB boundary
    memory.want_huge_pages([(base, end + H)])
    bar = None
    if progress and end >= 1 << 28:
        from tqdm.auto import tqdm

        bar = tqdm(
            total=sum(hi - lo for lo, hi in lay.dense),
            desc=f"{name}: weights into huge pages",
            unit="B",
            unit_scale=True,
            leave=False,
            disable=None,
        )
    step = 1 << 26
    for r0, r1 in lay.dense:  # the row tables are not copied (row_table.py reads them)
        for lo in range(r0, r1, step):
            hi = min(lo + step, r1)
            dst = np.frombuffer(copy, np.uint8, count=hi - lo, offset=shift + lo)
            dst[:] = np.frombuffer(lay.mm, np.uint8, count=hi - lo, offset=lo)
            del dst
            _let_go(lay.mm, lo, hi)
            if bar is not None:
                bar.update(hi - lo)
    if bar is not None:
        bar.close()
    lay.copy, lay.shift, lay.pages = copy, shift, "copied"
    lay.huge_share = memory.huge_share(base)


def open_layout(
    path: Path,
    expect: dict,
    *,
    full_check: bool = False,
    populate: bool = True,
    row_table_names=None,
) -> Layout:
    """Map a layout file read-only after the checks of every load (see the module docstring);
    raises LayoutError if it is stale or corrupt, FileNotFoundError if it is not there.
    row_table_names(top) names the top-level weights read a row at a time
    (Family.row_table_names): they are not populated (row_table.py reads them)."""
    with open(path, "rb") as fh:
        header = _read_header(path, fh)
        _check_key(path, header, expect)
        st = os.fstat(fh.fileno())
        spans = _row_tables(header, row_table_names)
        mm = _map(fh.fileno(), populate, _dense(header, spans))
    lay = Layout(path, header, mm, row_tables=spans)
    if full_check or not _stamp_ok(path, st):
        _check_arrays(lay)
        _write_stamp(path, st)
        for lo, n in _spans(spans):  # the check read them
            _let_go(mm, lo, lo + n)
    return lay


def verify(path) -> dict:
    """Full check of a layout file (footer, header, every array's crc32); returns its header.
    Raises LayoutError if it is corrupt."""
    path = Path(path)
    with open(path, "rb") as fh:
        header = _read_header(path, fh)
        mm = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
    try:
        _check_arrays(Layout(path, header, mm))
    finally:
        mm.close()
    return header


# ============================================================================ loading a model's weights


@dataclass
class LoadInfo:
    """How a model's weights were loaded."""

    source: str  # "layout" (mapped cache), "built" (cache written now), "gguf" (no cache)
    path: Path | None = None  # the layout file, when one is mapped
    reason: str = ""  # why not from the cache, when not
    conversions: list | None = None  # ConversionSummary rows of the build (from the header)
    pages: str = ""  # how the mapped weights are backed: "huge", "copied", "small" (place_weights)
    huge_share: float | None = None  # the share of their pages mapped 2 MB at a time
    # {name: RowTable} of the weights read a row at a time from the file (row_table.py)
    row_tables: dict = dataclasses.field(default_factory=dict)
    # [lo, hi) ranges of the layout file held in memory (all but the row tables), in order
    dense: list = dataclasses.field(default_factory=list)


@contextlib.contextmanager
def _lock(path: Path):
    """Exclusive flock on <path>.lock while a layout is checked or built (another process
    loading the same model waits, then maps what the first one built)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path.with_name(path.name + ".lock"), "a+b")
    except OSError:
        yield  # read-only directory: no lock (the build will fail to write and fall back)
        return
    with fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _bar(progress: bool, total: int, desc: str):
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="layer", leave=False, disable=None)


def _expect(g, family, variant: str) -> dict:
    return {
        "format": "goinfer-layout",
        "layout_version": LAYOUT_VERSION,
        "fingerprint": g.fingerprint,
        "variant": variant,
        "family": family.__name__,
    }


def _from_gguf(g, family, cfg, progress: bool, name: str, keep):
    bar = _bar(progress, cfg.n_layers, f"loading {name} (first load: writing its layout cache)")
    try:
        return family.load_weights(g, cfg, bar.update if bar is not None else None, keep)
    finally:
        if bar is not None:
            bar.close()


def _build(g, family, cfg, path: Path, expect: dict, progress: bool, name: str):
    """Load from the GGUF while writing the layout file; returns the mapped Layout."""
    w = _Writer(path, weight_classes(family))
    try:
        weights = _from_gguf(g, family, cfg, progress, name, keep=w.spill)
        header = dict(expect)
        header["tree"] = w.encode(weights)
        del weights
        if hasattr(g, "release_pages"):
            g.release_pages()  # the GGUF's pages were read once; the layout replaces them
        from goinfer._version import __version__

        header.update(
            goinfer_version=__version__,
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            gguf={
                "path": str(g.path),
                "size": g.file_size,
                "parts": len(getattr(g, "parts", ()) or (g.path,)),
            },
            conversions=g.conversion_summary().as_dicts(),
        )
        w.finish(header)
        w.commit()
    finally:
        w.discard()
    return open_layout(path, expect, row_table_names=getattr(family, "row_table_names", None))


def _loaded(lay: Layout, classes, source: str, mode: str, progress: bool, name: str):
    from goinfer.row_table import RowTable

    place_weights(lay, mode, progress=progress, name=name)
    weights = lay.weights(classes)
    base = _address(lay.mm)
    tables = {}
    for key in lay.row_tables:
        w = weights[key]
        offsets = {
            f: a.ctypes.data - base for f in ("qs", "d", "m") if (a := getattr(w, f)) is not None
        }
        tables[key] = RowTable(lay.path, w, offsets)
    info = LoadInfo(
        source,
        lay.path,
        conversions=lay.header.get("conversions"),
        pages=lay.pages,
        huge_share=lay.huge_share,
        row_tables=tables,
        dense=lay.dense,
    )
    return weights, info


def load(g, family, cfg, *, enabled: bool | None = None, progress: bool = True, name: str = ""):
    """The weights dict of family.load_weights for the GGUF g, mapped from its layout cache
    (built first if it is missing, stale or corrupt), or None when the family should load
    itself from the GGUF (cache off, a family that is not cached, writing failed).
    Returns (weights or None, LoadInfo)."""
    name = name or Path(g.path).stem
    if enabled is None:
        enabled = enabled_by_env()
    if not enabled:
        return None, LoadInfo("gguf", reason="layout cache off")
    classes = weight_classes(family)
    if classes is None:
        return None, LoadInfo("gguf", reason=f"{family.__name__} is not cached")
    mode = pages_mode()  # a bad setting fails before anything is read
    variant = kernel_variant()
    path = cache_path(g.fingerprint, variant)
    expect = _expect(g, family, variant)
    with _lock(path):
        try:
            lay = open_layout(
                path, expect, row_table_names=getattr(family, "row_table_names", None)
            )
        except (FileNotFoundError, NotADirectoryError):
            lay = None  # not built yet
        except (LayoutError, OSError, ValueError) as e:
            lay = None
            warnings.warn(
                f"goinfer: rebuilding the layout cache of {name}: {e}", LayoutWarning, stacklevel=3
            )
        if lay is not None:
            return _loaded(lay, classes, "layout", mode, progress, name)
        try:
            lay = _build(g, family, cfg, path, expect, progress, name)
        except _WriteFailed as e:
            err = e.__cause__ or e
            warnings.warn(
                f"goinfer: could not write the layout cache of {name} to {path.parent} "
                f"({err}); loading from the GGUF (the next load will try again)",
                LayoutWarning,
                stacklevel=3,
            )
            g.conversion_summary().rows.clear()  # the failed build's partial counts
            return None, LoadInfo("gguf", reason=f"write failed: {err}")
        return _loaded(lay, classes, "built", mode, progress, name)


def prepare(path, *, progress: bool = True) -> Path:
    """Build (or fully verify) the layout cache of a GGUF file: what `goinfer pull` runs.
    Returns the layout file's path."""
    from goinfer.gguf import GGUFFile
    from goinfer.models import read_config

    with GGUFFile(path) as g:
        family, cfg = read_config(g)  # UnsupportedArchitectureError if goinfer does not run it
        _weights, info = load(g, family, cfg, enabled=True, progress=progress)
        del _weights
        if info.path is None:
            raise LayoutError(f"{path}: no layout cache ({info.reason})")
        if info.source == "layout":
            verify(info.path)
        _write_stamp(info.path, os.stat(info.path))
        return info.path
