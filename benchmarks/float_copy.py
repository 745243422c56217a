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
"""
from __future__ import annotations

import argparse

import gguf
import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--values", choices=["original", "native"], required=True)
    ap.add_argument("--types", default="", help="with --values native: only these GGUF types")
    args = ap.parse_args(argv)

    from goinfer import _reference
    from goinfer.gguf import GGUFFile

    src = GGUFFile(args.src)
    reader = gguf.GGUFReader(args.src)
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(args.dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vtype, sub_type=sub)
    types = {x.strip().upper() for x in args.types.split(",") if x.strip()}
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))  # NumPy order
        convert = not types or t.tensor_type.name in types
        if args.values == "native" and len(shape) == 2 and convert:
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
