"""Split a GGUF file the way llama.cpp's gguf-split does (--split-max-tensors N), written with the
``gguf`` package's GGUFWriter (its split mode writes the same layout):

* parts ``<stem>-00001-of-0000n.gguf`` .. ``<stem>-0000n-of-0000n.gguf``, each a GGUF v3 file;
* part 1: every key/value of the source in its order, then ``split.no`` (uint16, 0),
  ``split.count`` (uint16, n), ``split.tensors.count`` (int32, all tensors); the other parts:
  only those three keys (``split.no`` = the part's index from 0);
* the tensors in the source's order, N per part (the last part the rest), each part with its own
  data section: offsets from its start, every tensor padded to 32 bytes.

    python tests/ggufsplit.py SRC.gguf OUT.gguf 100     # writes OUT-00001-of-0000n.gguf ...
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter


def split_gguf(src: Path, out: Path, max_tensors: int) -> list[Path]:
    """Write the parts of src next to out (named after out's stem); returns their paths."""
    r = GGUFReader(str(src))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(out, arch, split_max_tensors=max_tensors)
    if "general.alignment" in r.fields:
        w.data_alignment = int(r.fields["general.alignment"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue  # the writer's own header fields; the architecture it wrote first
        vtype = f.types[0]
        sub = f.types[-1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vtype, sub)
    for t in r.tensors:
        # the reader's view: quantized types as uint8 (rows, row bytes), the writer turns that
        # byte shape back into the element shape; plain types as their own dtype
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    paths = w.format_shard_names(Path(out))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return paths


if __name__ == "__main__":
    for p in split_gguf(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])):
        print(p)
