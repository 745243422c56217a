"""Compare transformers' GGUF tokenizer conversion with llama.cpp's ids (the goldens).

    PYTHONPATH=. python tests/tools/compare_transformers_gguf_tokenizer.py [MODEL_DIR]

MODEL_DIR holds smollm2/SmolLM2-135M-Instruct.Q4_1.gguf and gemma3/gemma-3-270m-q4_k_m.gguf
(default /tmp/models).  Prints, per model and parse mode, how many corpus documents transformers
tokenizes differently from llama.cpp, and the first differing pieces of a few of them.
Informational only: goinfer does not use transformers' conversion.
"""

from __future__ import annotations

import gzip
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")
DOC_SEPARATOR = "\n\u241e\u241e\u241e goinfer-doc \u241e\u241e\u241e\n"
FILES = {
    "smollm2": "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma3/gemma-3-270m-q4_k_m.gguf",
}


def main() -> int:
    from transformers import AutoTokenizer

    root = sys.argv[1] if len(sys.argv) > 1 else "/tmp/models"
    with open(os.path.join(DATA, "tokenizer_corpus.txt"), encoding="utf-8", newline="") as f:
        docs = f.read().split(DOC_SEPARATOR)
    with gzip.open(os.path.join(DATA, "tokenizer_goldens.json.gz"), "rt", encoding="utf-8") as f:
        goldens = json.load(f)["models"]
    for name, rel in FILES.items():
        path = os.path.join(root, rel)
        hf = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
        for key in ("parse_special_false", "parse_special_true"):
            split_special = key == "parse_special_true"
            bad = []
            for i, (doc, want) in enumerate(zip(docs, goldens[name][key])):
                got = hf.encode(
                    doc, add_special_tokens=False, split_special_tokens=not split_special
                )
                if got != want:
                    k = next(
                        (j for j, (a, b) in enumerate(zip(got, want)) if a != b),
                        min(len(got), len(want)),
                    )
                    lo, hi = max(0, k - 2), k + 3
                    mine, theirs = (
                        hf.convert_ids_to_tokens(got[lo:hi]),
                        hf.convert_ids_to_tokens(want[lo:hi]),
                    )
                    bad.append(f"  doc {i} {doc[:25]!r}: transformers {mine} llama.cpp {theirs}")
            print(f"{name} {key}: {len(bad)}/{len(docs)} documents differ")
            for line in bad[:6]:
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
