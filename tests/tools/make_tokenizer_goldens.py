"""Write tests/data/tokenizer_goldens.json.gz: llama.cpp's token ids for the tokenizer corpus.

Run with a Python that has llama-cpp-python and gguf (not needed by CI, which only reads the
file this writes):

    /tmp/peers-venv/bin/python tests/tools/make_tokenizer_goldens.py \
        [--smollm2 PATH.gguf] [--gemma3 PATH.gguf]

For every document of tests/data/tokenizer_corpus.txt and both values of parse_special it stores
``llm.tokenize(doc.encode(), add_bos=False, special=parse_special)`` for SmolLM2 (byte-level BPE,
pre "smollm") and Gemma 3 (SentencePiece).  It also re-labels SmolLM2's vocabulary with other
byte-level pre-tokenizer names (llama-bpe, qwen2, gpt-2, tekken, default) in vocab-only GGUF
copies, so the word-splitting regexes of those families are checked against llama.cpp too.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")
CORPUS = os.path.join(DATA, "tokenizer_corpus.txt")
OUT = os.path.join(DATA, "tokenizer_goldens.json.gz")
DOC_SEPARATOR = "\n\u241e\u241e\u241e goinfer-doc \u241e\u241e\u241e\n"
PRE_VARIANTS = ["llama-bpe", "qwen2", "gpt-2", "tekken", "default"]


def load_docs() -> list[str]:
    with open(CORPUS, encoding="utf-8", newline="") as f:
        return f.read().split(DOC_SEPARATOR)


def vocab_only_copy(src: str, dst: str, pre: str) -> None:
    """A GGUF with src's metadata (tokenizer.ggml.pre replaced) and no tensors."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = pre if name == "tokenizer.ggml.pre" else field.contents()
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, vtype, sub_type=sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def tokenize_all(path: str, docs: list[str], modes=(False, True)) -> dict[str, list[list[int]]]:
    from llama_cpp import Llama

    llm = Llama(model_path=path, vocab_only=True, verbose=False)
    out = {}
    for special in modes:
        out[f"parse_special_{str(special).lower()}"] = [
            llm.tokenize(d.encode("utf-8"), add_bos=False, special=special) for d in docs
        ]
    return out


def main() -> int:
    import llama_cpp

    ap = argparse.ArgumentParser()
    ap.add_argument("--smollm2", default="/tmp/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--gemma3", default="/tmp/models/gemma3/gemma-3-270m-q4_k_m.gguf")
    args = ap.parse_args()

    docs = load_docs()
    with open(CORPUS, "rb") as f:
        corpus_sha = hashlib.sha256(f.read()).hexdigest()
    result = {
        "llama_cpp_python_version": llama_cpp.__version__,
        "corpus_sha256": corpus_sha,
        "n_docs": len(docs),
        "call": "Llama(path, vocab_only=True).tokenize(doc.encode(), add_bos=False, special=parse_special)",
        "models": {},
    }
    result["models"]["smollm2"] = {"file": os.path.basename(args.smollm2), **tokenize_all(args.smollm2, docs)}
    result["models"]["gemma3"] = {"file": os.path.basename(args.gemma3), **tokenize_all(args.gemma3, docs)}
    with tempfile.TemporaryDirectory() as tmp:
        for pre in PRE_VARIANTS:
            dst = os.path.join(tmp, f"smollm2-{pre}.gguf")
            vocab_only_copy(args.smollm2, dst, pre)
            result["models"][f"smollm2-pre-{pre}"] = {
                "file": os.path.basename(args.smollm2),
                "pre": pre,
                **tokenize_all(dst, docs, modes=(True,)),
            }
    with gzip.open(OUT, "wt", encoding="utf-8", compresslevel=9) as f:
        json.dump(result, f, separators=(",", ":"))
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes), llama-cpp-python {llama_cpp.__version__}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
