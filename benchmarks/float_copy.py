"""Write a float32 copy of a GGUF (same metadata, every tensor F32), to measure what goinfer's
weight conversions and int8 activations cost in agreement (see benchmarks/agreement.py --also).

    python benchmarks/float_copy.py SRC.gguf DST.gguf --values original|native [--types Q4_K,...]

--values original: each tensor's values as stored in SRC (gguf.quants.dequantize of its blocks):
    goinfer then runs float matmuls on exactly the weights transformers runs.
--values native: the values goinfer runs for SRC after its conversions (Q4_K -> q4_1 with float16
    scales, Q6_K -> q8_0 requantized, ...; docs/design/gguf.md), dequantized: float matmuls on
    the converted weights, so the conversion's cost is seen without int8 activations.
    --types limits this to tensors of those GGUF types (the others keep their original values),
    to see one conversion at a time.
--smoke: both copies of the tiny shape (benchmarks/shapes.py), loaded back (the test suite).
"""

from __future__ import annotations

import argparse

import gguf
import numpy as np
import regime


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("src", nargs="?")
    ap.add_argument("dst", nargs="?")
    ap.add_argument("--values", choices=["original", "native"])
    ap.add_argument("--types", default="", help="with --values native: only these GGUF types")
    ap.add_argument(
        "--smoke", action="store_true", help="copy the tiny shape both ways (the test suite)"
    )
    regime.add_json_arg(ap)
    args = ap.parse_args(argv)
    if args.smoke:
        return regime.finish(
            {"benchmark": "float_copy", "regime": regime.header(1, argv=argv), "copies": smoke()},
            args.json,
        )
    if not (args.src and args.dst and args.values):
        ap.error("SRC, DST and --values are needed (or --smoke)")
    copy(args.src, args.dst, args.values, args.types)
    return regime.finish(
        {
            "benchmark": "float_copy",
            "regime": regime.header(None, argv=argv),
            "model": regime.model(args.src),
            "copy": regime.model(args.dst),
        },
        args.json,
    )


def smoke() -> list[dict]:
    """Both copies of the tiny shape, loaded back: every tensor F32, logits close to the file's."""
    import tempfile
    from pathlib import Path

    from shapes import smoke_model

    from goinfer.gguf import GGUFFile
    from goinfer.model import Model

    out = []
    with tempfile.TemporaryDirectory() as d:
        src = smoke_model(d)
        ids = [5, 6, 7, 8, 9]
        ref = Model(GGUFFile(src), threads=1, progress=False, layout_cache=False).logits(ids)
        for values in ("original", "native"):
            dst = Path(d) / f"f32-{values}.gguf"
            copy(str(src), str(dst), values, "")
            m = Model(GGUFFile(dst), threads=1, progress=False, layout_cache=False)
            lg = m.logits(ids)
            cos = float((lg * ref).sum() / np.linalg.norm(lg) / np.linalg.norm(ref))
            print(f"smoke: {values} float32 copy loads; logit cosine with the Q4_0 file {cos:.4f}")
            out.append(
                {
                    "values": values,
                    "tensor_types": sorted(regime.model(dst)["tensor_bytes"]),
                    "logit_cosine_with_source": cos,
                }
            )
    return out


def copy(src_path: str, dst_path: str, values: str, types_arg: str) -> None:
    from goinfer import _reference
    from goinfer.gguf import GGUFFile

    src = GGUFFile(src_path)
    reader = gguf.GGUFReader(src_path)
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst_path, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vtype, sub_type=sub)
    types = {x.strip().upper() for x in types_arg.split(",") if x.strip()}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))  # NumPy order
        convert = not types or t.tensor_type.name in types
        if values == "native" and len(shape) == 2 and convert:
            vals = _reference.dequantize(src.load_weight(t.name))
        else:
            vals = gguf.quants.dequantize(t.data, t.tensor_type)
        w.add_tensor(t.name, np.ascontiguousarray(vals, dtype=np.float32).reshape(shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
