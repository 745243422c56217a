"""The regime every benchmark result carries, and where its JSON goes.

Each script's main(argv) returns a dict of its results with a "regime" entry made here, and
writes it as JSON to --json PATH when given:

    regime      date and time (UTC), the command (file arguments by name only), the machine
                (goinfer.bench.machine: CPU vendor, model name, family / model, cores, caches,
                ISA flags, clock, memory), goinfer's config (version, kernel variant, AMX, OpenMP,
                wait policy), threads, the load average at the start and at the end, and the peer
                where the script has one (llama-cpp-python's version; its build's system info
                when a llama.cpp process reported it; "not installed" otherwise)
    model       the GGUF file by name, its file type (quantization), architecture, size and the
                bytes held per tensor type
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path


def _command(argv: list[str] | None) -> str:
    """The command line with absolute file paths cut to their names (no machine's directories)."""
    args = sys.argv[1:] if argv is None else list(argv)
    script = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "?"
    keep = [Path(a).name if os.path.isabs(a) else a for a in args]
    return " ".join(["python", f"benchmarks/{script}" if script.endswith(".py") else script] + keep)


def peer(name: str = "llama.cpp") -> dict:
    """The peer as installed here (no import: the parent of the engine processes loads no
    engine).  Its build's system info is added by the llama.cpp process (system_info())."""
    if name != "llama.cpp":
        raise ValueError(f"unknown peer {name!r}")
    if importlib.util.find_spec("llama_cpp") is None:
        return {
            "name": "llama.cpp",
            "package": "llama-cpp-python",
            "installed": False,
            "version": None,
            "system_info": None,
        }
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {
        "name": "llama.cpp",
        "package": "llama-cpp-python",
        "installed": True,
        "version": version,
        "system_info": None,
    }


def system_info() -> str:
    """llama.cpp's own report of the features its build uses (called in a llama.cpp process)."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info()
    return (info.decode() if isinstance(info, bytes) else str(info)).strip()


def model(path: str | os.PathLike) -> dict:
    """The GGUF's name, file type, architecture, size and bytes per tensor type."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

    from goinfer.gguf import GGUFFile

    p = Path(path)
    with GGUFFile(str(p)) as g:
        ft = g.metadata.get("general.file_type")
        arch = g.metadata.get("general.architecture")
        per: dict[str, int] = {}
        for name in g.tensor_names:
            tname, shape = g.tensor_info(name)
            n = 1
            for d in shape:
                n *= int(d)
            bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType[tname]]
            per[tname] = per.get(tname, 0) + n * ts // bs
    try:
        quant = LlamaFileType(int(ft)).name.removeprefix("MOSTLY_") if ft is not None else None
    except ValueError:
        quant = str(ft)
    return {
        "file": p.name,
        "quantization": quant,
        "arch": arch,
        "size_bytes": p.stat().st_size,
        "tensor_bytes": dict(sorted(per.items(), key=lambda kv: -kv[1])),
    }


def header(
    threads: int | None = None, *, argv: list[str] | None = None, peer_name: str | None = None
) -> dict:
    """The regime at the start of a run (finish() adds the end)."""
    import goinfer
    from goinfer import bench

    now = datetime.now(timezone.utc)
    return {
        "date": now.date().isoformat(),
        "time_utc": now.strftime("%H:%M:%S"),
        "command": _command(argv),
        "machine": bench.machine(),
        "goinfer": goinfer.config(),
        "threads": threads,
        "load_avg_start": list(os.getloadavg()),
        "peer": peer(peer_name) if peer_name else None,
    }


def finish(res: dict, json_path: str | None) -> dict:
    """Stamp the end of the run (load average) and write res to json_path when given."""
    res["regime"]["load_avg_end"] = list(os.getloadavg())
    if json_path:
        Path(json_path).write_text(json.dumps(res, indent=1, default=_plain) + "\n")
    return res


def _plain(x):
    """numpy scalars and arrays as JSON numbers and lists."""
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"{type(x).__name__} is not JSON serializable")


def add_json_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--json",
        default=None,
        metavar="PATH",
        help="write the results (with their regime) to this JSON file",
    )
