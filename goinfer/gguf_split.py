"""Split GGUF files: one model stored as several parts, as llama.cpp's gguf-split writes them.

    parse_part_name("m-Q4_K_M-00001-of-00003.gguf")  # -> ("m-Q4_K_M", 1, 3)
    part_paths(Path("dir/m-00001-of-00003.gguf"), 3)  # -> the three paths, in order
    model_stem(path)                                   # "m-Q4_K_M" for any part, else the stem

The format: part i (1-based in the file name, ``<prefix>-<i:05d>-of-<n:05d>.gguf``) is a
complete GGUF file of its own.  The first part carries all of the model's metadata; every part
carries ``split.no`` (uint16, 0-based: i - 1), ``split.count`` (uint16, n) and
``split.tensors.count`` (int32, the number of tensors over all parts); each part holds a
contiguous run of the model's tensors, in the model's order, with its own tensor data section
(offsets relative to it, each tensor padded to the part's alignment, 32 by default).  A file
without ``split.count``, or with ``split.count`` 1, is a whole model.

GGUFFile (goinfer/gguf.py) opens the first part and with it all the others; the checks here
name the part that is missing or does not belong.
"""

from __future__ import annotations

import re
from pathlib import Path

from goinfer.errors import ModelFormatError

__all__ = [
    "KEY_NO",
    "KEY_COUNT",
    "KEY_TENSORS",
    "parse_part_name",
    "part_name",
    "part_paths",
    "model_stem",
    "split_count",
    "check_part",
    "check_tensor_count",
]

KEY_NO = "split.no"
KEY_COUNT = "split.count"
KEY_TENSORS = "split.tensors.count"

_PART_RE = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


# ============================================================================ names


def parse_part_name(name: str) -> tuple[str, int, int] | None:
    """(prefix, part number from 1, part count) of a split part's file name, else None."""
    m = _PART_RE.match(name)
    if m is None:
        return None
    no, count = int(m["no"]), int(m["count"])
    if not 1 <= no <= count:
        return None
    return m["prefix"], no, count


def part_name(prefix: str, no: int, count: int) -> str:
    """The file name of part ``no`` (from 1) of ``count``."""
    return f"{prefix}-{no:05d}-of-{count:05d}.gguf"


def model_stem(path: str | Path) -> str:
    """The model's name without the part suffix (``m-00002-of-00003.gguf`` -> ``m``), else the stem."""
    p = Path(path)
    parsed = parse_part_name(p.name)
    return parsed[0] if parsed else p.stem


def part_paths(first: Path, count: int) -> list[Path]:
    """The paths of all ``count`` parts of a split model, from the path of its first part."""
    parsed = parse_part_name(first.name)
    if parsed is None:
        raise ModelFormatError(
            f"{first}: the first part of a split model ({KEY_COUNT} = {count}) but its name does "
            f"not say where the other parts are (expected PREFIX-00001-of-{count:05d}.gguf)"
        )
    prefix, no, n_named = parsed
    if no != 1:
        raise ModelFormatError(
            f"{first}: named part {no} of {n_named}, but its {KEY_NO} says it is the first part"
        )
    if n_named != count:
        raise ModelFormatError(
            f"{first}: named as one of {n_named} parts, but its {KEY_COUNT} is {count}"
        )
    ext = first.name[-len(".gguf") :]  # the name's own case
    return [first.with_name(f"{prefix}-{i:05d}-of-{count:05d}{ext}") for i in range(1, count + 1)]


# ============================================================================ checks


def _int_key(path: Path, meta: dict, key: str) -> int | None:
    v = meta.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ModelFormatError(f"{path}: metadata {key} is {v!r}, not an integer")
    return v


def split_count(path: Path, meta: dict) -> int:
    """How many parts the model whose first file is ``path`` has (1: not split).  A later part
    given as the model is an error naming the first one."""
    count = _int_key(path, meta, KEY_COUNT)
    no = _int_key(path, meta, KEY_NO)
    if count is None or count <= 1:
        if no:
            raise ModelFormatError(f"{path}: {KEY_NO} is {no} but {KEY_COUNT} is {count}")
        return 1
    if no is None:
        raise ModelFormatError(f"{path}: {KEY_COUNT} is {count} but {KEY_NO} is missing")
    if no != 0:
        parsed = parse_part_name(path.name)
        first = path.with_name(part_name(parsed[0], 1, parsed[2])) if parsed else "its first part"
        raise ModelFormatError(
            f"{path} is part {no + 1} of a model split in {count} parts: "
            f"load the first part, {first}"
        )
    return count


def check_part(path: Path, meta: dict, index: int, count: int, n_tensors: int | None) -> None:
    """Part ``index`` (0-based) of ``count``: its split keys must say so, and agree with the
    first part's total tensor count."""
    no = _int_key(path, meta, KEY_NO)
    n = _int_key(path, meta, KEY_COUNT)
    if no is None or n is None:
        raise ModelFormatError(
            f"{path}: not a part of a split model (no {KEY_NO} / {KEY_COUNT}), "
            f"expected part {index + 1} of {count}"
        )
    if n != count:
        raise ModelFormatError(
            f"{path}: a part of a model split in {n} parts, expected {count} "
            "(a part of another model?)"
        )
    if no != index:
        raise ModelFormatError(
            f"{path}: says it is part {no + 1} of {count}, expected part {index + 1}"
        )
    t = _int_key(path, meta, KEY_TENSORS)
    if n_tensors is not None and t is not None and t != n_tensors:
        raise ModelFormatError(
            f"{path}: {KEY_TENSORS} is {t}, the first part says {n_tensors} "
            "(a part of another model?)"
        )


def check_tensor_count(first: Path, meta: dict, found: int, count: int) -> None:
    """All parts together must hold the tensors the first part announces."""
    want = _int_key(first, meta, KEY_TENSORS)
    if want is not None and want != found:
        raise ModelFormatError(
            f"{first}: the {count} parts hold {found} tensors, {KEY_TENSORS} says {want}"
        )
