"""Reading GGUF model files and converting their tensors to goinfer's native weight kinds.

    f = GGUFFile("model.gguf")
    f.arch, f.metadata, f.get("tokenizer.ggml.tokens"), f.arch_get("block_count")
    w = f.load_weight("blk.0.attn_q.weight")      # QWeight (n_out, n_in), native kind
    ws = f.load_experts("blk.0.ffn_up_exps.weight")  # list of QWeight, one per expert
    g = f.load_f32("blk.0.attn_norm.weight")      # float32 ndarray, any stored type
    print(f.conversion_summary())

Parsing is done by the ``gguf`` package's GGUFReader (memory-mapped), wrapped so that a
corrupt, truncated or hostile file raises ``ModelFormatError`` and never an IndexError /
KeyError / struct.error from inside the reader.  Block decoding is our own vectorized NumPy
(goinfer/gguf_decode.py; docs/design/gguf.md, "Conversions", has the formulas of every type).
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from goinfer import gguf_split
from goinfer.errors import GoinferError, ModelFormatError, UnsupportedTensorTypeError
from goinfer.gguf_decode import (
    F32_DECODERS,
    PLAIN_DTYPES,
    f16_at,
    nibbles32,
    q5_codes,
    q6k_parts,
    qk_parts,
    requant_q8,
)
from goinfer.quant import (
    GROUP,
    ROWS,
    QWeight,
    pack_float,
    pack_mxfp4,
    pack_q4,
    pack_q5,
    pack_q6k,
    pack_q8,
    pack_qk,
)

__all__ = ["GGUFFile", "ConversionSummary", "ConversionRow", "NATIVE_TARGET", "native_target"]

# GGUF type name -> (native kind load_weight produces, how)
#   "repack":     same values, bit-exact (only the memory layout changes)
#   "requantize": dequantized to float32, then quantized to q8_0 per group of 32
NATIVE_TARGET: dict[str, tuple[str, str]] = {
    "F32": ("f32", "repack"),
    "F16": ("f16", "repack"),
    "BF16": ("bf16", "repack"),
    "Q4_0": ("q4_0", "repack"),
    "Q4_1": ("q4_1", "repack"),
    "Q8_0": ("q8_0", "repack"),
    "MXFP4": ("mxfp4", "repack"),
    "Q5_0": ("q5_0", "repack"),
    "Q4_K": ("q4_k", "repack"),
    "Q5_1": ("q5_1", "repack"),
    "Q5_K": ("q5_k", "repack"),
    "Q6_K": ("q6_k", "repack"),
    "Q2_K": ("q8_0", "requantize"),
    "Q3_K": ("q8_0", "requantize"),
    "Q8_K": ("q8_0", "requantize"),
}

# Per kernel variant, where it differs from NATIVE_TARGET (the layout cache is keyed by the
# variant, so each variant's cache holds its own choice).  Every variant has microkernels for
# every native kind (AVX-512 and AMX included), so none differs today.
VARIANT_TARGET: dict[str, dict[str, tuple[str, str]]] = {}


def native_target(tname: str, variant: str | None = None) -> tuple[str, str]:
    """(native kind, how) a GGUF type loads as with a kernel variant (default: the one in use)."""
    if variant is None:
        try:
            from goinfer._kernels import _config
        except ImportError:  # kernels not built: the portable choice
            variant = "portable"
        else:
            variant = str(_config.variant())
    return VARIANT_TARGET.get(variant, {}).get(tname) or NATIVE_TARGET[tname]


# Types load_f32 can decode (everything above plus plain numeric storage types).
_F32_TYPES = set(NATIVE_TARGET) | {"F64", "I8", "I16", "I32", "I64"}

_CHUNK_ELEMS = 1 << 21  # elements decoded per step (row chunks; bounds temporary memory)
_MAX_DIMS = 4  # GGML_MAX_DIMS
_SUPPORTED_VERSIONS = (2, 3)

# Smallest encoding of each metadata value type, to reject absurd array lengths up front.
_SCALAR_NP = {
    GGUFValueType.UINT8: np.dtype("<u1"),
    GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"),
    GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"),
    GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"),
    GGUFValueType.BOOL: np.dtype("bool"),
    GGUFValueType.UINT64: np.dtype("<u8"),
    GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
}


# ============================================================================ safe, fast reader


def _load_string_array():
    """The compiled string-array reader (goinfer/_kernels/gguf_text.pyx), or None (a
    big-endian host, or kernels not built: the Python loop below does the same, slower)."""
    if sys.byteorder != "little":
        return None
    try:
        from goinfer._kernels.gguf_text import string_array
    except ImportError:
        return None
    return string_array


_string_array = _load_string_array()


class _Short(Exception):
    """A read ran past the end of the file (converted to ModelFormatError by GGUFFile)."""


class _Reader(GGUFReader):
    """GGUFReader with three changes, all inside its documented parse:

    * ``data`` is a plain ndarray view of the np.memmap (still memory-mapped): slicing a
      np.memmap costs microseconds of Python per call, which made a 262k-token vocabulary
      take ~20 s to parse;
    * every read checks it got all its bytes (the stock reader silently returns short arrays
      past EOF and can then loop for ~forever over an absurd array length);
    * metadata arrays are read in one piece: numeric arrays as one typed array, string
      arrays by a tight loop, each after checking the length fits in the rest of the file.
      Such a field has ``parts = [itype, length, decoded]`` and ``data = [index of decoded]``.
    """

    def __init__(self, path: str):
        self._plain: np.ndarray | None = None
        super().__init__(path, "r")

    @property
    def data(self) -> np.ndarray:  # type: ignore[override]
        return self._plain

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._mmap = value  # keep the memmap object alive
        self._plain = value.view(np.ndarray)
        self._mv = memoryview(self._plain)

    def _get(self, offset, dtype, count=1, override_order=None):
        count = int(count)
        need = count * np.dtype(dtype).itemsize
        if offset + need > self._plain.shape[0]:
            raise _Short(f"needs {need} bytes at offset {offset}, file has {self._plain.shape[0]}")
        return super()._get(offset, dtype, count, override_order)

    def _get_field_parts(self, orig_offs, raw_type):
        try:
            GGUFValueType(int(raw_type))
        except ValueError:
            raise ModelFormatError(
                f"metadata value at offset {orig_offs} has unknown type {int(raw_type)}"
            ) from None
        if int(raw_type) != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        size = self._plain.shape[0]
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        n = int(alen[0])
        offs = orig_offs + 12
        try:
            itype = GGUFValueType(int(raw_itype[0]))
        except ValueError:
            raise ModelFormatError(
                f"metadata array at offset {orig_offs} has unknown element type {int(raw_itype[0])}"
            ) from None
        if itype == GGUFValueType.ARRAY:
            raise ModelFormatError(f"nested metadata arrays (offset {orig_offs}) are not supported")
        elem_min = 8 if itype == GGUFValueType.STRING else _SCALAR_NP[itype].itemsize
        if n * elem_min > size - offs:
            raise ModelFormatError(
                f"metadata array at offset {orig_offs} claims {n} elements "
                f"of {itype.name}, more than the {size - offs} bytes left"
            )
        if itype == GGUFValueType.STRING and _string_array is not None:
            try:
                holder, offs = _string_array(self._plain, offs, n)
            except EOFError as e:
                raise _Short(str(e)) from None
            except UnicodeDecodeError:
                raise ModelFormatError(
                    f"a string of the array at offset {orig_offs} is not valid UTF-8"
                ) from None
        elif itype == GGUFValueType.STRING:
            holder = np.empty(n, dtype=object)
            mv = self._mv
            for i in range(n):
                if offs + 8 > size:
                    raise _Short(f"string array element {i} at offset {offs} past end of file")
                slen = int.from_bytes(mv[offs : offs + 8], "little")
                end = offs + 8 + slen
                if end > size:
                    raise _Short(f"string of {slen} bytes at offset {offs} past end of file")
                try:
                    holder[i] = str(mv[offs + 8 : end], "utf-8")
                except UnicodeDecodeError:
                    raise ModelFormatError(f"string at offset {offs} is not valid UTF-8") from None
                offs = end
        else:
            dt = _SCALAR_NP[itype]
            holder = self._plain[offs : offs + n * dt.itemsize].view(dt)
            offs += n * dt.itemsize
        return offs - orig_offs, [raw_itype, alen, holder], [2], [GGUFValueType.ARRAY, itype]

    def _build_tensors(self, start_offs, fields):
        size = self._plain.shape[0]
        for f in fields:
            _nl, name_data, n_dims, dims, raw_dtype, offset_tensor = f.parts
            name = bytes(name_data).decode("utf-8", "replace")
            tid = int(raw_dtype[0])
            try:
                gtype = GGMLQuantizationType(tid)
            except ValueError:
                raise UnsupportedTensorTypeError(
                    f"tensor {name!r} has unknown GGML type id {tid}"
                ) from None
            nd = int(n_dims[0])
            if not 1 <= nd <= _MAX_DIMS:
                raise ModelFormatError(
                    f"tensor {name!r} has {nd} dimensions (1..{_MAX_DIMS} allowed)"
                )
            ne = [int(x) for x in dims]
            if min(ne) < 1 or max(ne) > 1 << 40:
                raise ModelFormatError(f"tensor {name!r} has absurd dimensions {ne}")
            n_el = 1
            for x in ne:
                n_el *= x
            bs, ts = GGML_QUANT_SIZES[gtype]
            if ne[0] % bs:
                raise ModelFormatError(
                    f"tensor {name!r} ({gtype.name}) has rows of {ne[0]} "
                    f"elements, not a multiple of its block size {bs}"
                )
            n_bytes = n_el // bs * ts
            begin = start_offs + int(offset_tensor[0])
            if begin + n_bytes > size:
                raise ModelFormatError(
                    f"tensor {name!r} data [{begin}, {begin + n_bytes}) extends past the end "
                    f"of the file ({size} bytes)"
                )
        super()._build_tensors(start_offs, fields)


# ============================================================================ conversion summary


@dataclass
class ConversionRow:
    source_type: str  # GGUF type, e.g. "Q4_K"
    kind: str  # native kind, or "f32 (dense)" for load_f32
    how: str  # repack / requantize / dequantize
    count: int = 0
    bytes_in: int = 0  # bytes in the GGUF file
    bytes_out: int = 0  # bytes of the native arrays


@dataclass
class ConversionSummary:
    """What load_weight / load_f32 have done so far, one row per (type, kind, how)."""

    rows: list[ConversionRow] = field(default_factory=list)

    def add(self, source_type: str, kind: str, how: str, bytes_in: int, bytes_out: int) -> None:
        for r in self.rows:
            if (r.source_type, r.kind, r.how) == (source_type, kind, how):
                break
        else:
            r = ConversionRow(source_type, kind, how)
            self.rows.append(r)
        r.count += 1
        r.bytes_in += bytes_in
        r.bytes_out += bytes_out

    @property
    def converted(self) -> list[ConversionRow]:
        """Rows whose values changed (requantize); the other paths are lossless."""
        return [r for r in self.rows if r.how == "requantize"]

    def as_dicts(self) -> list[dict]:
        return [dict(vars(r)) for r in self.rows]

    @classmethod
    def from_dicts(cls, rows: list[dict]) -> ConversionSummary:
        return cls([ConversionRow(**r) for r in rows])

    def __str__(self) -> str:
        if not self.rows:
            return "no tensors loaded"
        lines = [
            f"{'type':<6} {'-> kind':<15} {'how':<11} {'tensors':>7} {'MB in':>9} {'MB out':>9}"
        ]
        for r in sorted(self.rows, key=lambda r: -r.bytes_in):
            lines.append(
                f"{r.source_type:<6} {'-> ' + r.kind:<15} {r.how:<11} {r.count:>7} "
                f"{r.bytes_in / 1e6:>9.2f} {r.bytes_out / 1e6:>9.2f}"
            )
        tot_in = sum(r.bytes_in for r in self.rows)
        tot_out = sum(r.bytes_out for r in self.rows)
        n = sum(r.count for r in self.rows)
        lines.append(f"{'total':<34} {n:>7} {tot_in / 1e6:>9.2f} {tot_out / 1e6:>9.2f}")
        return "\n".join(lines)


# ============================================================================ the file


def _wrap(path: Path, what: str, exc: BaseException) -> ModelFormatError:
    msg = str(exc) or type(exc).__name__
    return ModelFormatError(f"{path}: {what}: {msg}")


class _Part:
    """One file of a GGUF model (the whole model, or one part of a split one): checked,
    memory-mapped and parsed."""

    def __init__(self, path: Path):
        self.path = path
        self.size = os.path.getsize(path)  # FileNotFoundError / OSError as is
        self._check_preamble()
        try:
            self.reader = _Reader(str(path))
        except GoinferError as e:
            e.args = (f"{path}: {e.args[0] if e.args else ''}",)
            raise
        except _Short as e:
            raise _wrap(path, "truncated file", e) from None
        except UnicodeDecodeError as e:
            raise _wrap(path, "a metadata key or tensor name is not valid UTF-8", e) from None
        except (
            ValueError,
            KeyError,
            IndexError,
            TypeError,
            OverflowError,
            struct.error,
            MemoryError,
            OSError,
        ) as e:
            raise _wrap(path, "cannot parse GGUF header", e) from None
        r = self.reader
        if r.byte_order != "I":
            raise ModelFormatError(f"{path}: big-endian GGUF files are not supported")
        self.version = int(r.fields["GGUF.version"].parts[0][0])
        self.alignment = int(r.alignment)
        self.data_offset = int(r.data_offset)

    def _check_preamble(self) -> None:
        """Magic, version and counts, with plain messages, before the reader sees the file."""
        with open(self.path, "rb") as fh:
            head = fh.read(24)
        if len(head) < 4 or head[:4] != b"GGUF":
            raise ModelFormatError(
                f"{self.path}: not a GGUF file (magic {head[:4]!r}, expected b'GGUF')"
            )
        if len(head) < 24:
            raise ModelFormatError(
                f"{self.path}: truncated file ({self.size} bytes, the GGUF header alone needs 24)"
            )
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", head, 4)
        if version & 0xFFFF == 0 and version:
            raise ModelFormatError(f"{self.path}: big-endian GGUF files are not supported")
        if version not in _SUPPORTED_VERSIONS:
            raise ModelFormatError(
                f"{self.path}: unsupported GGUF version {version} "
                f"(goinfer reads versions {', '.join(map(str, _SUPPORTED_VERSIONS))})"
            )
        room = self.size - 24
        if n_kv > room // 13:  # smallest key/value: 8-byte length, 4-byte type, 1-byte value
            raise ModelFormatError(
                f"{self.path}: absurd metadata count {n_kv} for a {self.size}-byte file"
            )
        if n_tensors > room // 24:  # smallest tensor info: name length, n_dims, type, offset
            raise ModelFormatError(
                f"{self.path}: absurd tensor count {n_tensors} for a {self.size}-byte file"
            )

    def metadata(self) -> dict[str, object]:
        return {
            key: _decode_field(self.path, key, f)
            for key, f in self.reader.fields.items()
            if not key.startswith("GGUF.")
        }

    def digest_into(self, h) -> None:
        """The file size, the header (metadata + tensor infos, bytes [0, data_offset)) and 256
        slices of 4 KiB spread evenly over the tensor data."""
        h.update(self.size.to_bytes(8, "little"))
        data = self.reader.data
        h.update(data[: self.data_offset].tobytes())
        n_data = len(data) - self.data_offset
        if n_data > 0:
            # the samples are read, not touched through the mapping: a page fault there maps
            # the kernel's whole readahead window (~1 MB per sample, 256 MB in all)
            step = max(1, n_data // 256)
            with open(self.path, "rb") as fh:
                for off in range(self.data_offset, len(data), step):
                    h.update(os.pread(fh.fileno(), min(4096, len(data) - off), off))


def _decode_field(path: Path, key: str, f) -> object:
    t0 = f.types[0] if f.types else None
    if t0 == GGUFValueType.ARRAY:
        holder = f.parts[f.data[0]]
        if f.types[1] == GGUFValueType.STRING:
            return list(holder)
        return np.array(holder, dtype=holder.dtype.newbyteorder("="))
    if t0 == GGUFValueType.STRING:
        try:
            return bytes(f.parts[-1]).decode("utf-8")
        except UnicodeDecodeError:
            raise ModelFormatError(f"{path}: metadata {key!r} is not valid UTF-8") from None
    v = f.parts[-1][0]
    if t0 == GGUFValueType.BOOL:
        return bool(v)
    return v.item()


class GGUFFile:
    """A GGUF model, memory-mapped and parsed (tensor data is read on demand).

    ``path`` is the model's file, or the first part of a split model (``...-00001-of-0000N.gguf``,
    goinfer/gguf_split.py): then every part is opened, checked against the first, and the model
    reads as one file (``parts`` lists their paths; ``file_size`` is their total)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        first = _Part(self.path)
        self._parts: list[_Part] | None = [first]
        self.version = first.version
        self.alignment = first.alignment
        self.data_offset = first.data_offset
        self.metadata: dict[str, object] = first.metadata()
        count = gguf_split.split_count(self.path, self.metadata)  # a later part: names the first
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise ModelFormatError(f"{self.path}: no general.architecture string in the metadata")
        self.arch: str = arch
        if count > 1:
            n_tensors = self.metadata.get(gguf_split.KEY_TENSORS)
            for i, p in enumerate(gguf_split.part_paths(self.path, count)[1:], start=1):
                try:
                    part = _Part(p)
                except FileNotFoundError:
                    raise ModelFormatError(
                        f"{self.path}: part {i + 1} of {count} of this split model is missing: {p}"
                    ) from None
                gguf_split.check_part(p, part.metadata(), i, count, n_tensors)
                self._parts.append(part)
        self.parts: list[Path] = [p.path for p in self._parts]
        self.file_size = sum(p.size for p in self._parts)
        self._tensors = {}
        for part in self._parts:
            for t in part.reader.tensors:
                if t.name in self._tensors:
                    raise ModelFormatError(
                        f"{part.path}: tensor {t.name!r} is also in an earlier part of this model"
                    )
                self._tensors[t.name] = t
        if count > 1:
            gguf_split.check_tensor_count(self.path, self.metadata, len(self._tensors), count)
        # name -> (GGUF type name, NumPy-order shape); kept after close()
        self._infos = {
            n: (t.tensor_type.name, tuple(int(x) for x in reversed(t.shape.tolist())))
            for n, t in self._tensors.items()
        }
        self.tensor_names: list[str] = list(self._tensors)
        self._summary = ConversionSummary()
        self._fingerprint: str | None = None

    # ------------------------------------------------------------------ header

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def arch_get(self, suffix: str, default=None):
        return self.metadata.get(f"{self.arch}.{suffix}", default)

    @property
    def fingerprint(self) -> str:
        """sha256 (hex) of the file size, the header (metadata + tensor infos, bytes [0,
        data_offset)) and a sample of the tensor data: 256 slices of 4 KiB spread evenly over it
        (at most 1 MiB read), so two fine-tunes with the same shapes differ.  A split model
        hashes the part count and then the same of every part, so the key covers all parts.
        Identifies a model cheaply; a change confined to unsampled bytes is not seen."""
        if self._fingerprint is None:
            if self._parts is None:
                raise ValueError(f"{self.path}: GGUFFile is closed")
            if len(self._parts) == 1:
                h = hashlib.sha256(b"goinfer-gguf-fingerprint-v2\0")
            else:
                h = hashlib.sha256(b"goinfer-gguf-fingerprint-v2-split\0")
                h.update(len(self._parts).to_bytes(8, "little"))
            for part in self._parts:
                part.digest_into(h)
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    # ------------------------------------------------------------------ tensors

    def _tensor(self, name: str):
        self.tensor_info(name)  # unknown name -> ModelFormatError
        if self._parts is None:
            raise ValueError(f"{self.path}: GGUFFile is closed")
        return self._tensors[name]

    def has_tensor(self, name: str) -> bool:
        return name in self._infos

    def tensor_info(self, name: str) -> tuple[str, tuple[int, ...]]:
        """(GGUF type name, shape in NumPy order: (n_out, n_in) for a matrix)."""
        try:
            return self._infos[name]
        except KeyError:
            raise ModelFormatError(
                f"{self.path}: no tensor named {name!r} ({len(self._infos)} tensors in the file)"
            ) from None

    def _rows(self, name: str):
        """Raw bytes of a tensor as rows: (type name, NumPy shape, uint8 (n_rows, row_bytes))."""
        t = self._tensor(name)
        tname, shape = self.tensor_info(name)
        raw = np.asarray(t.data).reshape(-1).view(np.uint8)
        n_rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
        if raw.size != t.n_bytes or raw.size % n_rows:
            raise ModelFormatError(
                f"{self.path}: tensor {name!r} has {raw.size} bytes, "
                f"expected {t.n_bytes} for {tname} {shape}"
            )
        return tname, shape, raw.reshape(n_rows, raw.size // n_rows)

    def load_f32(self, name: str) -> np.ndarray:
        """Any supported stored type -> float32 array in NumPy shape (for norms, biases, small tensors)."""
        tname, shape, rows = self._rows(name)
        if tname not in _F32_TYPES:
            raise UnsupportedTensorTypeError(
                f"{self.path}: tensor {name!r} is stored as {tname}, which goinfer cannot decode"
            )
        out = self._decode_f32(tname, rows).reshape(shape)
        self._summary.add(tname, "f32 (dense)", "dequantize", rows.nbytes, out.nbytes)
        return out

    def _decode_f32(self, tname: str, rows: np.ndarray) -> np.ndarray:
        """uint8 (R, row_bytes) -> float32 (R, n)."""
        if tname in PLAIN_DTYPES:
            return rows.view(PLAIN_DTYPES[tname]).astype(np.float32)
        if tname == "BF16":
            return (rows.view("<u2").astype(np.uint32) << 16).view(np.float32)
        bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType[tname]]
        R = rows.shape[0]
        out = np.empty((R, rows.shape[1] // ts * bs), np.float32)
        step = max(1, _CHUNK_ELEMS // max(out.shape[1], 1))
        for r0 in range(0, R, step):
            b = rows[r0 : r0 + step].reshape(-1, rows.shape[1] // ts, ts)
            out[r0 : r0 + step] = F32_DECODERS[tname](b).reshape(b.shape[0], -1)
        return out

    def load_weight(self, name: str) -> QWeight:
        """A 2-D tensor (n_out, n_in) -> QWeight in the nearest native kind (see NATIVE_TARGET)."""
        tname, shape, rows = self._rows(name)
        if len(shape) != 2:
            raise ModelFormatError(
                f"{self.path}: load_weight needs a 2-D tensor, {name!r} has "
                f"shape {shape} (use load_f32 for vectors, load_experts for "
                "stacked expert tensors)"
            )
        return self._weight_from_rows(name, tname, rows, *shape)

    def load_experts(self, name: str) -> list[QWeight]:
        """A 3-D stacked expert tensor (n_expert, n_out, n_in) -> one QWeight per expert.

        Each expert's rows are a slice of the memory-mapped tensor, repacked on their own (no
        copy of the whole stack is made)."""
        tname, shape, rows = self._rows(name)
        if len(shape) != 3:
            raise ModelFormatError(
                f"{self.path}: load_experts needs a 3-D tensor (n_expert, "
                f"n_out, n_in), {name!r} has shape {shape}"
            )
        n_expert, n_out, n_in = shape
        return [
            self._weight_from_rows(
                f"{name}[{e}]", tname, rows[e * n_out : (e + 1) * n_out], n_out, n_in
            )
            for e in range(n_expert)
        ]

    def _weight_from_rows(
        self, name: str, tname: str, rows: np.ndarray, n_out: int, n_in: int
    ) -> QWeight:
        """Raw rows (n_out, row_bytes) of a matrix stored as tname -> QWeight."""
        if tname not in NATIVE_TARGET:
            raise UnsupportedTensorTypeError(
                f"{self.path}: tensor {name!r} is stored as {tname}, "
                "which goinfer can neither run nor convert"
            )
        kind, how = native_target(tname)
        if kind in ("f32", "f16", "bf16"):
            dt = {"f32": "<f4", "f16": "<f2", "bf16": "<u2"}[kind]
            w = pack_float(
                kind, rows.view(dt).astype(np.dtype(dt).newbyteorder("="), copy=False), tname
            )
        else:
            w = self._convert_blocks(tname, kind, rows, n_out, n_in)
        w.source_type = tname
        self._summary.add(tname, kind, how, rows.nbytes, w.nbytes)
        return w

    def _convert_blocks(self, tname, kind, rows, n_out, n_in) -> QWeight:
        """Quantized rows -> QWeight, processed in chunks of whole row blocks (16 rows)."""
        G = n_in // GROUP
        n_rb = (n_out + ROWS - 1) // ROWS
        bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType[tname]]
        nb = n_in // bs
        c_int = {"q4_0": 4, "q4_1": 4, "mxfp4": 4, "q6_k": 6, "q4_k": 4}.get(kind, 8)
        c_int = 5 if kind in ("q5_k", "q5_0", "q5_1") else c_int
        qs = np.empty((n_rb, G, c_int, ROWS, 4), np.int8 if kind == "q8_0" else np.uint8)
        if kind == "q6_k":
            d = np.empty((n_rb, G // 8, ROWS), np.float16)
            m = np.empty((n_rb, G, ROWS, 2), np.int8)
        elif kind in ("q4_k", "q5_k"):
            d = np.empty((n_rb, G // 8, 2, ROWS), np.float16)
            m = np.empty((n_rb, G // 8, 12, ROWS), np.uint8)
        else:
            d = np.empty((n_rb, G, ROWS), np.uint8 if kind == "mxfp4" else np.float16)
            m = np.empty((n_rb, G, ROWS), np.float16) if kind in ("q4_1", "q5_1") else None
        step = max(ROWS, _CHUNK_ELEMS // n_in // ROWS * ROWS)
        for r0 in range(0, n_out, step):
            b = rows[r0 : r0 + step].reshape(-1, nb, ts)  # (R, nb, ts)
            R = b.shape[0]
            part = self._convert_chunk(tname, kind, b, R, n_in)
            rb0 = r0 // ROWS
            rb1 = rb0 + part.qs.shape[0]
            qs[rb0:rb1] = part.qs
            d[rb0:rb1] = part.d
            if m is not None:
                m[rb0:rb1] = part.m
        return QWeight(kind, n_out, n_in, qs, d, m, tname)

    @staticmethod
    def _convert_chunk(tname, kind, b, R, K) -> QWeight:
        G = K // GROUP
        if kind == "q8_0" and native_target(tname)[1] == "requantize":
            q, d = requant_q8(F32_DECODERS[tname](b).reshape(R, K))
            return pack_q8(q, d)
        if tname == "Q8_0":  # d f16, 32 int8
            return pack_q8(b[..., 2:34].view(np.int8).reshape(R, K), f16_at(b, 0))
        if tname == "Q5_0":  # d, 4 bytes of fifth bits, 16 of nibbles: the same codes and d
            return pack_q5("q5_0", q5_codes(b, 2, 6).reshape(R, K), f16_at(b, 0))
        if tname == "Q5_1":  # d, m, then as Q5_0
            return pack_q5("q5_1", q5_codes(b, 4, 8).reshape(R, K), f16_at(b, 0), f16_at(b, 2))
        if tname == "Q6_K":  # the same codes, scales and d
            q, sc, d = q6k_parts(b)
            return pack_q6k(q.reshape(R, K), sc.reshape(R, K // 16), d)
        if tname == "Q4_0":
            return pack_q4("q4_0", nibbles32(b[..., 2:18]).reshape(R, K), f16_at(b, 0))
        if tname == "MXFP4":  # e8m0 byte, 16 bytes of codes: the same codes and exponents
            return pack_mxfp4(nibbles32(b[..., 1:17]).reshape(R, K), b[..., 0].reshape(R, G))
        if tname == "Q4_1":
            return pack_q4(
                "q4_1", nibbles32(b[..., 4:20]).reshape(R, K), f16_at(b, 0), f16_at(b, 2)
            )
        if tname in ("Q4_K", "Q5_K"):  # the same codes, packed scales and mins, d and dmin
            q, scm, d, dmin = qk_parts(b, 4 if tname == "Q4_K" else 5)
            return pack_qk(kind, q.reshape(R, K), scm, d, dmin)
        raise AssertionError(tname)

    def native_bytes(self) -> int:
        """Bytes of every tensor in the native kind goinfer loads it as (matrices and stacked
        experts: NATIVE_TARGET's kind, rows padded to row blocks of 16; vectors: float32), from
        the tensor infos alone, before anything is loaded.  What the model's weights occupy in
        memory, memory-mapped from the layout cache or not (goinfer/memory.py)."""
        total = 0
        for tname, shape in self._infos.values():
            n_el = int(np.prod(shape, dtype=np.int64))
            if len(shape) < 2 or tname not in NATIVE_TARGET:
                total += 4 * n_el
                continue
            n_in, n_out = shape[-1], shape[-2]
            n_mat = n_el // (n_in * n_out)
            kind = native_target(tname)[0]
            padded = -(-n_out // ROWS) * ROWS * n_in  # elements incl. padding rows
            per = {
                "f32": 4.0,
                "f16": 2.0,
                "bf16": 2.0,
                "q4_0": 18 / 32,
                "q4_1": 20 / 32,
                "q8_0": 34 / 32,
                "mxfp4": 17 / 32,
                "q6_k": 210 / 256,
                "q4_k": 144 / 256,
                "q5_k": 176 / 256,
                "q5_0": 22 / 32,
                "q5_1": 24 / 32,
            }[kind]
            total += int(n_mat * padded * per)
        return total

    def conversion_summary(self) -> ConversionSummary:
        """Which GGUF types became which kinds (counts, bytes) over the loads done so far."""
        return self._summary

    # ------------------------------------------------------------------ lifetime

    def release_pages(self) -> None:
        """Drop the file's pages this process has touched from its resident memory (they stay in
        the page cache; a later read faults them back in).  After a layout build, so that the
        build's peak is not the GGUF plus the layout."""
        import mmap

        for part in self._parts or ():
            mm = getattr(getattr(part.reader, "_mmap", None), "_mmap", None)
            if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
                try:
                    mm.madvise(mmap.MADV_DONTNEED)
                except (OSError, ValueError):
                    pass

    def close(self) -> None:
        """Drop the reader (the mapping goes when no loaded view references it).  Metadata
        stays readable; loading tensors afterwards raises ValueError."""
        if self._fingerprint is None and self._parts is not None:
            self.fingerprint  # noqa: B018 - keep it available after close
        self._parts = None
        self._tensors = {}

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        parts = f", {len(self.parts)} parts" if len(self.parts) > 1 else ""
        return (
            f"GGUFFile({str(self.path)!r}, arch={self.arch!r}, v{self.version}, "
            f"{len(self.tensor_names)} tensors{parts})"
        )


if __name__ == "__main__":  # python -m goinfer.gguf FILE: header and conversion summary
    import time

    g = GGUFFile(sys.argv[1])
    print(g)
    t0 = time.perf_counter()
    for n in g.tensor_names:
        if len(g.tensor_info(n)[1]) == 2 and g.tensor_info(n)[0] in NATIVE_TARGET:
            g.load_weight(n)
        elif len(g.tensor_info(n)[1]) == 3 and g.tensor_info(n)[0] in NATIVE_TARGET:
            g.load_experts(n)
        else:
            g.load_f32(n)
    print(g.conversion_summary())
    print(f"loaded in {time.perf_counter() - t0:.2f} s; fingerprint {g.fingerprint}")
